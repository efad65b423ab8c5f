"""Rounds with deadlines, as a deployment runs them (issue #46): the training config's optional ``[system]`` section.

Each simulated device is a board of a mix (:func:`edgemask.mix.assign_boards`: exact shares, seeded, the rule
``edgemask budgets`` uses). A device's local round costs, on its board b (FedScale's completion time, Lai et al.,
OSDI 2022, with the step measured on the board instead of inferred from inference)::

    steps_n   = ⌈num_train_n / B⌉ · E                          (the round's minibatch steps; samples_seen / B where
                                                                 a task stops early; num_train_n − 1 where
                                                                 one_sample_batch drops a lone last sample)
    step_b(f) = step_ms_frozen_b + (step_ms_b − step_ms_frozen_b) · f      f = the device's trained fraction of
                                                                 the model's parameters (1 but for PerFedMask's ψ_n)
    round_n   = steps_n · step_b(f_n) + (bytes_up_n + bytes_down_n) · 8 / bandwidth

``step_ms`` is a step that trains the whole model and ``step_ms_frozen`` one that trains nothing (the line
``edgemask budgets`` fits, at f = 1 and f = 0). A round selects K = ⌊N·participation⌋ devices, or with
over-commitment o, ⌈K·(1 + o)⌉ (FedScale's ``overcommitment``); the server aggregates the first K to finish
within ``deadline_s`` and leaves the others out, as a deployment would: the late ones trained (their device keeps
its personal state, what it computed is counted in the history's costs) but their upload is not aggregated. The
round's wall-clock is the K-th finisher's time when K finish, the last finisher's when every selected device
finishes in time, else the deadline.

Instead of boards, ``[system.trace]`` may name FedScale's device traces (:mod:`edgemask.fedscale`): each device is
a client of its ``client_device_capacity`` (a seeded draw, :func:`edgemask.mix.assign_trace_clients`), its round
FedScale's completion time (``ClientMetadata.get_completion_time``, samples as the history counts them)::

    round_n = augmentation · samples_seen_n · computation_n / 1000          (s; computation in ms per sample)
              + (bytes_up_n + bytes_down_n) · 8 / 1000 / communication_n    (s; communication in kbit/s)

and, with its ``client_behave_trace``, a client of it too: the round starts at the virtual clock (the sum of the
rounds before, FedScale's ``global_virtual_clock``); a selected device offline then does not train, and one offline
when its upload would arrive (clock + its round) is lost, as FedScale's ``tictak_client_tasks`` has it ("if the
client is not active by the time of collection, we consider it is lost in this round"); both count as dropped.

Without ``[system]`` a run is what it was (no history row added, the config written as before).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from edgemask.errors import ConfigError
from edgemask.fedscale import Availability, Capacity, TraceFile, read_availability, read_capacity
from edgemask.mix import assign_boards, assign_trace_clients, check_trace_size
from edgemask.schema import read_dataclass, setting
from edgemask.values import WEEK_S
from edgemask.trainer.sampling import epoch_samples, epoch_steps

MAX_STEP_MS = 3.6e6  # an hour a step: above this a unit is wrong (seconds given as ms · 1000)


@dataclass(frozen=True)
class BoardConfig:
    """One board of the mix, ``[system.boards.<name>]``: its share of the devices and its measured local step."""

    share: float = setting(above=0.0, maximum=1.0)
    step_ms: float = setting(above=0.0, maximum=MAX_STEP_MS)  # a local step training the whole model (f = 1)
    step_ms_frozen: float | None = setting(None, minimum=0.0, maximum=MAX_STEP_MS)  # training nothing; default step_ms
    source: str = ""  # where the steps were measured (a campaign, its store's sha256): recorded, not read

    def step(self, fraction: float) -> float:
        """The step's ms at trained fraction ``fraction`` (the line between f = 0 and f = 1)."""
        frozen = self.step_ms if self.step_ms_frozen is None else self.step_ms_frozen
        return frozen + (self.step_ms - frozen) * fraction


def _path_problem(value: str) -> str | None:
    return "is empty; give the trace file's path" if not value.strip() else None


@dataclass(frozen=True)
class TraceConfig:
    """``[system.trace]``: FedScale's device traces as the device mix (:mod:`edgemask.fedscale`; paths relative to
    the working directory, as ``data.root``; a ``.json`` file holds the same dictionary as JSON)."""

    capacity: str = setting(check=_path_problem)  # client_device_capacity: ms per sample and kbit/s per client
    availability: str | None = setting(None, check=_path_problem)  # client_behave_trace; none: always available
    augmentation: float = setting(3.0, above=0.0, maximum=100.0)  # FedScale's augmentation_factor: a training
    # sample costs this many inferences ("backward-pass takes around 2x the latency")

    def read_files(self) -> tuple[TraceFile, TraceFile | None]:
        """The trace files, read and checked (one line naming the file and field where one is wrong)."""
        cap = read_capacity(self.capacity, "capacity")
        return cap, None if self.availability is None else read_availability(self.availability, "availability")

    @staticmethod
    def check_size(files: tuple[TraceFile, TraceFile | None], devices: int) -> None:
        """Refuse trace files of fewer clients than ``devices`` (each device takes a client of its own)."""
        for f, name in zip(files, ("capacity", "availability")):
            if f is not None:
                check_trace_size(devices, len(f.clients), f"{f.path} ([system.trace] {name})")


@dataclass(frozen=True)
class SystemConfig:
    """``[system]``: the round's deadline, over-commitment, the devices' bandwidth and the board mix, or in place of
    the boards and bandwidth a FedScale device trace (``trace``)."""

    deadline_s: float = setting(above=0.0, maximum=WEEK_S)
    over_commit: float = setting(0.0, minimum=0.0, maximum=10.0)  # select ⌈K·(1 + o)⌉, keep the first K
    bandwidth_kbps: float = setting(10_000.0, above=0.0, maximum=1e9)  # up and down, per device (replay's default)
    boards: dict[str, Any] = setting(factory=dict)  # name -> BoardConfig's table
    trace: dict[str, Any] | None = None  # [system.trace]'s table, read into a TraceConfig

    @classmethod
    def read(cls, source: str, data: Any) -> "SystemConfig":
        cfg = _read(source, "system", data, cls)
        if cfg.trace is not None:
            trace = _read(source, "system.trace", cfg.trace, TraceConfig)
            if cfg.boards:
                raise ConfigError(f"{source}: [system] boards: a device trace ([system.trace]) is the device mix; "
                                  f"give boards or a trace, not both")
            if "bandwidth_kbps" in data:
                raise ConfigError(f"{source}: [system] bandwidth_kbps: the device trace gives each device its own "
                                  f"(its communication); remove it")
            return cls(cfg.deadline_s, cfg.over_commit, trace=trace)
        if not cfg.boards:
            raise ConfigError(f"{source}: [system] boards: empty; name at least one board, e.g. "
                              f"[system.boards.rpi4] share = 1.0, step_ms = 120.0, or a FedScale device trace, "
                              f"[system.trace] capacity = \"client_device_capacity\"")
        boards = {name: _read(source, f"system.boards.{name}", table, BoardConfig)
                  for name, table in cfg.boards.items()}
        total = sum(b.share for b in boards.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ConfigError(f"{source}: [system.boards] the shares add up to {total:g}; make them add up to 1")
        return cls(cfg.deadline_s, cfg.over_commit, cfg.bandwidth_kbps, boards)

    def to_dict(self) -> dict[str, Any]:
        if self.trace is not None:
            return {"deadline_s": self.deadline_s, "over_commit": self.over_commit,
                    "trace": {k: v for k, v in vars(self.trace).items() if v is not None}}
        return {"deadline_s": self.deadline_s, "over_commit": self.over_commit, "bandwidth_kbps": self.bandwidth_kbps,
                "boards": {n: {k: v for k, v in vars(b).items() if v is not None} for n, b in self.boards.items()}}

    def selected(self, k: int, n: int) -> int:
        """How many of ``n`` devices a round of ``k`` selects: ⌈k·(1 + over_commit)⌉, at most n."""
        return min(n, math.ceil(k * (1.0 + self.over_commit) - 1e-9))


def _read(source: str, name: str, data: Any, cls: type) -> Any:
    """Table ``[name]`` read into ``cls``, a field without a default required (named in one line)."""
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
               and f.name not in data] if isinstance(data, dict) else []  # not a table: read_dataclass says so
    if missing:
        raise ConfigError(f"{source}: [{name}] {missing[0]}: missing; give it (docs/training-engine.md, \"Rounds with "
                          f"deadlines\")")
    return read_dataclass(source, name, data, cls)


@dataclass
class DeviceRound:
    """One device's round: its board, steps, compute and communication seconds, whether it was kept, and whether it
    was offline when its upload would have arrived (an availability trace's ``lost``)."""

    board: str
    steps: int
    compute_s: float
    comm_s: float
    kept: bool = False
    lost: bool = False

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


@dataclass
class DeviceTrace:
    """The FedScale trace clients a run's devices are (``[system.trace]``): per device its capacity client and, with
    an availability trace, its availability client (two seeded draws, :func:`edgemask.mix.assign_trace_clients`)."""

    capacity: TraceFile
    availability: TraceFile | None
    augmentation: float
    capacity_of: dict[str, int]  # device -> client id in client_device_capacity
    availability_of: dict[str, int]  # device -> client id in client_behave_trace (empty without one)

    @classmethod
    def build(cls, config: TraceConfig, client_ids: list[str], seed: int,
              files: tuple[TraceFile, TraceFile | None] | None = None) -> "DeviceTrace":
        cap, avail = files if files is not None else config.read_files()
        capacity_of = assign_trace_clients(client_ids, list(cap.clients), seed, 0,
                                           f"{cap.path} ([system.trace] capacity)")
        availability_of = {} if avail is None else assign_trace_clients(
            client_ids, list(avail.clients), seed, 1, f"{avail.path} ([system.trace] availability)")
        return cls(cap, avail, config.augmentation, capacity_of, availability_of)

    def capacity_for(self, cid: str) -> Capacity:
        return self.capacity.clients[self.capacity_of[cid]]

    def is_active(self, cid: str, t: float) -> bool:
        """Whether device ``cid`` is available at ``t`` s of the run (always, without an availability trace)."""
        if self.availability is None:
            return True
        a: Availability = self.availability.clients[self.availability_of[cid]]
        return a.is_active(t)

    def summary(self) -> dict[str, Any]:
        """summary.json's ``system.trace``: each file's path and sha256 (the bytes every cost came from), its
        clients, the augmentation, and each device's trace clients."""
        out: dict[str, Any] = {"capacity": self.capacity.path, "capacity_sha256": self.capacity.sha256,
                               "capacity_clients": len(self.capacity.clients)}
        if self.availability is not None:
            out.update(availability=self.availability.path, availability_sha256=self.availability.sha256,
                       availability_clients=len(self.availability.clients))
        out["augmentation"] = self.augmentation
        out["device_clients"] = {d: {"capacity": c, **({"availability": self.availability_of[d]}
                                                       if self.availability_of else {})}
                                 for d, c in self.capacity_of.items()}
        return out


@dataclass
class System:
    """A run's ``[system]``, its devices' boards (or trace clients), and the rounds it decided (:meth:`round`)."""

    config: SystemConfig
    boards: dict[str, str]  # device -> board ("fedscale-<id>" for a trace client)
    batch_size: int
    k: int  # devices a round aggregates at most
    trace: DeviceTrace | None = None
    drop_one_sample: bool = False  # training.one_sample_batch left an epoch's lone last sample out (sampling.py)
    clock: float = 0.0  # the rounds' wall-clock so far: the next round's start (FedScale's global_virtual_clock)
    dropped: dict[str, int] = field(default_factory=dict)  # board -> updates left out, all rounds
    offline: dict[str, int] = field(default_factory=dict)  # board -> of those, offline (an availability trace)

    @classmethod
    def build(cls, config: SystemConfig, client_ids: list[str], seed: int, batch_size: int, k: int,
              files: tuple[TraceFile, TraceFile | None] | None = None, drop_one_sample: bool = False) -> "System":
        """The run's system; with a trace, ``files`` are its files already read (default: read them now).
        ``drop_one_sample``: the run's ``Algorithm.drop_one_sample``, so a device's steps are those it trained."""
        if config.trace is not None:
            trace = DeviceTrace.build(config.trace, client_ids, seed, files)
            return cls(config, {d: f"fedscale-{c}" for d, c in trace.capacity_of.items()}, batch_size, k, trace,
                       drop_one_sample)
        mix = {name: b.share for name, b in config.boards.items()}
        return cls(config, assign_boards(client_ids, mix, seed), batch_size, k, drop_one_sample=drop_one_sample)

    @property
    def availability(self) -> bool:
        """Whether devices come and go (an availability trace): the history then records ``offline``."""
        return self.trace is not None and self.trace.availability is not None

    def device_round(self, cid: str, num_samples: int, samples_seen: int, fraction: float, bytes_up: int,
                     bytes_down: int) -> DeviceRound:
        """Device ``cid``'s round cost (module docstring): its steps from its samples, its board's step at
        ``fraction``, its bytes at the bandwidth; with a trace, FedScale's completion time of its trace client."""
        board = self.boards[cid]
        B = self.batch_size
        per_epoch = epoch_samples(num_samples, B, self.drop_one_sample)  # the samples an epoch trained on
        epochs, rest = divmod(samples_seen, per_epoch) if per_epoch else (0, samples_seen)
        steps = (epoch_steps(num_samples, B, self.drop_one_sample) * epochs if rest == 0
                 else math.ceil(samples_seen / B))
        if self.trace is not None:
            c = self.trace.capacity_for(cid)
            compute = self.trace.augmentation * samples_seen * c.computation_ms / 1000.0
            return DeviceRound(board, steps, compute, (bytes_up + bytes_down) * 8 / (c.communication_kbps * 1000.0))
        b = self.config.boards[board]
        comm = (bytes_up + bytes_down) * 8 / (self.config.bandwidth_kbps * 1000.0)
        return DeviceRound(board, steps, steps * b.step(fraction) / 1000.0, comm)

    def available(self, cids: list[str]) -> tuple[list[str], list[str]]:
        """``cids`` split into those available at the round's start (the clock) and those offline (who do not
        train); all available without an availability trace."""
        if not self.availability:
            return list(cids), []
        assert self.trace is not None
        on = {c for c in cids if self.trace.is_active(c, self.clock)}
        return [c for c in cids if c in on], [c for c in cids if c not in on]

    def decide(self, rounds: dict[str, DeviceRound]) -> float:
        """Mark the first ``k`` devices to finish within the deadline (and, with an availability trace, still
        available when they finish) as kept (ties by name); return the round's wall-clock seconds."""
        deadline = self.config.deadline_s
        if self.availability:
            assert self.trace is not None
            for cid, r in rounds.items():
                r.lost = not self.trace.is_active(cid, self.clock + r.total_s)
        in_time = sorted((r.total_s, cid) for cid, r in rounds.items() if r.total_s <= deadline and not r.lost)
        for _, cid in in_time[: self.k]:
            rounds[cid].kept = True
        for cid, r in rounds.items():
            if not r.kept:
                self.dropped[r.board] = self.dropped.get(r.board, 0) + 1
            if r.lost:
                self.offline[r.board] = self.offline.get(r.board, 0) + 1
        if len(in_time) >= self.k:
            return in_time[self.k - 1][0] if self.k else 0.0
        return in_time[-1][0] if len(in_time) == len(rounds) and in_time else deadline

    def round(self, rnd: int, results: list[tuple[str, Any]], updates: list[Any], fraction: Callable[[str], float],
              record: Callable[[int, str, str, float], None], offline: list[str] | tuple[str, ...] = ()) -> list[Any]:
        """Round ``rnd``'s trained devices (``results``: ``(cid, LocalResult)``, ``updates`` their uploads, in
        order) costed and decided, ``offline`` the selected devices that were offline at its start (they did not
        train: dropped); the history rows recorded (per device ``local_round_s``, ``compute_s``, ``comm_s``,
        ``dropped`` 1/0, and with an availability trace ``offline`` 1/0; on ``server`` ``round_time_s``,
        ``devices_selected``, ``devices_dropped``, and ``devices_offline``); the clock moved on by the round;
        returns the uploads the server aggregates."""
        rounds = {cid: self.device_round(cid, res.num_samples, res.samples_seen, fraction(cid), upd.bytes_up,
                                         upd.bytes_down) for (cid, res), upd in zip(results, updates)}
        wall = self.decide(rounds)
        for cid, r in rounds.items():
            for metric, value in (("local_round_s", r.total_s), ("compute_s", r.compute_s), ("comm_s", r.comm_s),
                                  ("dropped", 0.0 if r.kept else 1.0)):
                record(rnd, cid, metric, value)
            if self.availability:
                record(rnd, cid, "offline", 1.0 if r.lost else 0.0)
        for cid in offline:
            board = self.boards[cid]
            self.dropped[board] = self.dropped.get(board, 0) + 1
            self.offline[board] = self.offline.get(board, 0) + 1
            record(rnd, cid, "dropped", 1.0)
            record(rnd, cid, "offline", 1.0)
        record(rnd, "server", "round_time_s", wall)
        record(rnd, "server", "devices_selected", len(rounds) + len(offline))
        record(rnd, "server", "devices_dropped", sum(not r.kept for r in rounds.values()) + len(offline))
        if self.availability:
            record(rnd, "server", "devices_offline", sum(r.lost for r in rounds.values()) + len(offline))
        self.clock += wall
        return [u for u in updates if rounds[u.client_id].kept]

    def summary(self) -> dict[str, Any]:
        """summary.json's ``system``: the section as read, each device's board, the updates left out per board; with
        a trace, its files' paths and sha256 and each device's trace clients (``trace``), and with an availability
        trace the updates left out because the device was offline (``offline_per_board``)."""
        out = {**self.config.to_dict(), "aggregated_per_round": self.k, "device_boards": dict(self.boards),
               "dropped_per_board": dict(sorted(self.dropped.items()))}
        if self.trace is not None:
            out["trace"] = self.trace.summary()
        if self.availability:
            out["offline_per_board"] = dict(sorted(self.offline.items()))
        return out
