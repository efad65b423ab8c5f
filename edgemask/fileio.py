"""Atomic file writes: write to a temporary name beside the target, then rename.

A reader never sees a half-written file under the real name, whatever stops the writer.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator


def _umask() -> int:
    """The process's umask (reading it means setting it; set straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it onto ``target`` only if the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    # mkstemp makes the file 0600; give it the mode a plain open() would (0666 less the umask), so a report or
    # Parquet file is readable by whoever can read the workspace.
    os.chmod(tmp_path, 0o666 & ~_umask())
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_bytes_atomic(target: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(target: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomic(target, text.encode("utf-8"))


def write_json_atomic(target: str | os.PathLike[str], obj: Any) -> None:
    write_text_atomic(target, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str], what: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the block: one writer at a time.

    A second process waits up to ``wait_s`` seconds, then raises a one-line EdgemaskError naming ``what`` (e.g.
    ``"the artifacts of run demo-fedmask"``) and the lock file. The kernel drops the lock when the holder's process
    dies, so a ``kill -9`` never leaves a stale lock behind; the file itself stays (removing it would race).
    """
    with file_lock(path, what, wait_s, shared=False):
        yield


@contextlib.contextmanager
def file_lock(path: str | os.PathLike[str], what: str, wait_s: float = 0.0, *, shared: bool = False,
              create: bool = True) -> Iterator[None]:
    """Hold an ``flock`` on ``path`` for the block: exclusive (one writer, no reader) or ``shared`` (any number of
    readers, no writer). A run id's lock ``runs/.<run-id>.lock`` is taken exclusive by ``edgemask train`` and
    shared by ``edgemask export``, so an export never reads a run while it is being replaced (issue #27).

    Waits up to ``wait_s`` seconds, then raises a one-line EdgemaskError naming ``what`` and the lock file.
    ``create=False`` (a reader): a lock file that does not exist, or cannot be created in a read-only directory,
    means no writer can hold it (a writer must create it first), so the block runs unlocked.
    """
    from edgemask.errors import EdgemaskError

    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if create or e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT):
            raise
        try:
            fd = os.open(path, os.O_RDONLY)  # flock works on a read-only descriptor
        except FileNotFoundError:
            yield  # no lock file and none can be made here: no writer can exist
            return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    raise EdgemaskError(
                        f"{what} is in use by another edgemask process (lock {path}); "
                        "wait for it to finish, then run again"
                    ) from None
                time.sleep(0.1)
        if not shared:  # the holder's pid, for whoever looks (readers share the file: they leave it alone)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


_PARTIAL, _OLD = ".partial", ".old"


def temporary_beside(target: str | os.PathLike[str]) -> Path:
    """A fresh directory beside ``target`` (its parent made if missing), named ``.<name>.<8 random>.partial``,
    unique per call: the pattern :func:`remove_stale_temporaries` removes when a writer was killed."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=_PARTIAL, dir=target.parent))


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike[str], is_ours: Callable[[Path], bool], what: str) -> Iterator[Path]:
    """Yield a fresh directory beside ``target`` to build in; if the block succeeds it replaces ``target``.

    The temporary name is unique per process (``.<name>.<random>.partial``), so two writers never share one. An
    existing ``target`` is replaced only if ``is_ours(target)`` says edgemask wrote it (``what`` names such a
    directory for the refusal, e.g. ``"an edgemask run directory"``); anything else (a symlink included) is refused,
    never removed. The old one is renamed aside, the new one renamed in, then the old one removed: a reader sees
    the old directory or the new one, and a failure in the block leaves ``target`` as it was and no temporary behind
    (a full disk is one EdgemaskError naming ``target``).
    """
    from edgemask.errors import EdgemaskError

    target = Path(target)

    def refuse_foreign() -> None:
        if target.is_symlink() or (target.exists() and not is_ours(target)):
            raise EdgemaskError(f"{target} exists and is not {what}; edgemask replaces only what it wrote: "
                                "move it away or choose another name")

    refuse_foreign()
    tmp = temporary_beside(target)
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a run or artifact is as readable as mkdir makes it
    try:
        try:
            yield tmp
        except Exception as e:
            full = disk_full(e)
            if full is None:
                raise
            kept = " (the one already there is kept)" if target.exists() else ""
            raise EdgemaskError(f"could not write {target}: the disk is full ({full}); nothing of it was written"
                                f"{kept}: free space or pass another --workspace, then run again") from e
        refuse_foreign()  # checked again: it may have appeared while the block ran
        old = None
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=_OLD, dir=target.parent))
            os.replace(target, old)  # onto an empty directory: allowed for a directory
        try:
            os.rename(tmp, target)
        except BaseException:
            if old is not None:
                os.rename(old, target)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def remove_stale_temporaries(target: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporaries :func:`atomic_dir` left beside ``target`` when its process was killed.

    Call it only while holding the lock of ``target``'s writers: then no live writer owns them. Only names of
    exactly :func:`atomic_dir`'s pattern for this ``target`` are removed (``.<name>.<8 random>.partial|.old``),
    so another target's temporaries (``a`` vs ``a.b``) are never touched. A writer killed between its two renames
    left the previous ``target`` as ``.old`` and none in place: that one is renamed back, not removed.
    Returns what was removed.
    """
    target = Path(target)
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.[a-z0-9_]{{8}}({re.escape(_PARTIAL)}|{re.escape(_OLD)})$")
    removed = []
    if target.parent.is_dir():
        for p in sorted(target.parent.iterdir()):
            if pattern.match(p.name) and p.is_dir() and not p.is_symlink():
                if p.name.endswith(_OLD) and not target.exists() and any(p.iterdir()):
                    os.rename(p, target)
                    continue
                shutil.rmtree(p, ignore_errors=True)
                removed.append(p)
    return removed


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def disk_full(exc: BaseException) -> str | None:
    """If ``exc`` or an exception it was raised from or while handling says the disk is full, that one line.

    Writers wrap the OS's error in their own (safetensors, pyarrow, SQLite's "database or disk is full"; a
    failed ROLLBACK after a failed COMMIT even replaces it), so the whole chain is searched."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _FULL_ERRNOS:
            return f"{e.strerror}: {e.filename}" if e.filename else str(e.strerror)
        text = " ".join(str(e).split())
        if any(s in text for s in ("No space left on device", "disk is full", "Disk quota exceeded", "StorageFull")):
            return text
        e = e.__cause__ or e.__context__
    return None
