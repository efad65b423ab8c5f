"""Profiling campaigns: artifacts × formats × variants × devices × threads × repetitions.

A campaign is described once in ``campaign.toml``, validated once into frozen dataclasses, expanded into
``Job``s with stable ids, and run with one worker thread per device: boards run in parallel, the jobs on one
board one after another (a board measures one thing at a time). Every finished job is committed to the
campaign's store before the next one starts, so a campaign stopped at any point resumes where it stopped.

``campaign.toml``::

    [campaign]
    name = "digits-cnn"
    formats = ["onnx", "pte"]          # onnx | pte | tflite
    variants = ["fp32"]                # fp32 | int8
    devices = ["local", "rpi4-a"]      # names from the inventory
    threads = [1, 4]
    repetitions = 3
    timeout_s = 600                    # per job
    cooldown_s = 5                     # idle time between two jobs on one device
    retries = 2                        # extra attempts after a connection fault
    retry_backoff_s = 2.0              # base of the jittered exponential backoff
    inventory = "devices.toml"         # optional, relative to the workspace
    remeasure_unstable = 0             # re-measure a repetition whose CV > the verdict's 10 %, up to N times
    sample_clients = 0                 # > 0: measure this many clients per run, spread over their kept units,
    sample_seed = 0                    #   and predict the others from their per-layer times (profiling.predict)

    [[artifacts]]
    run = "digits-fedmask-20261122"    # artifacts/<run>/...
    clients = "all"                    # or ["client-000", "client-003"]
    dense = true                       # also the run's dense baseline artifacts/<run>/dense

    [runner]                           # any field of devices.records.RunnerSettings except threads
    warmup_runs = 1
    min_runs = 50                      # timed latency samples, at least
    min_seconds = 1.0
    sample_min_ms = 0.0                # > 0: a sample is the mean of back-to-back inferences lasting this long
    profile_layers = true              # also per-operator profiled runs, apart from the timed ones
    profile_warmup = 5
    profile_runs = 20
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import re
import threading
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.errors import BoardBusy
from devices.records import Measurement, RunnerSettings
from edgemask.errors import ConfigError, EdgemaskError
from edgemask.manifest import MANIFEST, load_artifact, load_manifest
from edgemask.registry import Registry
from edgemask.schema import Field, Table
from edgemask.targets import FORMAT_RUNTIME, artifact_format
from edgemask.tomlio import read_toml
from edgemask.workspace import check_name
from profiling.records import ArtifactInfo, ArtifactSelection, CampaignConfig, Job, SkippedJob
from profiling.store import DigestChanged
from profiling.stats import cv
from profiling.verdict import CV_THRESHOLD

# Format name -> the runtime that runs it (docs/contracts.md): edgemask.targets' one map, as a registry so an unknown
# name in a campaign lists the valid ones.
FORMATS: Registry[str] = Registry("format")
for _fmt, _runtime in FORMAT_RUNTIME.items():
    FORMATS.add(_fmt, _runtime)

VARIANTS: Registry[str] = Registry("variant")
VARIANTS.add("fp32", "fp32")
VARIANTS.add("int8", "int8")

DENSE_CLIENT = "dense"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


# ------------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------------
# Upper bounds on the campaign's counts (issue #27: `repetitions = 10**12` allocated 5.7 GB of jobs and died with
# MemoryError before any work). Each is far above any real campaign (a setting measured 1000 times; 1024 runtime
# threads; a runner count of a million runs), and keeps the job list and the runner's sample arrays small.
MAX_REPETITIONS = 1000
MAX_THREADS = 1024
MAX_RETRIES = 100
MAX_RUNNER_COUNT = 1_000_000


def _runner_field(name: str, default: Any) -> Field:
    if isinstance(default, bool):
        return Field(bool)
    if isinstance(default, int):
        return Field(int, minimum=1 if name == "min_runs" else 0, maximum=MAX_RUNNER_COUNT)
    return Field(float, minimum=0)


_TOP = {"campaign": Field(dict), "artifacts": Field(list, nonempty=True, what="[[artifacts]] table"),
        "runner": Field(dict, default={})}
_CAMPAIGN = {
    "name": Field(str),
    "formats": Field(list, items=str, choices=FORMATS, what="format", nonempty=True, unique=True),
    "variants": Field(list, ["fp32"], items=str, choices=VARIANTS, what="variant", nonempty=True, unique=True),
    "devices": Field(list, ["local"], items=str, what="device", nonempty=True, unique=True),
    "threads": Field(list, [1], items=int, minimum=1, maximum=MAX_THREADS, what="thread count", nonempty=True,
                     unique=True),
    "repetitions": Field(int, 1, minimum=1, maximum=MAX_REPETITIONS),
    "timeout_s": Field(float, 600.0, above=0),
    "cooldown_s": Field(float, 0.0, minimum=0),
    "retries": Field(int, 2, minimum=0, maximum=MAX_RETRIES),
    "retry_backoff_s": Field(float, 2.0, minimum=0),
    "inventory": Field(str, None),
    "remeasure_unstable": Field(int, 0, minimum=0, maximum=MAX_RETRIES),
    "sample_clients": Field(int, 0, minimum=0),
    "sample_seed": Field(int, 0),
}
_SELECTION = {"run": Field(str), "clients": Field((str, list), "all", items=str, what="client id", unique=True),
              "dense": Field(bool, True)}
# any field of RunnerSettings except threads (the campaign's own list)
_RUNNER = {f.name: _runner_field(f.name, f.default) for f in dataclasses.fields(RunnerSettings) if f.name != "threads"}


def parse_campaign(data: Mapping[str, Any], source: str = "campaign.toml",
                   known_devices: Collection[str] | None = None) -> CampaignConfig:
    """Validate a parsed ``campaign.toml`` against its schema (:mod:`edgemask.schema`: one wording for every
    mistake). ``known_devices``: the inventory's names, checked when given."""
    top = Table(source, "", data, _TOP)
    schema = _CAMPAIGN if known_devices is None else {
        **_CAMPAIGN, "devices": dataclasses.replace(_CAMPAIGN["devices"], choices=sorted(known_devices))}
    camp = Table(source, "campaign", top["campaign"], schema)

    name = camp["name"]
    check_name(name, f"{source}: [campaign] name")
    if not _NAME_RE.match(name):
        raise camp.error("name", f"{name!r} is not a directory name", "use letters, digits, '.', '_' and '-'")

    selections = []
    for i, entry in enumerate(top["artifacts"]):
        if not isinstance(entry, dict):
            raise top.error("artifacts", f"holds {entry!r}", "write each selection as an [[artifacts]] table")
        sel = Table(source, f"artifacts[{i}]", entry, _SELECTION)
        run = sel["run"]
        check_name(run, f"{source}: [artifacts[{i}]] run")
        if not _NAME_RE.match(run):
            raise sel.error("run", f"{run!r} is not a run id", "use letters, digits, '.', '_' and '-'")
        clients_raw = sel["clients"]
        if isinstance(clients_raw, str):
            if clients_raw != "all":
                raise sel.error("clients", f"is {clients_raw!r}", 'write "all" or a list of client ids')
            clients = None
        else:  # [] = the dense baseline alone (e.g. FedAvg, whose clients all run it)
            clients = tuple(clients_raw)
            for client in clients:  # each becomes artifacts/<run>/<client>: "..", "/" would leave the run
                check_name(client, f"{source}: [artifacts[{i}]] clients")
            if DENSE_CLIENT in clients:
                raise sel.error("clients", 'lists "dense"', "remove it; dense = true measures the baseline")
        dense = sel["dense"]
        if clients == () and not dense:
            raise sel.error("clients", "is empty and dense = false: the selection measures nothing",
                            "name clients or set dense = true")
        selections.append(ArtifactSelection(run=run, clients=clients, dense=dense))

    runner = Table(source, "runner", top["runner"], _RUNNER)
    return CampaignConfig(
        name=name,
        artifacts=tuple(selections),
        formats=tuple(camp["formats"]),
        variants=tuple(camp["variants"]),
        devices=tuple(camp["devices"]),
        threads=tuple(camp["threads"]),
        repetitions=camp["repetitions"],
        runner=RunnerSettings(**runner.values()),
        timeout_s=camp["timeout_s"],
        cooldown_s=camp["cooldown_s"],
        retries=camp["retries"],
        retry_backoff_s=camp["retry_backoff_s"],
        inventory=camp["inventory"],
        remeasure_unstable=camp["remeasure_unstable"],
        sample_clients=camp["sample_clients"],
        sample_seed=camp["sample_seed"],
    )


def load_campaign(path: str | Path, known_devices: Collection[str] | None = None) -> CampaignConfig:
    """Read and validate ``campaign.toml``; errors name the file and the field."""
    path = Path(path)
    data = read_toml(path, "no such campaign file")
    return parse_campaign(data, str(path), known_devices)


# ------------------------------------------------------------------------------------------------
# Artifacts and jobs
# ------------------------------------------------------------------------------------------------
def read_manifest(path: str | Path) -> ArtifactInfo:
    """Read an artifact's ``manifest.json`` (or its directory) with the shared reader into an ``ArtifactInfo``.

    A missing or malformed manifest, one that sits under another run or client than it names, or whose files'
    ``bytes`` / ``sha256`` differ from the files, raises ``CorruptFileError`` naming the file
    (``edgemask.manifest.load_artifact``): the store only ever records what the report can trust."""
    m = load_artifact(path)
    return ArtifactInfo(
        run_id=m.run_id, client_id=m.client_id, kind=m.kind, algorithm=m.algorithm, model=m.model,
        dataset=m.dataset, params_dense=m.params["dense"], params_compacted=m.params["compacted"],
        flops_dense=m.flops["dense"], flops_compacted=m.flops["compacted"], files=tuple(m.files),
        manifest=m.to_dict(),
    )


@dataclass(frozen=True)
class CampaignPlan:
    jobs: tuple[Job, ...]
    skipped: tuple[SkippedJob, ...]
    artifacts: Mapping[str, ArtifactInfo]  # artifact -> manifest numbers


def _select_clients(run_dir: Path, sel: ArtifactSelection) -> list[str]:
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no artifacts for run {sel.run!r}; run `edgemask export --run {sel.run}` first")
    if sel.clients is None:
        # names with a leading dot are export's own temporary folders (a killed writer's), never clients
        clients = sorted(p.name for p in run_dir.iterdir()
                         if p.name != DENSE_CLIENT and not p.name.startswith(".") and (p / MANIFEST).is_file())
        if not clients:
            raise ConfigError(f"{run_dir}: run {sel.run!r} has no exported client artifacts")
    else:
        clients = list(sel.clients)
        missing = [c for c in clients if not (run_dir / c / MANIFEST).is_file()]
        if missing:
            raise ConfigError(f"{run_dir}: no exported artifact for client(s) {', '.join(missing)}")
    if sel.dense:
        if not (run_dir / DENSE_CLIENT / MANIFEST).is_file():
            raise ConfigError(f"{run_dir / DENSE_CLIENT}: run {sel.run!r} has no dense baseline; "
                              f"export it or set dense = false")
        clients = [DENSE_CLIENT, *clients]
    return clients


def plan_campaign(config: CampaignConfig, workspace: str | Path,
                  inventory: Mapping[str, Any] | None = None) -> CampaignPlan:
    """Expand the config into jobs. Formats a manifest lacks, or a device's runtimes lack, are skipped with why.

    Order on one device: repetition outermost, so every repetition sweeps all artifacts and slow drift
    (heat, background load) spreads over all of them instead of biasing the ones measured last.
    """
    workspace = Path(workspace)
    infos: dict[str, ArtifactInfo] = {}
    for sel in config.artifacts:
        run_dir = workspace / "artifacts" / sel.run
        for client in _select_clients(run_dir, sel):
            info = read_manifest(run_dir / client)
            infos[f"{sel.run}/{client}"] = info
    measure = sampled(config, infos)

    runnable: list[tuple[str, str, str, str]] = []
    skipped: list[SkippedJob] = []
    for device in config.devices:
        runtimes = getattr(inventory.get(device), "runtimes", None) if inventory else None
        for artifact, info in infos.items():
            if artifact not in measure:
                continue
            for fmt in config.formats:
                for variant in config.variants:
                    if info.file_for(artifact_format(fmt), variant) is None:  # trt: the ONNX file
                        have = ", ".join(f"{f.format}/{f.variant}" for f in info.files) or "none"
                        skipped.append(SkippedJob(artifact, fmt, variant, device,
                                                  f"manifest has no {artifact_format(fmt)}/{variant} file (has: {have})"))
                    elif runtimes and FORMATS.get(fmt) not in runtimes:  # empty: not declared
                        skipped.append(SkippedJob(artifact, fmt, variant, device,
                                                  f"device has no {FORMATS.get(fmt)} runtime "
                                                  f"(has: {', '.join(runtimes) or 'none'})"))
                    else:
                        runnable.append((artifact, fmt, variant, device))

    jobs = [
        Job(artifact, fmt, variant, device, threads, rep)
        for device in config.devices
        for rep in range(config.repetitions)
        for (artifact, fmt, variant, dev) in runnable if dev == device
        for threads in config.threads
    ]
    return CampaignPlan(jobs=tuple(jobs), skipped=tuple(skipped), artifacts=infos)


def sampled(config: CampaignConfig, infos: Mapping[str, ArtifactInfo]) -> set[str]:
    """The artifacts a campaign measures: all, or with ``sample_clients = K`` per run its dense baseline and K
    compacted clients spread over their total kept units (:func:`profiling.predict.choose_sample`, seeded with
    ``sample_seed``); the rest stay in the plan's artifacts, to be predicted."""
    if not config.sample_clients:
        return set(infos)
    from profiling.predict import choose_sample, kept_totals

    keep = {a for a, i in infos.items() if i.kind != "compacted"}
    for run in sorted({i.run_id for i in infos.values()}):
        clients = {a: i.manifest for a, i in infos.items() if i.run_id == run and i.kind == "compacted"}
        keep.update(choose_sample(kept_totals(clients), config.sample_clients, config.sample_seed))
    return keep


def plan_jobs(config: CampaignConfig, workspace: str | Path) -> list[Job]:
    """The campaign's jobs (see ``plan_campaign`` for the skipped combinations and why)."""
    return list(plan_campaign(config, workspace).jobs)


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FailedJob:
    job: Job
    reason: str
    attempts: int
    status: str = "failed"  # failed | interrupted | given up (failed in more runs than `retries` allows)


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


Benchmark = Callable[..., Measurement]
Connect = Callable[[Any], contextlib.AbstractContextManager[Any]]


class BoardHooks:
    """What a campaign does to a board around its jobs; the default does nothing (injected benchmarks, tests).

    ``devices.board.BOARD`` is the real one: it holds the board for the campaign (a lock on the board), finds
    and kills stray runners before timing, applies the inventory's governor / jetson_clocks and restores the
    board's previous settings afterwards."""

    locks_boards = False  # True: hold() takes a lock on the board (over a connection of its own)

    def hold(self, conn: Any, spec: Any, holder: Mapping[str, Any], wait_s: float = 0.0,
             on_wait: Callable[[str], None] | None = None) -> Any:
        """Take the board for this campaign over ``conn``; return the hold (``alive()``, ``release()``), or None
        where boards are not locked. Raises ``BoardBusy`` naming the holder when another campaign has it."""
        return None

    def reap_strays(self, conn: Any, spec: Any, hold: Any = None) -> list[dict[str, Any]]:
        """Kill runners of ours left on the board (an earlier run's); return what was found. Given the
        campaign's hold, nothing is killed unless that hold is the board's lock holder."""
        return []

    def apply(self, conn: Any, spec: Any) -> dict[str, Any] | None:
        """Set the board up for timing; return what to restore (None: nothing was changed)."""
        return None

    def restore(self, conn: Any, spec: Any, applied: Mapping[str, Any]) -> dict[str, Any]:
        return {}


def _default_benchmark() -> Benchmark:
    from devices.benchmark import run_benchmark  # devices is imported only when a real campaign runs

    return run_benchmark


def _default_connect() -> Connect:
    from devices.connection import open_connection

    return open_connection


def _default_board() -> BoardHooks:
    from devices.board import BOARD

    return BOARD


def _default_retry_on() -> tuple[type[BaseException], ...]:
    from devices.errors import DeviceError

    return (DeviceError,)


def _default_fatal_on() -> tuple[type[BaseException], ...]:
    from devices.board import SettingsRefused
    from devices.errors import HostKeyError

    return (HostKeyError, SettingsRefused)


def backoff_delay(attempt: int, base_s: float, cap_s: float = 60.0, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter in [0.5, 1.5) × base·2^attempt, capped (attempt counts from 0)."""
    rng = rng or random
    return min(cap_s, base_s * (2 ** attempt)) * (0.5 + rng.random())


class _DeviceWorker:
    """Runs one device's jobs one after another over one (re)opened connection.

    Before the first job it kills stray runners and applies the board's settings; after the last (or when
    stopped) it restores them. A job whose run is cut by ``interrupt()`` (Ctrl-C) is stored as interrupted."""

    def __init__(self, device: str, spec: Any, jobs: list[Job], *, config: CampaignConfig, workspace: Path,
                 store: Any, benchmark: Benchmark, connect: Connect, retry_on: tuple[type[BaseException], ...],
                 fatal_on: tuple[type[BaseException], ...], stop: threading.Event, bar: Any,
                 on_recorded: Callable[[Job], None] | None, board: BoardHooks,
                 lock: "_BoardLock | None" = None) -> None:
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
        settings = dataclasses.replace(self.config.runner, threads=job.threads)
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
        from profiling.layers import attach_etdump

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


class _BoardLock:
    """One device's board lock for this campaign: its own connection (a job's link fault never drops it) and the
    hold taken over it."""

    def __init__(self, connect: Connect, spec: Any, holder: Mapping[str, Any]) -> None:
        self.connect, self.spec, self.holder = connect, spec, holder
        self._stack = contextlib.ExitStack()
        self._conn: Any = None
        self.hold: Any = None

    def take(self, board: BoardHooks, wait_s: float = 0.0, on_wait: Callable[[str], None] | None = None) -> bool:
        """Hold the board unless held already; True when it was taken now. A link fault raises (retry_on)."""
        if self.hold is not None and self.hold.alive():
            return False
        if self.hold is not None:
            self.hold.release()
            self.hold = None
        if self._conn is None:
            self._conn = self._stack.enter_context(self.connect(self.spec))
        self.hold = board.hold(self._conn, self.spec, self.holder, wait_s, on_wait)
        return self.hold is not None

    def release(self) -> None:
        try:
            if self.hold is not None:
                self.hold.release()
        finally:
            self.hold = None
            self._stack.close()


def holder_identity(campaign: str) -> dict[str, Any]:
    """Who takes a board: this host, this process, the campaign, since when, and a token only it knows."""
    import os
    import secrets
    import socket
    from datetime import datetime, timezone

    return {"host": socket.gethostname(), "pid": os.getpid(), "campaign": campaign,
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "token": secrets.token_hex(8)}


def _take_boards(config: CampaignConfig, inventory: Mapping[str, Any], board: BoardHooks, connect: Connect,
                 retry_on: tuple[type[BaseException], ...], wait_s: float,
                 on_wait: Callable[[str], None] | None) -> dict[str, _BoardLock]:
    """Hold every board of the campaign before any job starts, one after another (each waits up to ``wait_s``).

    A board another campaign holds: everything taken so far is let go and BoardBusy (one line, naming the holder)
    ends the campaign before it measures anything. A board that cannot be reached now is taken by its worker
    when it first reaches it."""
    locks: dict[str, _BoardLock] = {}
    if not getattr(board, "locks_boards", False):
        return locks
    holder = holder_identity(config.name)
    try:
        for device in config.devices:
            locks[device] = lock = _BoardLock(connect, inventory[device], holder)
            try:
                lock.take(board, wait_s, on_wait)
            except retry_on:
                pass  # unreachable now: its worker retries like any link fault
    except BaseException:
        for lock in locks.values():
            lock.release()
        raise
    return locks


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


def _run_locked(config: CampaignConfig, workspace: Path, *, benchmark: Benchmark | None, progress: bool,
                inventory: Mapping[str, Any] | None, connect: Connect | None,
                retry_on: tuple[type[BaseException], ...] | None, fatal_on: tuple[type[BaseException], ...] | None,
                on_recorded: Callable[[Job], None] | None, board: BoardHooks | None, board_wait_s: float = 0.0,
                on_wait: Callable[[str], None] | None = None) -> CampaignResult:

    from profiling.store import ResultsStore

    if board is None:
        board = _default_board() if benchmark is None else BoardHooks()
    benchmark = benchmark or _default_benchmark()
    connect = connect or _default_connect()
    retry_on = retry_on or _default_retry_on()
    fatal_on = fatal_on or _default_fatal_on()
    if inventory is None:
        from devices.inventory import load_inventory

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
        locks = _take_boards(dataclasses.replace(config, devices=tuple(d for d in config.devices if d in devices)),
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
                 on_recorded: Callable[[Job], None] | None, board: BoardHooks, locks: Mapping[str, _BoardLock],
                 progress: bool) -> CampaignResult:
    from tqdm.auto import tqdm

    stop = threading.Event()
    workers: list[_DeviceWorker] = []
    bars = []
    for pos, device in enumerate(config.devices):
        jobs = [j for j in todo if j.device == device]
        bar = tqdm(total=len(jobs), desc=device, position=pos, leave=True, disable=not progress,
                   unit="job", dynamic_ncols=True)
        bars.append(bar)
        workers.append(_DeviceWorker(device, inventory[device], jobs, config=config, workspace=workspace,
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
