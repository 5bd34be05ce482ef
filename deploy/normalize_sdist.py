"""Rewrite an sdist (``.tar.gz``) so that the same files give the same bytes: deploy/release.sh's last build step.

setuptools writes the sdist's gzip header with the time of the build and its members with their files' times and
owners, so two builds of one commit differ though they hold the same files. Here every member gets
``SOURCE_DATE_EPOCH`` as its time, root as its owner, 0644 (0755 for directories and executables) as its mode, in
sorted order, and the gzip header that time and no file name. What the archive holds is not changed.

    python deploy/normalize_sdist.py dist/cognitora-router-1.0.0.tar.gz   # SOURCE_DATE_EPOCH must be set
"""

from __future__ import annotations

import gzip
import io
import os
import sys
import tarfile
from pathlib import Path


def normalize(path: Path, epoch: int) -> None:
    with tarfile.open(path, "r:gz") as source:
        members = sorted(source.getmembers(), key=lambda m: m.name)
        contents = {m.name: source.extractfile(m).read() if m.isfile() else None for m in members}  # type: ignore[union-attr]
    out = io.BytesIO()
    with (
        gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=epoch, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as target,
    ):
        for member in members:
            member.mtime = epoch
            member.uid = member.gid = 0
            member.uname = member.gname = ""
            member.pax_headers = {}
            executable = member.isdir() or bool(member.mode & 0o111)
            member.mode = 0o755 if executable else 0o644
            data = contents[member.name]
            target.addfile(member, io.BytesIO(data) if data is not None else None)
    path.write_bytes(out.getvalue())


def main(argv: list[str]) -> int:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if not epoch or not epoch.isdigit() or len(argv) != 1:
        print("usage: SOURCE_DATE_EPOCH=<unix time> python normalize_sdist.py <sdist.tar.gz>", file=sys.stderr)
        return 2
    normalize(Path(argv[0]), int(epoch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
