"""Run a campaign: one call at a time (the campaign's lock), resumed from its store (measured jobs skipped, jobs
failed too often given up, a changed artifact refused), every board held before the first job, one worker thread
per device (:mod:`edgemask.profiling.campaign.worker`)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgemask.errors import ConfigError, EdgemaskError
from edgemask.profiling.campaign.boards import BoardHooks, BoardLock, Connect, take_boards
from edgemask.profiling.campaign.plan import CampaignPlan, plan_campaign
from edgemask.profiling.campaign.worker import Benchmark, DeviceWorker, FailedJob
from edgemask.profiling.records import CampaignConfig, Job, SkippedJob


@dataclass(frozen=True)
class CampaignResult:
    name: str
    store_path: Path
    planned: int
    already_done: int
    recorded: tuple[str, ...]  # job ids measured by this call
    failed: tuple[FailedJob, ...]  # failed, interrupted or given up: every job of the plan not measured yet
    skipped: tuple[SkippedJob, ...]
    aborted: Mapping[str, str] = field(default_factory=dict)  # device -> why it stopped early
    notes: tuple[str, ...] = ()  # what the campaign found or did on a board (stray runners, governor)

    @property
    def complete(self) -> bool:
        return not self.failed and not self.aborted and self.already_done + len(self.recorded) == self.planned


def _default_benchmark() -> Benchmark:
    from edgemask.devices.benchmark import run_benchmark  # devices is imported only when a real campaign runs

    return run_benchmark


def _default_connect() -> Connect:
    from edgemask.devices.connection import open_connection

    return open_connection


def _default_board() -> BoardHooks:
    from edgemask.devices.board import BOARD

    return BOARD


def _default_retry_on() -> tuple[type[BaseException], ...]:
    from edgemask.devices.errors import DeviceError

    return (DeviceError,)


def _default_fatal_on() -> tuple[type[BaseException], ...]:
    from edgemask.devices.board import SettingsRefused
    from edgemask.devices.errors import HostKeyError

    return (HostKeyError, SettingsRefused)


def run_campaign(config: CampaignConfig, workspace: str | Path, *, benchmark: Benchmark | None = None,
                 progress: bool = True, inventory: Mapping[str, Any] | None = None,
                 connect: Connect | None = None, retry_on: tuple[type[BaseException], ...] | None = None,
                 fatal_on: tuple[type[BaseException], ...] | None = None,
                 on_recorded: Callable[[Job], None] | None = None, board: BoardHooks | None = None,
                 lock_wait_s: float = 0.0, board_wait_s: float = 0.0,
                 on_wait: Callable[[str], None] | None = None) -> CampaignResult:
    """Run the jobs of ``config`` that its store does not hold as measured; one worker thread per device.

    ``benchmark`` defaults to ``devices.benchmark.run_benchmark``, ``connect`` to
    ``devices.connection.open_connection`` and ``inventory`` to ``devices.inventory.load_inventory``; tests
    inject their own. ``board`` defaults to ``devices.board.BOARD`` when the benchmark is the real one, else to
    hooks that do nothing. A ``DeviceError`` (``retry_on``) is retried ``config.retries`` times with jittered
    backoff over a fresh connection; a job that still fails is recorded as failed and the campaign goes on.
    A ``HostKeyError`` or ``SettingsRefused`` (``fatal_on``) is never retried: that device's worker records it
    and stops.
    Failed and interrupted jobs are run again by the next call, a job that failed in more than
    ``config.retries`` runs is given up (raise ``retries`` to try it again). One call at a time holds the
    campaign's lock (``results/<name>/campaign.lock``); a second waits ``lock_wait_s``, then raises a one-line
    EdgemaskError. ``on_recorded`` is called after a job's measurement is committed.

    One campaign holds a board at a time, by a lock on the board itself (``devices.board.hold``): every board is
    taken before the first job; one that another campaign holds is waited for up to ``board_wait_s`` seconds
    (``on_wait`` hears who holds it and how long is left), then the campaign leaves with a one-line
    ``BoardBusy`` naming the holder, having measured nothing.
    """
    from edgemask.fileio import exclusive_lock

    workspace = Path(workspace)
    with exclusive_lock(config.results_dir(workspace) / "campaign.lock", f"campaign {config.name!r}", lock_wait_s):
        return _run_locked(config, workspace, benchmark=benchmark, progress=progress, inventory=inventory,
                           connect=connect, retry_on=retry_on, fatal_on=fatal_on, on_recorded=on_recorded,
                           board=board, board_wait_s=board_wait_s, on_wait=on_wait)


def _check_digests(store: Any, plan: CampaignPlan, done: Collection[str], workspace: Path) -> None:
    """Refuse a resume whose artifact file changed since a setting was measured (issue 27, item 2).

    A setting (artifact × format × variant × device × threads) pools its repetitions into one row of the report,
    so they must all have measured the same bytes. The store keeps each repetition's model sha256; the manifest
    names the file's sha256 now. Where they differ the campaign stops here with one line, before anything is run
    or written. Refusing, not starting the setting over: the measurements already taken stay the record of the
    file they measured, and the user decides (restore the file, or measure the new one under a new campaign
    name). Rows from before digests were kept (NULL) cannot be compared and are left to the report, which never
    pools them with a known file."""
    # the settings this call would add repetitions to (a finished setting pools nothing new)
    planned = {(j.artifact, j.format, j.variant, j.device, j.threads) for j in plan.jobs if j.job_id not in done}
    for (artifact, fmt, variant, device, threads), digests in sorted(store.setting_digests().items()):
        info = plan.artifacts.get(artifact)
        entry = info.file_for(fmt, variant) if info is not None else None
        if entry is None or (artifact, fmt, variant, device, threads) not in planned:
            continue  # not in this plan: nothing of it will be measured now
        stale = {d: n for d, n in digests.items() if d != entry.sha256}
        if stale:
            old, n = max(stale.items(), key=lambda kv: kv[1])
            raise EdgemaskError(
                f"{store.path}: {artifact} {fmt}/{variant} on {device} with {threads} thread(s) was measured from "
                f"model file sha256 {old[:12]}… ({n} repetition(s)), but "
                f"{workspace / 'artifacts' / artifact / entry.file} is now {entry.sha256[:12]}… (exported again "
                "since?); a resume never pools two files into one setting: restore that artifact, or give the "
                "campaign a new name to measure the new file")


def _run_records(store: Any, plan: CampaignPlan, done: Collection[str], workspace: Path) -> dict:
    """The store's record of the runs whose artifacts it measures: each run's digests as found in the workspace
    (issue #44, ``profiling.provenance``), so what is derived from the store later can tell the run it came from
    from one re-trained under the same id. A run that changed since the record, with jobs of it still to
    measure, is refused in one line before anything is run."""
    from edgemask.profiling.provenance import campaign_records

    changing = {plan.artifacts[j.artifact].run_id for j in plan.jobs if j.job_id not in done}
    return campaign_records(store.runs(), [i.run_id for i in plan.artifacts.values()], workspace, changing,
                            store.path)


def _run_locked(config: CampaignConfig, workspace: Path, *, benchmark: Benchmark | None, progress: bool,
                inventory: Mapping[str, Any] | None, connect: Connect | None,
                retry_on: tuple[type[BaseException], ...] | None, fatal_on: tuple[type[BaseException], ...] | None,
                on_recorded: Callable[[Job], None] | None, board: BoardHooks | None, board_wait_s: float = 0.0,
                on_wait: Callable[[str], None] | None = None) -> CampaignResult:

    from edgemask.profiling.store import ResultsStore

    if board is None:
        board = _default_board() if benchmark is None else BoardHooks()
    benchmark = benchmark or _default_benchmark()
    connect = connect or _default_connect()
    retry_on = retry_on or _default_retry_on()
    fatal_on = fatal_on or _default_fatal_on()
    if inventory is None:
        from edgemask.devices.inventory import load_inventory

        inv_path = workspace / config.inventory if config.inventory else None
        inventory = load_inventory(inv_path, workspace)
    unknown = [d for d in config.devices if d not in inventory]
    if unknown:
        raise ConfigError(f"campaign {config.name!r}: unknown device {unknown[0]!r}; "
                          f"valid names: {', '.join(sorted(inventory))}")

    plan = plan_campaign(config, workspace, inventory)
    store_path = config.results_dir(workspace) / "results.sqlite"
    store = ResultsStore.open(store_path)
    try:
        store.save_campaign(config)
        done = store.done_job_ids()
        _check_digests(store, plan, done, workspace)  # before save_artifacts replaces the manifests it keeps
        store.save_runs(_run_records(store, plan, done, workspace))
        store.save_artifacts(plan.artifacts.values())
        store.save_skipped(plan.skipped)
        failed_runs = store.failed_runs()
        given_up = [FailedJob(j, f"failed in {failed_runs[j.job_id]} runs; not run again (retries = "
                                 f"{config.retries}): fix the cause and raise retries in the campaign file",
                              0, "given up")
                    for j in plan.jobs if j.job_id not in done and failed_runs.get(j.job_id, 0) > config.retries]
        gave_up = {f.job.job_id for f in given_up}
        todo = [j for j in plan.jobs if j.job_id not in done and j.job_id not in gave_up]
        already_done = sum(1 for j in plan.jobs if j.job_id in done)

        devices = sorted({j.device for j in todo})
        locks = take_boards(dataclasses.replace(config, devices=tuple(d for d in config.devices if d in devices)),
                            inventory, board, connect, retry_on, board_wait_s, on_wait)
        try:
            return _run_workers(config, workspace, plan, todo, given_up, already_done, store, store_path,
                                inventory=inventory, benchmark=benchmark, connect=connect, retry_on=retry_on,
                                fatal_on=fatal_on, on_recorded=on_recorded, board=board, locks=locks,
                                progress=progress)
        finally:
            for lock in locks.values():
                lock.release()
    finally:
        store.close()


def _run_workers(config: CampaignConfig, workspace: Path, plan: CampaignPlan, todo: list[Job],
                 given_up: list[FailedJob], already_done: int, store: Any, store_path: Path, *,
                 inventory: Mapping[str, Any], benchmark: Benchmark, connect: Connect,
                 retry_on: tuple[type[BaseException], ...], fatal_on: tuple[type[BaseException], ...],
                 on_recorded: Callable[[Job], None] | None, board: BoardHooks, locks: Mapping[str, BoardLock],
                 progress: bool) -> CampaignResult:
    from tqdm.auto import tqdm

    stop = threading.Event()
    workers: list[DeviceWorker] = []
    bars = []
    for pos, device in enumerate(config.devices):
        jobs = [j for j in todo if j.device == device]
        bar = tqdm(total=len(jobs), desc=device, position=pos, leave=True, disable=not progress,
                   unit="job", dynamic_ncols=True)
        bars.append(bar)
        workers.append(DeviceWorker(device, inventory[device], jobs, config=config, workspace=workspace,
                                    store=store, benchmark=benchmark, connect=connect, retry_on=retry_on,
                                    fatal_on=fatal_on, stop=stop, bar=bar, on_recorded=on_recorded,
                                    board=board, lock=locks.get(device)))
    with ThreadPoolExecutor(max_workers=max(1, len(workers)), thread_name_prefix="device") as pool:
        futures = [pool.submit(w.run) for w in workers]
        try:
            for fut in futures:
                fut.result()
        except BaseException:
            # A bug in one worker, or Ctrl-C: the others stop; a job cut short is stored as interrupted and
            # every board gets its settings back before this returns.
            stop.set()
            for w in workers:
                w.interrupt()
            raise
        finally:
            for bar in bars:
                bar.close()
    return CampaignResult(
        name=config.name, store_path=store_path, planned=len(plan.jobs), already_done=already_done,
        recorded=tuple(j for w in workers for j in w.recorded),
        failed=tuple(given_up) + tuple(f for w in workers for f in w.failed),
        skipped=plan.skipped,
        aborted={w.device: w.aborted for w in workers if w.aborted},
        notes=tuple(n for w in workers for n in w.notes),
    )
