"""Another process holding an edgemask lock, for the tests of the one-writer rule."""

from __future__ import annotations

import multiprocessing as mp

from edgemask.fileio import exclusive_lock


def _hold(path, what, ready, release) -> None:
    with exclusive_lock(path, what):
        ready.set()
        release.wait(60)


def hold_lock(path, what: str = "the thing"):
    """Start a process that holds ``path``'s lock (named ``what``) until the returned event is set; returns
    (process, release event) once it holds the lock."""
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(str(path), what, ready, release))
    p.start()
    assert ready.wait(30), "the holder process never took the lock"
    return p, release
