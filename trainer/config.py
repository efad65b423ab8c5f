"""Training configuration: frozen dataclasses loaded from TOML and validated once.

Each setting is declared once, on its dataclass field: its type (the annotation), its default and its limits
(:func:`edgemask.schema.setting`). The TOML tables' schemas are derived from the dataclasses
(:func:`edgemask.schema.schema_of`); ``[algorithm.args]`` from the algorithm's ``Args`` dataclass
(:func:`edgemask.trainer.algorithms.base.parse_args`) and ``[model.args]`` from the model builder's signature
(:func:`edgemask.trainer.models.registry.check_model_args`), all in the one wording of :mod:`edgemask.schema`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgemask.schema import Field, Table, read_dataclass, schema_of, setting
from edgemask.tomlio import dumps_toml, read_toml
from edgemask.workspace import check_name
from edgemask.trainer.data.base import DataConfig
from edgemask.trainer.devices import device_problem
from edgemask.trainer.system import SystemConfig


@dataclass(frozen=True)
class ModelConfig:
    """``args``: the model builder's keyword arguments, checked against its signature when the config is read."""

    name: str = "mlp"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AlgorithmConfig:
    """``args`` are the algorithm's own hyperparameters (e.g. FedMask's ``prune_rate``), declared (type, default,
    limits) on its ``Args`` dataclass and checked against it when the config is read."""

    name: str = "fedavg"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainingConfig:
    # rounds >= 1: a run of 0 rounds has no trained clients to export (issue #27: `--rounds 0` wrote an empty run)
    rounds: int = setting(20, minimum=1)
    local_epochs: int = setting(1, minimum=1)
    batch_size: int = setting(16, minimum=1)
    lr: float = setting(0.05, above=0)
    momentum: float = setting(0.0, minimum=0)
    weight_decay: float = setting(0.0, minimum=0)
    # fraction of clients sampled per round (FedMask's K): trainer.sampling.clients_per_round of them
    participation: float = setting(1.0, above=0, maximum=1)
    eval_every: int = setting(1, minimum=1)
    device: str = setting("cpu", check=device_problem)
    batched: bool = True  # train a round's clients together (trainer.batched); false: one after another, the reference
    # υ: report rounds until the global model reaches it (FedPeWS Table 2)
    target_accuracy: float | None = setting(None, above=0, maximum=1)
    # a run whose every client has collapsed at the last evaluation (a masked layer with no live unit, the output
    # the same for every input) makes `edgemask train` exit 3; true accepts it (`--allow-collapse`)
    allow_collapse: bool = setting(False)
    # an epoch's last minibatch of one sample, in a model whose batch norm then sees one value per channel (VGG16's
    # conv11-13 on FEMNIST's 28x28): "drop" leaves that sample out of the epoch, "keep" trains on it (torch refuses
    # it in training mode), "auto" drops it only for such a model (trainer.algorithms.base.one_sample_rule)
    one_sample_batch: str = setting("auto", choices=("auto", "drop", "keep"))


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
    system: SystemConfig | None = None  # [system]: rounds with deadlines on measured board costs (trainer.system)

    @property
    def run_id(self) -> str:
        return self.run.run_id or f"{self.data.name}-{self.algorithm.name}-{self.model.name}-s{self.run.seed}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["run"]["run_id"] = self.run_id
        d.pop("system")  # a run without [system] writes the config it always wrote
        if self.system is not None:
            d["system"] = self.system.to_dict()
        return d

    def to_toml(self) -> str:
        return dumps_toml(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> "TrainConfig":
        """Read and check a config table: every mistake one line, ``<source>: [section] field: what; what to do``
        (:mod:`edgemask.schema`)."""
        top = Table(source, "", d, {name: Field(dict, {}) for name in (*_SECTIONS, "system")})
        kw = {name: read_dataclass(source, name, top[name], typ) for name, typ in _SECTIONS.items()}
        system = SystemConfig.read(source, top["system"]) if "system" in d else None
        cfg = cls(**kw, system=system)
        _validate(cfg, source)
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(read_toml(path), str(path))

    def replace(self, **sections: Any) -> "TrainConfig":
        return dataclasses.replace(self, **sections)


_SECTIONS: dict[str, type] = {"run": RunConfig, "data": DataConfig, "model": ModelConfig,
                              "algorithm": AlgorithmConfig, "training": TrainingConfig}
# Each section's fields, their types, defaults and ranges: derived from the dataclasses, declared nowhere else.
_SCHEMAS: dict[str, dict[str, Field]] = {name: schema_of(typ) for name, typ in _SECTIONS.items()}


def _validate(cfg: TrainConfig, source: str) -> None:
    from edgemask.trainer.algorithms import ALGORITHMS
    from edgemask.trainer.algorithms.base import parse_args
    from edgemask.trainer.data import DATASETS
    from edgemask.trainer.models import MODELS
    from edgemask.trainer.models.registry import check_model_args

    # it becomes runs/<run-id>: never a path out of runs/ (and "" is a mistake, not the default id)
    check_name(cfg.run_id if cfg.run.run_id is None else cfg.run.run_id, f"{source}: run.run_id")
    DATASETS.get(cfg.data.name)
    MODELS.get(cfg.model.name)
    ALGORITHMS.get(cfg.algorithm.name)
    parse_args(ALGORITHMS.get(cfg.algorithm.name).Args, cfg.algorithm.args, cfg.algorithm.name, source)
    check_model_args(cfg.model.name, cfg.model.args, source)
