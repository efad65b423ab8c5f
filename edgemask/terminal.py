"""A quiet terminal: the user reads edgemask's progress bars, what was written, the summaries and edgemask's own
warnings; everything else goes to a log file in the workspace, ``logs/<command>-<time>.log``.

"Everything else" arrives by three roads, and each is closed separately:

* C/C++ libraries write to file descriptors 2 and 1 directly (ExecuTorch's cpuinfo prints "Failed to open midr
  file" to stdout when it is imported or first run; XNNPACK, absl and ONNX Runtime's native logger write to
  stderr): fds 1 and 2 are ``os.dup2``-ed onto the log for the whole command, so no redirect is needed around
  each call, and subprocesses inherit them. C's stdio buffers are flushed before the fds come back.
* Python loggers (torchao's "Failed to load … _C_mxfp8", onnxscript, matplotlib): a root handler writes them to
  the log. Handlers a library binds to ``sys.stderr`` when it is imported (torch's ``W1123 … _pytree`` lines come
  from one) hold the original ``sys.stderr`` object, whose fd 2 is the log: :func:`quiet_terminal` imports the
  ``preload`` modules after the ``dup2`` and before ``sys.stderr`` becomes the terminal again.
* ``warnings.warn``: a warning raised from edgemask's own packages is shown as ``edgemask: warning: …`` (no GPU,
  a fallback, a collapse: things the user must know), on a line of its own above the progress bar
  (``tqdm.write``); any other goes to the log.

``sys.stdout`` and ``sys.stderr`` are then streams on duplicates of the terminal's fds 1 and 2: ``print`` (the
summary table), tqdm's bars and ``print(..., file=sys.stderr)`` reach the user. A library that prints to
``sys.stdout`` or ``sys.stderr`` from Python (litert-torch's rich progress; ExecuTorch's C++ log, which its
bindings redirect into ``sys.stderr``) is sent to the log by :func:`library_output` around its calls.

The log is collected in a temporary file and moved into the workspace at the end, and only when
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


def _terminal_stream(fd: int, like: io.TextIOBase) -> io.TextIOBase:
    """A line-buffered text stream on ``fd`` (a duplicate of the terminal's), encoded like ``like``."""
    return open(fd, "w", buffering=1, encoding=getattr(like, "encoding", None) or "utf-8",
                errors=getattr(like, "errors", None) or "backslashreplace", closefd=True)


def _is_fd(stream: io.TextIOBase, fd: int) -> bool:
    try:
        return stream.fileno() == fd
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
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    old = {"stdout": sys.stdout, "stderr": sys.stderr}
    # the terminal for edgemask's own lines; under an in-memory stream (a test's capture) they stay where the
    # caller looks
    own = {name: _terminal_stream(saved[fd], stream) if _is_fd(stream, fd) else stream
           for (name, stream), fd in zip(old.items(), (1, 2))}
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    old_showwarning = warnings.showwarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if is_ours(filename):  # on a line of its own: a progress bar on the terminal is cleared, then redrawn
            from tqdm import tqdm

            tqdm.write(f"edgemask: warning: {message}", file=own["stderr"])
        else:
            log.write(warnings.formatwarning(message, category, filename, lineno, line))

    for fd in (1, 2):
        os.dup2(log.fileno(), fd)
    try:
        root.addHandler(handler)
        warnings.showwarning = showwarning
        for name in preload:
            importlib.import_module(name)
        sys.stdout, sys.stderr = own["stdout"], own["stderr"]
        yield result
    finally:
        sys.stdout, sys.stderr = old["stdout"], old["stderr"]
        warnings.showwarning = old_showwarning
        root.removeHandler(handler)
        for stream in (*own.values(), *old.values()):
            with contextlib.suppress(Exception):
                stream.flush()
        _flush_c_stdio()  # what C buffered for fd 1 goes to the log, not to the terminal at exit
        log.flush()
        for name, fd in (("stdout", 1), ("stderr", 2)):
            os.dup2(saved[fd], fd)
            if own[name] is not old[name]:
                own[name].close()  # closes saved[fd]
            else:
                os.close(saved[fd])
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
def library_output() -> Iterator[None]:
    """Around calls into chatty libraries: what they print goes where :func:`quiet_terminal` sends third-party
    output (the log; under ``--verbose``, or outside a quiet terminal, the terminal's stderr), never to stdout,
    where edgemask's results go.

    ``sys.stdout`` and ``sys.stderr`` are the original ``sys.__stderr__`` (fd 2) in the block: litert-torch
    prints its progress to ``sys.stdout``, ExecuTorch's bindings send the C++ log ("[cpuinfo_utils.cpp:87]
    Failed to open midr file") to ``sys.stderr``. Fd 1 is ``dup2``-ed onto fd 2 too, for C code printing to
    stdout outside a quiet terminal; C's stdio buffers are flushed before fd 1 comes back."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.__stderr__), contextlib.redirect_stderr(sys.__stderr__):
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
