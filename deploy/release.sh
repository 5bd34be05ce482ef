#!/bin/sh
# Build the release artifacts of the commit checked out, reproducibly, with what an operator needs to verify them:
#
#   sh deploy/release.sh [--out DIR] [--extras envoy,nvml] [--no-sbom]
#
# Into DIR (default dist/):
#   <name>-<version>-py3-none-any.whl, <name>-<version>.tar.gz   built from `git archive HEAD` (committed files only)
#                                         with SOURCE_DATE_EPOCH = the commit's time and the tools pinned in
#                                         deploy/release-requirements.txt: the same commit gives the same bytes
#   <name>-<version>.cdx.json             CycloneDX SBOM of what installing the wheel (with --extras, default the
#                                         ones deploy/install.sh installs) resolves to now, validated
#   SHA256SUMS                            `sha256sum -c SHA256SUMS` checks all of the above
#
# Needs: git, python3 >= 3.11 (PYTHON=...), and pip's access to PyPI (or its cache) for the pinned tools, which
# are kept in ~/.cache/cognitora-release (RELEASE_TOOLS_CACHE=DIR elsewhere) between runs.
set -eu

OUT=dist
EXTRAS=envoy,nvml
SBOM=yes
PYTHON=${PYTHON:-python3}

die() { printf 'release: %s\n' "$*" >&2; exit 1; }
say() { printf 'release: %s\n' "$*"; }

while [ $# -gt 0 ]; do
    case $1 in
        --out) OUT=${2:?--out needs a directory}; shift 2 ;;
        --extras) EXTRAS=${2?--extras needs a list}; shift 2 ;;
        --no-sbom) SBOM=no; shift ;;
        -h|--help) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (--help lists them)" ;;
    esac
done

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(git -C "$HERE" rev-parse --show-toplevel) || die "not in a git checkout"
COMMIT=$(git -C "$REPO" rev-parse HEAD)
SOURCE_DATE_EPOCH=$(git -C "$REPO" log -1 --format=%ct HEAD)
export SOURCE_DATE_EPOCH
if [ -n "$(git -C "$REPO" status --porcelain --untracked-files=no)" ]; then
    say "note: uncommitted changes are NOT in the release (it is built from commit $COMMIT)"
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
umask 022  # file modes in the archives come from the build tree: the same on every machine
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The pinned tools, in an environment of their own, kept between runs under a name that changes with the pins.
PINS=$(sha256sum "$HERE/release-requirements.txt" | cut -c1-12)
TOOLS_VENV=${RELEASE_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cognitora-release}/tools-$PINS
TOOLS=$TOOLS_VENV/bin
if [ ! -f "$TOOLS_VENV/.complete" ]; then
    rm -rf "$TOOLS_VENV"
    "$PYTHON" -m venv "$TOOLS_VENV"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$TOOLS/python" -m pip install --quiet -r "$HERE/release-requirements.txt" ||
        die "could not install deploy/release-requirements.txt"
    touch "$TOOLS_VENV/.complete"
fi

# The committed tree only, its files dated at the commit (git archive does that), then sdist and wheel from it.
mkdir "$WORK/src" "$WORK/dist"
git -C "$REPO" archive --format=tar "$COMMIT" | tar -x -C "$WORK/src"
say "building $COMMIT (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
"$TOOLS/python" -m build --no-isolation --outdir "$WORK/dist" "$WORK/src" >"$WORK/build.log" 2>&1 ||
    { cat "$WORK/build.log" >&2; die "the build failed"; }
SDIST=$(ls "$WORK"/dist/*.tar.gz)
WHEEL=$(ls "$WORK"/dist/*.whl)
"$TOOLS/python" "$HERE/normalize_sdist.py" "$SDIST"
cp "$SDIST" "$WHEEL" "$OUT/"
SDIST=$OUT/$(basename "$SDIST")
WHEEL=$OUT/$(basename "$WHEEL")
ARTIFACTS="$(basename "$WHEEL") $(basename "$SDIST")"

# The SBOM: install the wheel alone (no pip, no setuptools) into an empty environment and describe that.
if [ "$SBOM" = yes ]; then
    BOM=$OUT/$(basename "$SDIST" .tar.gz).cdx.json
    "$PYTHON" -m venv --without-pip "$WORK/sbom"
    SPEC=$WHEEL
    [ -z "$EXTRAS" ] || SPEC="$WHEEL[$EXTRAS]"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$TOOLS/python" -m pip --python "$WORK/sbom/bin/python" install --quiet "$SPEC" ||
        die "could not install $SPEC to describe it"
    "$TOOLS/cyclonedx-py" environment --pyproject "$WORK/src/pyproject.toml" --output-reproducible --validate \
        --of JSON -o "$BOM" "$WORK/sbom/bin/python" || die "cyclonedx-py failed"
    ARTIFACTS="$ARTIFACTS $(basename "$BOM")"
fi

# shellcheck disable=SC2086  # ARTIFACTS is a list of plain file names
(cd "$OUT" && sha256sum $ARTIFACTS >SHA256SUMS)
say "artifacts in $OUT:"
sed 's/^/  /' "$OUT/SHA256SUMS"
