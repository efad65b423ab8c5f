"""A quiet terminal: the user reads edgemask's progress bars, what was written, the summaries and edgemask's own
warnings; everything else goes to a log file in the workspace, ``logs/<command>-<time>.log``.

"Everything else" arrives by three roads, and each is closed separately:

* C/C++ libraries write to file descriptor 2 directly (cpuinfo's "Failed to open midr file", XNNPACK, ONNX
  Runtime's native logger): fd 2 is ``os.dup2``-ed onto the log for the whole command, so no Python-level
  redirect is needed around each call, and subprocesses inherit it.
* Python loggers (torchao's "Failed to load … _C_mxfp8", onnxscript, matplotlib): a root handler writes them to
  the log. Handlers a library binds to ``sys.stderr`` when it is imported (torch's ``W1123 … _pytree`` lines come
  from one) hold the original ``sys.stderr`` object, whose fd 2 is the log: :func:`quiet_terminal` imports the
  ``preload`` modules after the ``dup2`` and before ``sys.stderr`` becomes the terminal again.
* ``warnings.warn``: a warning raised from edgemask's own packages is shown as ``edgemask: warning: …`` (no GPU,
  a fallback: things the user must know); any other goes to the log.

``sys.stderr`` is then a stream on a duplicate of the terminal's fd 2: tqdm's bars and ``print(..., file=sys.stderr)``
reach the user. The log is collected in a temporary file and moved into the workspace at the end, and only when
something was written to it: a command that printed nothing foreign leaves no log and creates no directory.
``verbose=True`` changes nothing: every message goes where its library sends it.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Iterator, Sequence

# edgemask's own packages: a warning raised from a file under one of these is edgemask's to show
_OURS = tuple(str(Path(__file__).resolve().parent.parent / p) + os.sep
              for p in ("edgemask", "trainer", "export", "profiling", "devices"))


def is_ours(filename: str) -> bool:
    """Whether ``filename`` (a warning's origin) is in one of edgemask's packages."""
    return os.path.abspath(filename).startswith(_OURS)


class QuietLog:
    """Where the log ended up: ``path`` is None until :func:`quiet_terminal` has moved a non-empty log."""

    def __init__(self) -> None:
        self.path: Path | None = None


def _terminal_stream(fd: int) -> io.TextIOBase:
    """A line-buffered text stream on ``fd`` (the terminal), encoded like the original stderr."""
    return open(fd, "w", buffering=1, encoding=getattr(sys.__stderr__, "encoding", None) or "utf-8",
                errors="backslashreplace", closefd=True)


def _stderr_is_fd2() -> bool:
    try:
        return sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # replaced by an in-memory stream (pytest's capsys)
        return False


@contextlib.contextmanager
def quiet_terminal(log_dir: Path, command: str, verbose: bool = False,
                   preload: Sequence[str] = ()) -> Iterator[QuietLog]:
    """Within the block, third-party output goes to a log that ends up as ``log_dir/<command>-<time>.log``.

    ``preload``: modules that bind logging handlers to ``sys.stderr`` at import (``torch``), imported while
    ``sys.stderr`` still writes to the log. The yielded :class:`QuietLog` names the log after the block."""
    result = QuietLog()
    if verbose:
        yield result
        return
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    log = tempfile.NamedTemporaryFile("w+", prefix=f"edgemask-{command}-", suffix=".log", delete=False,
                                      encoding="utf-8", errors="backslashreplace", buffering=1)
    started = time.strftime("%Y%m%d-%H%M%S")
    saved_fd = os.dup(2)
    old_stderr, old_showwarning = sys.stderr, warnings.showwarning
    # under an in-memory sys.stderr (a test's capture) edgemask's own lines stay where the caller looks
    console = _terminal_stream(saved_fd) if _stderr_is_fd2() else old_stderr
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if is_ours(filename):
            console.write(f"edgemask: warning: {message}\n")
        else:
            log.write(warnings.formatwarning(message, category, filename, lineno, line))

    os.dup2(log.fileno(), 2)
    try:
        root.addHandler(handler)
        warnings.showwarning = showwarning
        for name in preload:
            importlib.import_module(name)
        sys.stderr = console
        yield result
    finally:
        sys.stderr = old_stderr
        warnings.showwarning = old_showwarning
        root.removeHandler(handler)
        with contextlib.suppress(Exception):
            old_stderr.flush()
        log.flush()
        os.dup2(saved_fd, 2)
        if console is not old_stderr:
            console.close()  # closes saved_fd
        else:
            os.close(saved_fd)
        log.close()
        result.path = _keep(Path(log.name), Path(log_dir), f"{command}-{started}")


def _keep(tmp: Path, log_dir: Path, stem: str) -> Path | None:
    """Move a non-empty temporary log to ``log_dir/<stem>.log`` (``-2``, ``-3``… if taken); drop an empty one."""
    try:
        if tmp.stat().st_size == 0:
            return None
        log_dir.mkdir(parents=True, exist_ok=True)
        dest, n = log_dir / f"{stem}.log", 1
        while dest.exists():
            n += 1
            dest = log_dir / f"{stem}-{n}.log"
        shutil.move(str(tmp), str(dest))
        return dest
    except OSError:
        return None  # the log is a convenience: never the reason a command fails
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Within the block, what libraries print to stdout goes to stderr: under :func:`quiet_terminal` the log,
    under ``--verbose`` the terminal's stderr. Stdout carries edgemask's results (the summary table); ExecuTorch's
    cpuinfo prints "Failed to open midr file" to fd 1 from C, litert-torch prints its progress to
    ``sys.stdout`` (rich). Both roads are taken: fd 1 is ``dup2``-ed onto fd 2 and ``sys.stdout`` is the original
    ``sys.__stderr__`` (fd 2). C's stdio buffers are flushed before fd 1 comes back, so a line buffered in the
    block is not written to the real stdout later."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.__stderr__):
            yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)  # fflush(NULL): every C output stream of the process
    except (OSError, AttributeError):  # no C library to ask (not glibc/musl): nothing buffered we could flush
        pass
