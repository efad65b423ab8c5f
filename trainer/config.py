"""Training configuration: frozen dataclasses loaded from TOML and validated once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgemask.schema import Field, Table
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
        """Read and check a config table: every mistake one line, ``<source>: [section] field: what; what to do``
        (:mod:`edgemask.schema`)."""
        top = Table(source, "", d, {name: Field(dict, {}) for name in _SECTIONS})
        kw = {name: typ(**Table(source, name, _unset_dropped(typ, top[name]), _SCHEMAS[name]).values())
              for name, typ in _SECTIONS.items()}
        cfg = cls(**kw)
        _validate(cfg, source)
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(read_toml(path), str(path))

    def replace(self, **sections: Any) -> "TrainConfig":
        return dataclasses.replace(self, **sections)


def _unset_dropped(typ: type, raw: Any) -> Any:
    """A section without the fields that are None where None is the default ("not set": ``to_dict()`` writes
    them so; TOML itself has no None)."""
    if not isinstance(raw, dict):
        return raw
    unset = {f.name for f in dataclasses.fields(typ) if f.default is None}
    return {k: v for k, v in raw.items() if not (v is None and k in unset)}


def _below_one(value: float) -> str | None:
    return None if value < 1 else f"{value!r} is out of range; use a value between 0 and 1, both excluded"


_SECTIONS: dict[str, type] = {"run": RunConfig, "data": DataConfig, "model": ModelConfig,
                              "algorithm": AlgorithmConfig, "training": TrainingConfig}
# Each section's fields, their types and ranges; defaults stay the dataclasses' (a field left out keeps it).
_SCHEMAS: dict[str, dict[str, Field]] = {
    "run": {"seed": Field(int), "run_id": Field(str)},
    "data": {"name": Field(str), "num_clients": Field(int, minimum=1), "partition": Field(str),
             "classes_per_client": Field(int, minimum=1), "balance_rate": Field(float, above=0, maximum=1),
             "alpha": Field(float, above=0), "test_fraction": Field(float, above=0, check=_below_one),
             "samples_per_client": Field(int, minimum=1), "root": Field(str), "options": Field(dict)},
    "model": {"name": Field(str), "args": Field(dict)},
    "algorithm": {"name": Field(str), "args": Field(dict)},
    # rounds >= 1: a run of 0 rounds has no trained clients to export (issue #27: `--rounds 0` wrote an empty run)
    "training": {"rounds": Field(int, minimum=1), "local_epochs": Field(int, minimum=1),
                 "batch_size": Field(int, minimum=1), "lr": Field(float, above=0),
                 "momentum": Field(float, minimum=0), "weight_decay": Field(float, minimum=0),
                 "participation": Field(float, above=0, maximum=1), "eval_every": Field(int, minimum=1),
                 "device": Field(str), "batched": Field(bool), "target_accuracy": Field(float, above=0, maximum=1)},
}


def _validate(cfg: TrainConfig, source: str) -> None:
    from trainer.algorithms import ALGORITHMS
    from trainer.data import DATASETS
    from trainer.models import MODELS

    # it becomes runs/<run-id>: never a path out of runs/ (and "" is a mistake, not the default id)
    check_name(cfg.run_id if cfg.run.run_id is None else cfg.run.run_id, f"{source}: run.run_id")
    DATASETS.get(cfg.data.name)
    MODELS.get(cfg.model.name)
    ALGORITHMS.get(cfg.algorithm.name)
