"""Training configuration: frozen dataclasses loaded from TOML and validated once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgemask.errors import ConfigError
from edgemask.tomlio import dumps_toml, read_toml
from edgemask.workspace import check_name
from trainer.data.base import DataConfig


@dataclass(frozen=True)
class ModelConfig:
    name: str = "mlp"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AlgorithmConfig:
    """``args`` are the algorithm's own hyperparameters (e.g. FedMask's ``prune_rate``); each algorithm
    validates them against its own dataclass."""

    name: str = "fedavg"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingConfig:
    rounds: int = 20
    local_epochs: int = 1
    batch_size: int = 16
    lr: float = 0.05
    momentum: float = 0.0
    weight_decay: float = 0.0
    participation: float = 1.0  # fraction of clients sampled per round (FedMask's K)
    eval_every: int = 1
    device: str = "cpu"
    batched: bool = True  # train a round's clients together (trainer.batched); false: one after another, the reference
    target_accuracy: float | None = None  # υ: report rounds until the global model reaches it (FedPeWS Table 2)


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    run_id: str | None = None  # default: <dataset>-<algorithm>-<model>-s<seed>


@dataclass(frozen=True)
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)

    @property
    def run_id(self) -> str:
        return self.run.run_id or f"{self.data.name}-{self.algorithm.name}-{self.model.name}-s{self.run.seed}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["run"]["run_id"] = self.run_id
        return d

    def to_toml(self) -> str:
        return dumps_toml(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> "TrainConfig":
        sections = {"run": RunConfig, "data": DataConfig, "model": ModelConfig,
                    "algorithm": AlgorithmConfig, "training": TrainingConfig}
        unknown = set(d) - set(sections)
        if unknown:
            raise ConfigError(f"{source}: unknown section [{sorted(unknown)[0]}]; valid: {', '.join(sections)}")
        kw = {k: _section(typ, d.get(k, {}), f"{source} [{k}]") for k, typ in sections.items()}
        cfg = cls(**kw)
        _validate(cfg, source)
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(read_toml(path), str(path))

    def replace(self, **sections: Any) -> "TrainConfig":
        return dataclasses.replace(self, **sections)


def _section(typ: type, raw: Any, where: str) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a table")
    fields = {f.name: f for f in dataclasses.fields(typ)}
    for k, v in raw.items():
        if k not in fields:
            raise ConfigError(f"{where}: unknown field {k!r}; valid: {', '.join(fields)}")
    kw = {}
    for k, v in raw.items():
        default = fields[k].default
        if isinstance(default, bool) and not isinstance(v, bool):
            raise ConfigError(f"{where}: field {k!r} must be true or false, got {v!r}")
        if isinstance(default, int) and not isinstance(default, bool) and not (isinstance(v, int) and not isinstance(v, bool)):
            raise ConfigError(f"{where}: field {k!r} must be an integer, got {v!r}")
        if isinstance(default, float) and not isinstance(v, (int, float)):
            raise ConfigError(f"{where}: field {k!r} must be a number, got {v!r}")
        if isinstance(default, float):
            v = float(v)
        kw[k] = v
    return typ(**kw)


def _validate(cfg: TrainConfig, source: str) -> None:
    from trainer.algorithms import ALGORITHMS
    from trainer.data import DATASETS
    from trainer.models import MODELS

    # it becomes runs/<run-id>: never a path out of runs/ (and "" is a mistake, not the default id)
    check_name(cfg.run_id if cfg.run.run_id is None else cfg.run.run_id, f"{source}: run.run_id")
    DATASETS.get(cfg.data.name)
    MODELS.get(cfg.model.name)
    ALGORITHMS.get(cfg.algorithm.name)
    t = cfg.training
    checks = [
        (t.rounds >= 0, "training.rounds must be ≥ 0"),
        (t.local_epochs >= 1, "training.local_epochs must be ≥ 1"),
        (t.batch_size >= 1, "training.batch_size must be ≥ 1"),
        (t.lr > 0, "training.lr must be > 0"),
        (0 < t.participation <= 1, "training.participation must be in (0, 1]"),
        (cfg.data.num_clients >= 1, "data.num_clients must be ≥ 1"),
        (0 < cfg.data.test_fraction < 1, "data.test_fraction must be in (0, 1)"),
        (t.eval_every >= 1, "training.eval_every must be ≥ 1"),
    ]
    for ok, msg in checks:
        if not ok:
            raise ConfigError(f"{source}: {msg}")
