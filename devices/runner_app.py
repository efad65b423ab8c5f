"""The runner shipped as one file: a zipapp of the package ``devices/remote/runner/``, built on the host.

A board runs ``python3 <workdir>/blobs/<sha256>.pyz ...``: Python (3.6 included) runs an archive's ``__main__.py``
with the archive first on ``sys.path`` (the standard library's zipapp format). The archive holds the package's
rooms as ``edgemask_runner/`` (they import each other relatively, so the name inside is free) and a root
``__main__.py`` that calls its command line.

Built deterministically, so the same sources always give the same bytes and the runner stays content-addressed
(``devices.deploy`` sends it under its sha256, verifies it on the board and renames it into place): members in
sorted order, each with zip's earliest timestamp (1980-01-01), fixed permissions and creator system, stored
uncompressed (a deflate stream may differ between zlib versions). Built in memory and written once per process
into a private temporary directory, never into the source tree.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

RUNNER_PACKAGE = Path(__file__).parent / "remote" / "runner"
ARCHIVE_PACKAGE = "edgemask_runner"  # the package's name inside the archive
ARCHIVE_MAIN = f"import sys\n\nfrom {ARCHIVE_PACKAGE}.cli import main\n\nsys.exit(main())\n"
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)
_UNIX = 3  # ZipInfo.create_system: the default depends on the building host's OS


def runner_sources(package: Path = RUNNER_PACKAGE) -> list[Path]:
    """The package's modules, in name order (caches and other files left out)."""
    return sorted(package.glob("*.py"), key=lambda p: p.name)


def build_runner(package: Path = RUNNER_PACKAGE) -> bytes:
    """The zipapp's bytes: the same sources always give the same bytes."""
    members = [("__main__.py", ARCHIVE_MAIN.encode())]
    members += [(f"{ARCHIVE_PACKAGE}/{p.name}", p.read_bytes()) for p in runner_sources(package)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in sorted(members):
            info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
            info.create_system = _UNIX
            info.external_attr = 0o644 << 16  # -rw-r--r--
            info.compress_type = zipfile.ZIP_STORED
            z.writestr(info, data)
    return buf.getvalue()


@functools.lru_cache(maxsize=None)
def runner_zipapp() -> tuple[Path, str]:
    """(path, sha256) of this process's runner zipapp, built on first use into a private temporary directory that
    is removed when the process exits."""
    data = build_runner()
    digest = hashlib.sha256(data).hexdigest()
    folder = Path(tempfile.mkdtemp(prefix="edgemask-runner-"))  # mode 0700, a name no other process has
    owner = os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(folder, ignore_errors=True))
    path = folder / f"runner-{digest[:16]}.pyz"
    tmp = folder / f".{path.name}.part"
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path, digest


def runner_path() -> Path:
    """The runner as the board gets it: one ``.pyz`` file (run it with ``python3 PATH ...``)."""
    return runner_zipapp()[0]
