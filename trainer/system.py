"""Rounds with deadlines, as a deployment runs them (issue #46): the training config's optional ``[system]`` section.

Each simulated device is a board of a mix (:func:`edgemask.mix.assign_boards`: exact shares, seeded, the rule
``edgemask budgets`` uses). A device's local round costs, on its board b (FedScale's completion time, Lai et al.,
OSDI 2022, with the step measured on the board instead of inferred from inference)::

    steps_n   = ⌈num_train_n / B⌉ · E                          (the round's minibatch steps; samples_seen / B where
                                                                 a task stops early)
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

Without ``[system]`` a run is what it was (no history row added, the config written as before).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from edgemask.errors import ConfigError
from edgemask.mix import assign_boards
from edgemask.schema import read_dataclass, setting
from edgemask.values import WEEK_S

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


@dataclass(frozen=True)
class SystemConfig:
    """``[system]``: the round's deadline, over-commitment, the devices' bandwidth and the board mix."""

    deadline_s: float = setting(above=0.0, maximum=WEEK_S)
    over_commit: float = setting(0.0, minimum=0.0, maximum=10.0)  # select ⌈K·(1 + o)⌉, keep the first K
    bandwidth_kbps: float = setting(10_000.0, above=0.0, maximum=1e9)  # up and down, per device (replay's default)
    boards: dict[str, Any] = setting(factory=dict)  # name -> BoardConfig's table

    @classmethod
    def read(cls, source: str, data: Any) -> "SystemConfig":
        cfg = _read(source, "system", data, cls)
        if not cfg.boards:
            raise ConfigError(f"{source}: [system] boards: empty; name at least one board, e.g. "
                              f"[system.boards.rpi4] share = 1.0, step_ms = 120.0")
        boards = {name: _read(source, f"system.boards.{name}", table, BoardConfig)
                  for name, table in cfg.boards.items()}
        total = sum(b.share for b in boards.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ConfigError(f"{source}: [system.boards] the shares add up to {total:g}; make them add up to 1")
        return cls(cfg.deadline_s, cfg.over_commit, cfg.bandwidth_kbps, boards)

    def to_dict(self) -> dict[str, Any]:
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
    """One device's round: its board, steps, compute and communication seconds, and whether it was kept."""

    board: str
    steps: int
    compute_s: float
    comm_s: float
    kept: bool = False

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s


@dataclass
class System:
    """A run's ``[system]``, its devices' boards, and the rounds it decided (:meth:`round`)."""

    config: SystemConfig
    boards: dict[str, str]  # device -> board
    batch_size: int
    k: int  # devices a round aggregates at most
    dropped: dict[str, int] = field(default_factory=dict)  # board -> updates left out, all rounds

    @classmethod
    def build(cls, config: SystemConfig, client_ids: list[str], seed: int, batch_size: int, k: int) -> "System":
        mix = {name: b.share for name, b in config.boards.items()}
        return cls(config, assign_boards(client_ids, mix, seed), batch_size, k)

    def device_round(self, cid: str, num_samples: int, samples_seen: int, fraction: float, bytes_up: int,
                     bytes_down: int) -> DeviceRound:
        """Device ``cid``'s round cost (module docstring): its steps from its samples, its board's step at
        ``fraction``, its bytes at the bandwidth."""
        board = self.boards[cid]
        b, B = self.config.boards[board], self.batch_size
        epochs, rest = divmod(samples_seen, num_samples) if num_samples else (0, samples_seen)
        steps = math.ceil(num_samples / B) * epochs if rest == 0 else math.ceil(samples_seen / B)
        comm = (bytes_up + bytes_down) * 8 / (self.config.bandwidth_kbps * 1000.0)
        return DeviceRound(board, steps, steps * b.step(fraction) / 1000.0, comm)

    def decide(self, rounds: dict[str, DeviceRound]) -> float:
        """Mark the first ``k`` devices to finish within the deadline as kept (ties by name); return the round's
        wall-clock seconds."""
        deadline = self.config.deadline_s
        in_time = sorted((r.total_s, cid) for cid, r in rounds.items() if r.total_s <= deadline)
        for _, cid in in_time[: self.k]:
            rounds[cid].kept = True
        for cid, r in rounds.items():
            if not r.kept:
                self.dropped[r.board] = self.dropped.get(r.board, 0) + 1
        if len(in_time) >= self.k:
            return in_time[self.k - 1][0] if self.k else 0.0
        return in_time[-1][0] if len(in_time) == len(rounds) and in_time else deadline

    def round(self, rnd: int, results: list[tuple[str, Any]], updates: list[Any], fraction: Callable[[str], float],
              record: Callable[[int, str, str, float], None]) -> list[Any]:
        """Round ``rnd``'s trained devices (``results``: ``(cid, LocalResult)``, ``updates`` their uploads, in
        order) costed and decided; the history rows recorded (per device ``local_round_s``, ``compute_s``,
        ``comm_s``, ``dropped`` 1/0; on ``server`` ``round_time_s``, ``devices_selected``, ``devices_dropped``);
        returns the uploads the server aggregates."""
        rounds = {cid: self.device_round(cid, res.num_samples, res.samples_seen, fraction(cid), upd.bytes_up,
                                         upd.bytes_down) for (cid, res), upd in zip(results, updates)}
        wall = self.decide(rounds)
        for cid, r in rounds.items():
            for metric, value in (("local_round_s", r.total_s), ("compute_s", r.compute_s), ("comm_s", r.comm_s),
                                  ("dropped", 0.0 if r.kept else 1.0)):
                record(rnd, cid, metric, value)
        record(rnd, "server", "round_time_s", wall)
        record(rnd, "server", "devices_selected", len(rounds))
        record(rnd, "server", "devices_dropped", sum(not r.kept for r in rounds.values()))
        return [u for u in updates if rounds[u.client_id].kept]

    def summary(self) -> dict[str, Any]:
        """summary.json's ``system``: the section as read, each device's board, the updates left out per board."""
        return {**self.config.to_dict(), "aggregated_per_round": self.k, "device_boards": dict(self.boards),
                "dropped_per_board": dict(sorted(self.dropped.items()))}
