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

from edgemask.devices.connection import Connection
from edgemask.devices.errors import DeviceError
from edgemask.devices.inventory import DeviceSpec
from edgemask.devices.runner_app import runner_zipapp
from edgemask.fileio import sha256_file

# Run on the device as `python -c SNIPPET ARGS`; Python 3.6 compatible, stdlib only.
_HASH = r"""
import hashlib, json, os, sys
def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
"""

# args: PATH SHA [PATH SHA ...] -> {"states": ["present" | "absent" | "mismatch", ...]}
_STAT = _HASH + r"""
args = sys.argv[1:]
states = []
for path, want in zip(args[0::2], args[1::2]):
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.isfile(path):
        states.append("absent")
    else:
        states.append("present" if sha256(path) == want else "mismatch")
print(json.dumps({"states": states}))
"""

# args: TMP PATH SHA [...] -> each TMP verified then renamed onto PATH; a corrupt TMP is removed.
_COMMIT = _HASH + r"""
args = sys.argv[1:]
bad = []
for tmp, path, want in zip(args[0::3], args[1::3], args[2::3]):
    got = sha256(tmp)
    if got != want:
        os.remove(tmp)
        bad.append([path, got])
    else:
        os.replace(tmp, path)
print(json.dumps({"bad": bad}))
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


def deploy_many(conn: Connection, spec: DeviceSpec, files: list[Path], sha256s: list[str | None] | None = None
                ) -> list[str]:
    """Make every file present on the device in two or three commands; return their remote paths, in order."""
    files = [Path(f) for f in files]
    digests = [s or sha256_file(f) for f, s in zip(files, sha256s or [None] * len(files))]
    targets = [remote_path(spec, "blobs", blob_name(d, f)) for f, d in zip(files, digests)]
    stat_args = [a for t, d in zip(targets, digests) for a in (t, d)]
    states = _python(conn, spec, _STAT, *stat_args).get("states", [])
    if len(states) != len(files):
        raise DeviceError(f"{spec.name}: unexpected answer from the device while checking blobs: {states!r}")
    commit_args: list[str] = []
    for f, d, t, state in zip(files, digests, targets, states):
        if state == "present":
            continue
        tmp = remote_path(spec, "blobs", f".{d}.{secrets.token_hex(4)}.part")
        conn.put(f, tmp)
        commit_args += [tmp, t, d]
    if commit_args:
        bad = _python(conn, spec, _COMMIT, *commit_args).get("bad", [])
        if bad:
            path, got = bad[0]
            raise DeviceError(f"{spec.name}: {path} arrived corrupted (sha256 {got}); the job can be retried")
    return targets


def deploy(conn: Connection, spec: DeviceSpec, local_file: Path, sha256: str | None = None) -> str:
    """Make ``local_file`` present on the device; return its remote path (<workdir>/blobs/<sha256>.<ext>)."""
    return deploy_many(conn, spec, [local_file], [sha256])[0]


def deploy_runner(conn: Connection, spec: DeviceSpec) -> str:
    """The runner (one zipapp file, ``devices.runner_app``), deployed like any other file: a changed runner gets a
    new name, <workdir>/blobs/<sha256>.pyz."""
    path, sha256 = runner_zipapp()
    return deploy(conn, spec, path, sha256)
