"""One device's jobs, one after another over one (re)opened connection: the board held and set up before the
first, each job retried on link faults with jittered backoff and re-measured when unstable, every outcome stored
before the next job starts, the board's settings restored after the last."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgemask.devices.errors import BoardBusy
from edgemask.devices.records import Measurement
from edgemask.errors import EdgemaskError
from edgemask.manifest import load_manifest
from edgemask.profiling.campaign.boards import BoardHooks, BoardLock, Connect
from edgemask.profiling.records import CampaignConfig, Job
from edgemask.profiling.stats import cv
from edgemask.profiling.store import DigestChanged
from edgemask.profiling.verdict import CV_THRESHOLD

Benchmark = Callable[..., Measurement]


@dataclass(frozen=True)
class FailedJob:
    job: Job
    reason: str
    attempts: int
    status: str = "failed"  # failed | interrupted | given up (failed in more runs than `retries` allows)


def backoff_delay(attempt: int, base_s: float, cap_s: float = 60.0, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter in [0.5, 1.5) × base·2^attempt, capped (attempt counts from 0)."""
    rng = rng or random
    return min(cap_s, base_s * (2 ** attempt)) * (0.5 + rng.random())


class DeviceWorker:
    """Runs one device's jobs one after another over one (re)opened connection.

    Before the first job it kills stray runners and applies the board's settings; after the last (or when
    stopped) it restores them. A job whose run is cut by ``interrupt()`` (Ctrl-C) is stored as interrupted."""

    def __init__(self, device: str, spec: Any, jobs: list[Job], *, config: CampaignConfig, workspace: Path,
                 store: Any, benchmark: Benchmark, connect: Connect, retry_on: tuple[type[BaseException], ...],
                 fatal_on: tuple[type[BaseException], ...], stop: threading.Event, bar: Any,
                 on_recorded: Callable[[Job], None] | None, board: BoardHooks,
                 lock: "BoardLock | None" = None) -> None:
        self.device, self.spec, self.jobs = device, spec, jobs
        self.config, self.workspace, self.store = config, workspace, store
        self.benchmark, self.connect, self.retry_on, self.fatal_on = benchmark, connect, retry_on, fatal_on
        self.stop, self.bar, self.on_recorded, self.board = stop, bar, on_recorded, board
        self.recorded: list[str] = []
        self.failed: list[FailedJob] = []
        self.notes: list[str] = []
        self.aborted: str | None = None  # why this device stopped before its last job
        self._stack: contextlib.ExitStack | None = None
        self._conn: Any = None
        self._cancel = threading.Event()  # set by interrupt(): the connection kills the command it runs
        self._ready = False  # strays reaped and settings applied (before the first job's first attempt)
        self._applied: Mapping[str, Any] | None = None  # what to restore at the end
        self.lock = lock  # the board held for this campaign (None: boards are not locked, e.g. fake hooks)

    def _connection(self) -> Any:
        if self._stack is None:
            stack = contextlib.ExitStack()
            self._conn = stack.enter_context(self.connect(self.spec))
            self._stack = stack
            if hasattr(self._conn, "cancel_event"):
                self._conn.cancel_event = self._cancel
        return self._conn

    def _drop_connection(self) -> None:
        stack, self._stack, self._conn = self._stack, None, None
        if stack is not None:
            try:
                stack.close()
            except self.retry_on:
                pass  # the link is already broken; a fresh one is opened on the next attempt

    def interrupt(self) -> None:
        """Called from another thread (Ctrl-C): cut the command running on the board now."""
        self._cancel.set()

    def _note(self, kind: str, detail: Mapping[str, Any], text: str) -> None:
        self.store.record_event(self.device, kind, detail)
        self.notes.append(f"{self.device}: {text}")

    def _hold_board(self) -> None:
        """Before timing: the board is this campaign's (taken again if its hold ended with a dropped link).
        Raises BoardBusy when another campaign has it (then this device stops; no job is charged with it)."""
        if self.lock is None:
            return
        lost = self.lock.hold is not None and not self.lock.hold.alive()
        if self.lock.take(self.board):
            self._ready = self._ready and not lost  # a board left alone a while: strays and settings again
            if lost:
                self._note("board_lock", {"retaken": True}, "took the board again after its lock's link dropped")

    def _reap_strays(self) -> None:
        hold = self.lock.hold if self.lock is not None else None
        found = self.board.reap_strays(self._connection(), self.spec, hold=hold)
        if found:
            pids = ", ".join(str(p["pid"]) for p in found)
            self._note("stray_runners", {"found": found},
                       f"killed {len(found)} stray runner(s) left on the board (pid {pids}) before timing")

    def _previous_settings(self) -> Mapping[str, Any] | None:
        """The settings found before an earlier run applied its own and was killed before restoring them."""
        last = [e for e in self.store.events(self.device) if e["kind"] in ("settings_applied", "settings_restored")]
        if last and last[-1]["kind"] == "settings_applied":
            return last[-1]["detail"]
        return None

    def _prepare(self) -> None:
        """Before the first job: no stray runner, the inventory's settings applied (and recorded)."""
        self._reap_strays()
        earlier = self._previous_settings()
        applied = self.board.apply(self._connection(), self.spec)
        if applied is not None:
            if earlier is not None:  # restore what the board had before the killed run, not its leftovers
                applied = {**applied, "before": earlier["before"]}
            self._applied = applied
            self._note("settings_applied", applied, f"set {_describe(applied['actual'])} for the campaign")
        self._ready = True

    def run(self) -> None:
        try:
            for i, job in enumerate(self.jobs):
                if self.stop.is_set() or self.aborted:
                    return
                if i and self.config.cooldown_s and self.stop.wait(self.config.cooldown_s):
                    return
                self._run_job(job)
                self.bar.update(1)
        finally:
            try:
                if self._applied is not None:
                    self._restore(self._applied)
            finally:
                self._drop_connection()

    def _restore(self, applied: Mapping[str, Any]) -> None:
        self._cancel.clear()  # the restore must run even after Ctrl-C
        try:
            restored = self.board.restore(self._connection(), self.spec, applied)
        except self.retry_on as exc:
            self.notes.append(f"{self.device}: could not restore {_describe(applied['before'])}: {exc}; "
                              "the next campaign on this board restores them")
            return
        self._note("settings_restored", restored, f"restored {_describe(restored)}")

    def _run_job(self, job: Job) -> None:
        # a training format's job (a local step) is measured with [training_runner], every other with [runner]
        settings = dataclasses.replace(self.config.settings_for(job.format), threads=job.threads)
        artifact_dir = self.workspace / "artifacts" / job.artifact
        attempts = self.config.retries + 1
        unstable = 0  # attempts dropped for their CV (remeasure_unstable)
        for tried in range(attempts + self.config.remeasure_unstable):
            attempt = tried - unstable  # this try among the link-fault attempts (re-measures count apart)
            try:
                self._hold_board()
                if not self._ready:
                    self._prepare()
                elif attempt:  # a timed-out or cut run may have left its runner behind: nothing else may run
                    self._reap_strays()
                measurement = self.benchmark(self._connection(), self.spec, artifact_dir, job.format,
                                             variant=job.variant, settings=settings,
                                             timeout=self.config.timeout_s)
            except BoardBusy as exc:
                # another campaign took the board (it was unreachable at the start, or its lock's link dropped):
                # not this job's failure; the device stops and a resume measures the rest
                self.aborted = str(exc)
                return
            except self.fatal_on as exc:
                # e.g. a changed host key: no retry can fix it and every later job would hit it too.
                self._drop_connection()
                self.aborted = f"{type(exc).__name__}: {exc}"
                self._fail(job, self.aborted, attempt + 1)
                return
            except self.retry_on as exc:
                reason = f"{type(exc).__name__}: {exc}"
                if self.stop.is_set():
                    self._fail(job, reason, attempt + 1, status="interrupted")
                    return
                self._drop_connection()
                if attempt + 1 == attempts:
                    self._fail(job, reason, attempts)
                    return
                self.bar.set_postfix_str(f"retry {attempt + 1}/{self.config.retries}: {exc}"[:60], refresh=True)
                if self.stop.wait(backoff_delay(attempt, self.config.retry_backoff_s)):
                    self._fail(job, reason, attempt + 1, status="interrupted")
                    return
                continue
            except EdgemaskError as exc:
                # Not a link fault (a missing file, a runner that cannot load the model): retrying would repeat it.
                self._fail(job, f"{type(exc).__name__}: {exc}", attempt + 1)
                return
            if measurement.ok and measurement.profile.get("etdump_b64"):
                measurement = self._read_etdump(measurement, artifact_dir)
            if not measurement.ok and self.stop.is_set():
                # cut short by Ctrl-C: not the model's fault; its answer is kept, the job is run again
                self._fail(job, f"interrupted: {measurement.error}", attempt + 1, status="interrupted",
                           measurement=measurement)
                return
            if not measurement.ok:  # the runner refused or failed the check: stored, counted failed, re-run later
                self.store.record(job, measurement, attempts=attempt + 1)
                self._failed(job, measurement.error or "the runner failed without a reason", attempt + 1, "failed")
                return
            spread = cv(measurement.latency_ms)
            if not spread <= CV_THRESHOLD and unstable < self.config.remeasure_unstable:
                # disturbed while it was timed: kept as an unstable attempt, measured again
                unstable += 1
                self.store.record_unstable(job, measurement, attempts=attempt + 1)
                self.bar.set_postfix_str(f"CV {100 * spread:.0f} %: measuring again "
                                         f"({unstable}/{self.config.remeasure_unstable})", refresh=True)
                continue
            if unstable or attempt:  # measured in the end: the retry's note no longer applies
                self.bar.set_postfix_str("", refresh=False)
            try:
                recorded = self.store.record(job, measurement, attempts=attempt + 1)
            except DigestChanged as exc:  # the file changed under the campaign: never pooled with the earlier
                self._fail(job, str(exc), attempt + 1, measurement=measurement)
                return
            if recorded:
                self.recorded.append(job.job_id)
                if self.on_recorded is not None:
                    self.on_recorded(job)
            return

    def _read_etdump(self, measurement: Measurement, artifact_dir: Path) -> Measurement:
        """The ETDump the runner brought back -> its operator events per profiled run, mapped to the manifest's
        layers with the artifact's ETRecord (profiling.layers.attach_etdump); the ETDump itself is kept beside
        the store as ``etdump/<sha256>.etdp``."""
        from edgemask.profiling.layers import attach_etdump

        man = load_manifest(artifact_dir)
        keep = Path(self.store.path).parent / "etdump" if getattr(self.store, "path", None) else None
        beside = Path(man.file_for(measurement.format, measurement.variant).file).with_suffix(".etrecord").name
        etrecord = beside if (artifact_dir / beside).is_file() else man.etrecord  # export.formats.pte writes both
        profile = attach_etdump(measurement.profile, artifact_dir, etrecord, man.layers, keep)
        return dataclasses.replace(measurement, profile=profile)

    def _fail(self, job: Job, reason: str, attempts: int, status: str = "failed",
              measurement: Measurement | None = None) -> None:
        self.store.record_failure(job, reason, attempts, status=status, measurement=measurement)
        self._failed(job, reason, attempts, status)

    def _failed(self, job: Job, reason: str, attempts: int, status: str) -> None:
        self.failed.append(FailedJob(job, reason, attempts, status))
        self.bar.set_postfix_str(f"{status}: {reason}"[:60], refresh=True)


def _describe(settings: Mapping[str, Any]) -> str:
    """{"governor": "performance", "jetson_clocks": true} -> "governor performance, jetson_clocks on"."""
    words = []
    for key, value in sorted(settings.items()):
        if key.endswith("_show"):  # a tool's full report, kept in the store, too long for a line
            continue
        if isinstance(value, bool):
            value = "on" if value else "off"
        elif isinstance(value, Mapping):
            value = ",".join(sorted(set(map(str, value.values())))) or "-"
        words.append(f"{key} {value}")
    return ", ".join(words) or "nothing"
