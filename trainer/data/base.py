"""Federated datasets: what every dataset builder returns, and the registry they live in.

A builder turns a :class:`DataConfig` into a :class:`FederatedDataset`: per-client train and test tensors,
already partitioned, deterministic given the seed. Builders never download anything: real datasets are
read from the user's local copies (``DataConfig.root``) in their standard file formats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

import torch

from edgemask.errors import EdgemaskError
from edgemask.registry import Registry
from edgemask.schema import setting
from edgemask.trainer.data.partition import PARTITIONERS, largest_part


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


@dataclass(frozen=True)
class DataSizes:
    """What a dataset's clients will hold, known before any of them is built: ``edgemask train`` checks the run's
    memory from these (:mod:`edgemask.trainer.footprint`) before it partitions the data or builds a model. Every
    count is an upper bound, taken from the config, the dataset's fixed sizes, a file's header or its length;
    a size function never partitions. Samples are ``input_dtype`` tensors of ``input_shape`` with an int64 label.

    How the clients share the samples out: the partition gives each client a part of the ``pool`` (train and test
    both, capped per client by ``samples_per_client`` or FedSelect's counts); a separate ``test_pool`` is shared out
    in full besides it (:func:`~edgemask.trainer.data.clients.clients_with_test_pool`), and a ``global_test`` set is
    held as a tensor of its own."""

    input_shape: tuple[int, ...]
    num_classes: int
    pool: int  # samples the partition shares out, at most
    largest_class: int  # samples of the pool's most frequent class, at most
    clients: int  # clients the builder makes, at most
    test_pool: int = 0
    global_test: int = 0
    read: int = 0  # bytes the builder holds while it reads, besides the clients' tensors, at most
    input_dtype: str = "float32"
    largest_part: int | None = None  # a natural split's largest client, where the size function knows it
    per_class_counts: bool = False  # the builder takes FedSelect's counts (data.options) when they are set

    @property
    def sample_bytes(self) -> int:
        """One sample's bytes: its input and its int64 label."""
        return math.prod(self.input_shape) * torch.empty((), dtype=getattr(torch, self.input_dtype)).element_size() + 8

    def per_client_cap(self, cfg: DataConfig) -> int | None:
        """The most samples of the pool one client takes whatever the partition: FedSelect's counts (its classes
        × (train + test) per class, where the builder takes them) or ``samples_per_client``; None when neither
        is set."""
        tr, te = cfg.options.get("train_per_class"), cfg.options.get("test_per_class")
        if self.per_class_counts and tr is not None and te is not None:
            return cfg.classes_per_client * (int(tr) + int(te))
        return cfg.samples_per_client

    def held(self, cfg: DataConfig) -> int:
        """Samples the clients' tensors and the global test set hold in all, at most: the parts are disjoint, so
        the pool at most, or the clients' caps; the test pool and the global test set in full."""
        cap = self.per_client_cap(cfg)
        pool = self.pool if cap is None else min(self.pool, self.clients * cap)
        return pool + self.test_pool + self.global_test

    def largest_train(self, cfg: DataConfig) -> int:
        """The most training samples one client holds, at most (the minibatch and the engine's padding): a
        natural split's largest client where known, else the partition's largest part
        (:func:`~edgemask.trainer.data.partition.largest_part`), within the per-client cap."""
        if self.largest_part is not None:
            part = self.largest_part
        else:
            part = largest_part(cfg, self.pool, self.largest_class, self.num_classes, self.clients)
        cap = self.per_client_cap(cfg)
        return part if cap is None else min(part, cap)


Sizer = Callable[[DataConfig, int], DataSizes]
SIZES: Registry[Sizer] = Registry("dataset size function")


def client_id(index: int) -> str:
    return f"client-{index:03d}"


def build_dataset(cfg: DataConfig, seed: int) -> FederatedDataset:
    """Look the builder up by name (unknown names list the valid ones) and build."""
    return DATASETS.get(cfg.name)(cfg, seed)


def data_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    """The sizes of ``cfg``'s dataset before it is built, by the size function registered beside its builder
    (``SIZES``, the dataset's name). A dataset registered without one (a user's own) is built to be measured:
    its partition then comes before the memory check, which is why every dataset here has one."""
    if cfg.name in SIZES:
        return SIZES.get(cfg.name)(cfg, seed)
    ds = build_dataset(cfg, seed)
    tests = [ds.global_test_y] if ds.global_test_y is not None else []
    samples = sum(int(c.train_y.shape[0] + c.test_y.shape[0]) for c in ds.clients) + sum(int(t.shape[0])
                                                                                           for t in tests)
    largest = max((c.num_train for c in ds.clients), default=0)
    # every sample as held (test_pool: no cap applies), the largest client as built
    return DataSizes(ds.input_shape, ds.num_classes, 0, 0, len(ds.clients), test_pool=samples,
                     input_dtype=ds.input_dtype, largest_part=largest)
