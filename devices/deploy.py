"""Content-addressed deploy: a file lives on the device as <workdir>/blobs/<sha256>.<ext>.

If that name already holds the right bytes (hashed on the device, by the device's Python), nothing is sent.
Otherwise the file goes to a temporary name, its sha256 is checked on the device, and only then is it renamed
(os.replace, atomic) onto the real name: a transfer cut midway never leaves a file under the real name.
"""

from __future__ import annotations

import json
import posixpath
import secrets
from pathlib import Path

from devices.connection import Connection
from devices.errors import DeviceError
from devices.inventory import DeviceSpec
from edgemask.fileio import sha256_file

RUNNER_PATH = Path(__file__).parent / "remote" / "runner.py"

# Run on the device as `python -c SNIPPET ARGS`; Python 3.6 compatible, stdlib only.
_STAT = r"""
import hashlib, json, os, sys
path, want = sys.argv[1], sys.argv[2]
os.makedirs(os.path.dirname(path), exist_ok=True)
state = "absent"
if os.path.isfile(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    state = "present" if h.hexdigest() == want else "mismatch"
print(json.dumps({"state": state}))
"""

_COMMIT = r"""
import hashlib, json, os, sys
tmp, path, want = sys.argv[1], sys.argv[2], sys.argv[3]
h = hashlib.sha256()
with open(tmp, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
got = h.hexdigest()
if got != want:
    os.remove(tmp)
    print(json.dumps({"state": "mismatch", "got": got}))
    sys.exit(3)
os.replace(tmp, path)
print(json.dumps({"state": "committed"}))
"""


def remote_path(spec: DeviceSpec, *parts: str) -> str:
    """A POSIX path inside the device's workdir; refuses absolute parts and '..'."""
    for part in parts:
        if part.startswith("/") or ".." in part.split("/") or "\x00" in part:
            raise DeviceError(f"{spec.name}: remote path part {part!r} would leave the workdir {spec.workdir}")
    return posixpath.join(spec.workdir, *parts)


def blob_name(sha256: str, local_file: Path) -> str:
    ext = "".join(Path(local_file).suffixes[-1:]) or ".bin"
    return f"{sha256}{ext}"


def _python(conn: Connection, spec: DeviceSpec, snippet: str, *args: str, timeout: float = 120.0) -> dict:
    res = conn.run([spec.python, "-c", snippet, *args], timeout=timeout)
    try:
        return {"rc": res.rc, **json.loads(res.stdout.strip().splitlines()[-1])}
    except (ValueError, IndexError):
        raise DeviceError(f"{spec.name}: {spec.python} on the device did not answer (rc={res.rc}: {res.tail()}); "
                          f"check the device's `python` ({spec.python!r}) and that workdir {spec.workdir!r} "
                          "is writable") from None


def deploy(conn: Connection, spec: DeviceSpec, local_file: Path, sha256: str | None = None) -> str:
    """Make ``local_file`` present on the device; return its remote path (<workdir>/blobs/<sha256>.<ext>)."""
    local_file = Path(local_file)
    digest = sha256 or sha256_file(local_file)
    target = remote_path(spec, "blobs", blob_name(digest, local_file))
    if _python(conn, spec, _STAT, target, digest)["state"] == "present":
        return target
    tmp = remote_path(spec, "blobs", f".{digest}.{secrets.token_hex(4)}.part")
    conn.put(local_file, tmp)
    answer = _python(conn, spec, _COMMIT, tmp, target, digest)
    if answer.get("state") != "committed":
        raise DeviceError(f"{spec.name}: {local_file.name} arrived corrupted (sha256 {answer.get('got')} instead "
                          f"of {digest}); the job can be retried")
    return target


def deploy_runner(conn: Connection, spec: DeviceSpec) -> str:
    """The runner script, deployed like any other file (a changed runner gets a new name)."""
    return deploy(conn, spec, RUNNER_PATH)
