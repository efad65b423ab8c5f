"""Export several clients at once: one worker process per job, each exporting whole clients.

The pool changes nothing of what one client's export does (:func:`edgemask.export.pipeline.export_client`): each client
is still compacted, verified against its masked model, written under a temporary name unique to its process and
renamed into place, so ``--jobs 4`` writes the same artifacts (the same model-file and ``sample_io.npz`` digests)
as ``--jobs 1``. The caller (:func:`edgemask.export.pipeline.export_run`) holds the run's export lock for the whole pool
and decides which clients are unchanged before any worker starts; workers never take the lock themselves.

Workers are started with ``spawn``, not ``fork``: a forked child inherits torch's OpenMP pool from a parent that
may already have used it (a known hang), and a spawned one starts clean. Each worker loads the run directory once
and uses ``cpu_count // jobs`` torch threads (at least 1), so N workers do not each spin up a pool of every core.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Callable, Sequence

from edgemask.errors import EdgemaskError

_RUN = None  # the run this worker process loaded (set by _init)


def default_jobs() -> int:
    """``edgemask export --jobs``' default: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _init(run_dir: str, threads: int) -> None:
    global _RUN
    import torch

    from edgemask.trainer.run_dir import load_run

    torch.set_num_threads(threads)
    _RUN = load_run(Path(run_dir))


def _one(export_client: Callable, cid: str | None, dest: str, formats: Sequence[str], settings, limit: float,
         etrecord: bool) -> tuple[str, list[str]]:
    """One client in a worker: its directory and the notes it gave (a warning here would reach the worker's
    stderr, not the user: the parent gives them)."""
    notes: list[str] = []
    return str(export_client(_RUN, cid, Path(dest), formats, settings, limit, etrecord, notes.append)), notes


def export_pending(export_client: Callable, run, todo: Sequence[tuple[str | None, Path]], formats: Sequence[str],
                   settings, limit: float, etrecord: bool, jobs: int, done: Callable[[], None],
                   note: Callable[[str], None]) -> None:
    """Export each ``(client id or None for the dense baseline, destination)`` in ``todo``; ``jobs`` at a time,
    each with ``export_client`` (:func:`edgemask.export.pipeline.export_client`, passed in: a module-level function, so
    a worker process imports it by name, and this module imports nothing of the pipeline).

    ``jobs <= 1`` (or one client to do) runs them here, one after another, on ``run`` as loaded; otherwise in a
    pool of ``min(jobs, len(todo))`` spawned processes. ``done`` is called once per finished client (progress);
    ``note`` with each line a client's export gives about what it left out, in this process (a worker's warning
    would reach its own stderr, not the user), as that client finishes.
    The first failure stops the pool (clients not started are not started; those running finish or fail on their
    own temporaries, which :func:`edgemask.fileio.atomic_dir` removes) and is raised here."""
    if jobs < 1:
        raise EdgemaskError(f"--jobs is {jobs}; give 1 or more parallel export processes")
    if jobs == 1 or len(todo) <= 1:
        for cid, dest in todo:
            export_client(run, cid, dest, formats, settings, limit, etrecord, note)
            done()
        return
    workers = min(jobs, len(todo))
    threads = max(1, default_jobs() // workers)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init,
                             initargs=(str(run.path), threads)) as pool:
        pending = {pool.submit(_one, export_client, cid, str(dest), tuple(formats), settings, limit, etrecord)
                   for cid, dest in todo}
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_EXCEPTION)
                for fut in finished:
                    _, notes = fut.result()  # raises the worker's error (an EdgemaskError stays one: one line)
                    for line in notes:
                        note(line)
                    done()
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise
