#!/bin/sh
# Install Cognitora on a Debian/Ubuntu host (any Linux with Python >= 3.11 and systemd), in one line:
#
#   curl -fsSL <raw URL of this file> | sh -s -- --repo <git URL of the repository>
#   sh deploy/install.sh                       # from a clone: installs that clone
#
# What it does (docs/deploy.md):
#   - a virtual environment of its own at /opt/cognitora/venv with the distribution and its extras installed;
#   - /usr/local/bin/cognitora, a link to that environment's command;
#   - the systemd units in /usr/local/lib/systemd/system (installed, NOT enabled, NOT started);
#   - /etc/cognitora/: a starter cognitora.yaml and the units' option files, never overwriting one that exists;
#     secrets.env (mode 0600) for os.environ/NAME values.
# Run again to upgrade: the environment is upgraded in place, the units are replaced, /etc/cognitora is kept.
#
# Options:
#   --root DIR      install under DIR as if it were /, every path written pointing inside DIR, so the tree runs
#                   where it is (tests, image builds); nothing outside DIR is touched. Default: /
#   --source SRC    what pip installs: a source tree, a wheel, or a requirement (cognitora-router==X).
#                   Default: the clone this script is in
#   --extras LIST   the distribution's extras, comma-separated (default: envoy,nvml; "" for none)
#   --python PY     the Python to build the environment with (default: python3; >= 3.11)
#   --repo URL      when the script is not in a clone (piped): the git repository to clone and install from
#   --ref REF       with --repo: the branch or tag (default: the repository's default branch)
#   --no-units      leave the systemd units out
set -eu

ROOT=/
SOURCE=
EXTRAS=envoy,nvml
PYTHON=${PYTHON:-python3}
REPO=
REF=
UNITS=yes

say() { printf 'cognitora install: %s\n' "$*"; }
die() { printf 'cognitora install: %s\n' "$*" >&2; exit 1; }
usage() {
    if [ -f "$0" ]; then sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; else echo "options: see deploy/install.sh"; fi
}

while [ $# -gt 0 ]; do
    case $1 in
        --root) ROOT=${2:?--root needs a directory}; shift 2 ;;
        --source) SOURCE=${2:?--source needs a path or requirement}; shift 2 ;;
        --extras) EXTRAS=${2?--extras needs a list}; shift 2 ;;
        --python) PYTHON=${2:?--python needs an interpreter}; shift 2 ;;
        --repo) REPO=${2:?--repo needs a git URL}; shift 2 ;;
        --ref) REF=${2:?--ref needs a branch or tag}; shift 2 ;;
        --no-units) UNITS=no; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "unknown option $1 (--help lists them)" ;;
    esac
done

# -- where the files come from: this clone, or a clone of --repo ----------------------------------------------------
HERE=$(cd "$(dirname "$0")" 2>/dev/null && pwd || true)
if [ -n "$HERE" ] && [ -f "$HERE/systemd/cognitora-collector.service" ] && [ -z "$REPO" ]; then
    CLONE=$(cd "$HERE/.." && pwd)
else
    [ -n "$REPO" ] || die "not run from a clone: pass --repo <git URL> (curl ... | sh -s -- --repo URL)"
    command -v git >/dev/null 2>&1 || die "git is needed to fetch $REPO: apt-get install -y git"
    WORK=$(mktemp -d)
    trap 'rm -rf "$WORK"' EXIT
    say "cloning $REPO${REF:+ at $REF}"
    git clone --quiet --depth 1 ${REF:+--branch "$REF"} "$REPO" "$WORK/src" || die "could not clone $REPO"
    CLONE=$WORK/src
fi
[ -n "$SOURCE" ] || SOURCE=$CLONE

# -- paths: the final ones, under --root ------------------------------------------------------------------------------
ROOT=$(mkdir -p "$ROOT" && cd "$ROOT" && pwd)
[ "$ROOT" = / ] && ROOT=
PREFIX=$ROOT/opt/cognitora
VENV=$PREFIX/venv
BINDIR=$ROOT/usr/local/bin
UNITDIR=$ROOT/usr/local/lib/systemd/system
CONFDIR=$ROOT/etc/cognitora

# -- Python -----------------------------------------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON: apt-get install -y python3 python3-venv (Python >= 3.11)"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$("$PYTHON" -V 2>&1) is too old: Cognitora needs Python >= 3.11 (Debian 12, Ubuntu 24.04; or --python PATH)"
if ! "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1; then
    if [ -z "$ROOT" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing python3-venv (Debian's Python has venv in a package of its own)"
        apt-get install -y -q python3-venv >/dev/null || die "apt-get install python3-venv failed"
    else
        die "$PYTHON cannot make a virtual environment: apt-get install -y python3-venv"
    fi
fi

# -- the environment --------------------------------------------------------------------------------------------------
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    mkdir -p "$PREFIX"
    "$PYTHON" -m venv "$VENV"
fi
SPEC=$SOURCE
[ -z "$EXTRAS" ] || SPEC="$SPEC[$EXTRAS]"
say "installing $SPEC"
PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip install --quiet --upgrade "$SPEC" ||
    die "pip could not install $SPEC (the lines above say why)"
"$VENV/bin/cognitora" --help >/dev/null || die "the installed cognitora does not run"

# /usr/local/bin/cognitora: a relative link, so the tree also works where --root put it.
mkdir -p "$BINDIR"
ln -sfn ../../../opt/cognitora/venv/bin/cognitora "$BINDIR/cognitora"
mkdir -p "$PREFIX/docs"
cp "$CLONE/docs/deploy.md" "$PREFIX/docs/deploy.md"

# -- configuration: never overwritten ----------------------------------------------------------------------------------
subst() { sed -e "s|@COGNITORA@|$VENV/bin/cognitora|g" -e "s|@CONFDIR@|$CONFDIR|g" -e "s|@PREFIX@|$PREFIX|g" "$1"; }
mkdir -p "$CONFDIR"
chmod 0755 "$CONFDIR"
for file in cognitora.yaml collector.env extproc-main.env; do
    if [ -e "$CONFDIR/$file" ]; then
        say "kept $CONFDIR/$file (it exists)"
    else
        subst "$CLONE/deploy/etc/$file" >"$CONFDIR/$file"
        chmod 0644 "$CONFDIR/$file"
        say "wrote $CONFDIR/$file"
    fi
done
if [ ! -e "$CONFDIR/secrets.env" ]; then
    (umask 077 && printf '%s\n' '# NAME=value lines for os.environ/NAME in cognitora.yaml; read by systemd as root.' \
        >"$CONFDIR/secrets.env")
fi

# -- systemd units: installed, not enabled, not started ---------------------------------------------------------------
if [ "$UNITS" = yes ]; then
    mkdir -p "$UNITDIR"
    for unit in "$CLONE"/deploy/systemd/*.service; do
        subst "$unit" >"$UNITDIR/$(basename "$unit")"
        chmod 0644 "$UNITDIR/$(basename "$unit")"
    done
    say "units in $UNITDIR (not enabled, not started)"
    if [ -z "$ROOT" ] && command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
        systemctl daemon-reload
    fi
fi

say "done: $BINDIR/cognitora -> $VENV/bin/cognitora"
cat <<EOF

Next:
  1. edit $CONFDIR/cognitora.yaml (your models and engines), then check this host:
       $BINDIR/cognitora doctor --config $CONFDIR/cognitora.yaml
  2. start what runs here:
       systemctl enable --now cognitora-collector.service          # once per fleet
       systemctl enable --now cognitora-extproc@main.service       # options: $CONFDIR/extproc-main.env
  3. follow the logs (JSON lines):  journalctl -u 'cognitora-*' -f
Upgrade: run this script again, then systemctl daemon-reload && systemctl restart 'cognitora-*'.
EOF
