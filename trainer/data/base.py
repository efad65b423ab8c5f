"""Federated datasets: what every dataset builder returns, and the registry they live in.

A builder turns a :class:`DataConfig` into a :class:`FederatedDataset`: per-client train and test tensors,
already partitioned, deterministic given the seed. Builders never download anything: real datasets are
read from the user's local copies (``DataConfig.root``) in their standard file formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import torch

from edgemask.errors import EdgemaskError
from edgemask.registry import Registry
from edgemask.schema import setting
from edgemask.trainer.data.partition import PARTITIONERS


class DatasetMissingError(EdgemaskError):
    """A real dataset's files are not where the config says; the message names the files and where to put them."""


@dataclass(frozen=True)
class DataConfig:
    """Which dataset, how it is split across clients, and where its files are. Each field's type, default and
    limits are its whole declaration: ``[data]`` is checked against them (:func:`edgemask.schema.schema_of`)."""

    name: str = "digits"
    num_clients: int = setting(10, minimum=1)
    # how the samples are split (trainer/data/partition.py); natural: by user, for datasets that have users
    partition: str = setting("pathological", choices=PARTITIONERS, what="partition")
    classes_per_client: int = setting(2, minimum=1)  # pathological shards
    # pathological: size of the smaller class / the larger one (FedMask Fig. 13)
    balance_rate: float = setting(1.0, above=0, maximum=1)
    alpha: float = setting(0.5, above=0)  # dirichlet concentration
    # per client, stratified so the test split follows the train distribution
    test_fraction: float = setting(0.25, above=0, below=1)
    samples_per_client: int | None = setting(None, minimum=1)  # cap per client (None: use all it gets)
    root: str | None = None  # local directory of a real dataset
    options: dict[str, Any] = field(default_factory=dict)  # builder-specific (e.g. synthetic size)


@dataclass(frozen=True)
class ClientData:
    """One client's local data. ``x`` is float32 ``(N, *input_shape)``; ``y`` is int64 ``(N,)``."""

    client_id: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    user: str | None = None  # the writer / subject / role / source dataset behind a natural split

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])


@dataclass(frozen=True)
class FederatedDataset:
    name: str
    input_shape: tuple[int, ...]  # one sample, without the batch dimension
    num_classes: int
    clients: tuple[ClientData, ...]
    global_test_x: torch.Tensor | None = None  # a shared test set where the paper uses one (FedPeWS)
    global_test_y: torch.Tensor | None = None
    input_dtype: str = "float32"  # "int64" for token inputs (character LSTM)

    def client(self, client_id: str) -> ClientData:
        return self._by_id[client_id]  # KeyError for an unknown id

    @cached_property
    def _by_id(self) -> dict[str, ClientData]:
        return {c.client_id: c for c in self.clients}


Builder = Callable[[DataConfig, int], FederatedDataset]
DATASETS: Registry[Builder] = Registry("dataset")


def client_id(index: int) -> str:
    return f"client-{index:03d}"


def build_dataset(cfg: DataConfig, seed: int) -> FederatedDataset:
    """Look the builder up by name (unknown names list the valid ones) and build."""
    return DATASETS.get(cfg.name)(cfg, seed)
