"""Waiting on processes in the tests: a condition with a deadline, and the benchmark runners alive now."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable


def wait_until(pred: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``pred`` every 50 ms; AssertionError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def is_runner(argv: list[bytes]) -> bool:
    """A benchmark run of the runner (not a probe, not a deploy snippet)."""
    return b"--model" in argv and b"--sample-io" in argv


def runner_pids(blobs: Path | None = None, pids: list[int] | None = None) -> list[int]:
    """pids (of ``pids``, else of every process) of benchmark runners, whose script lies in ``blobs`` if given."""
    out = []
    for pid in pids if pids is not None else [int(e) for e in os.listdir("/proc") if e.isdigit()]:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if is_runner(argv) and (blobs is None or any(a.startswith(str(blobs).encode()) for a in argv[1:3])):
            out.append(pid)
    return out
