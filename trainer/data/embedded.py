"""Datasets that need no download: scikit-learn's bundled digits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

from edgemask.trainer.data.base import DATASETS, SIZES, ClientData, DataConfig, DataSizes, FederatedDataset, client_id
from edgemask.trainer.data.partition import partition, train_test_split


def split_into_clients(x: np.ndarray, y: np.ndarray, cfg: DataConfig, seed: int) -> tuple[ClientData, ...]:
    """Partition arrays by ``cfg`` and split each client's part into train/test (stratified)."""
    rng = np.random.default_rng(seed)
    parts = partition(y, cfg, rng)
    clients = []
    for i, idx in enumerate(parts):
        if cfg.samples_per_client is not None:
            idx = np.sort(rng.permutation(idx)[: cfg.samples_per_client])
        tr, te = train_test_split(idx, y, cfg.test_fraction, rng)
        clients.append(ClientData(
            client_id(i),
            torch.from_numpy(x[tr]), torch.from_numpy(y[tr]),
            torch.from_numpy(x[te]), torch.from_numpy(y[te]),
        ))
    return tuple(clients)


def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``(images (1797, 8, 8) float64 in 0..16, targets (1797,) int64)``, exactly
    ``sklearn.datasets.load_digits()``'s ``images`` and ``target``. Read straight from the file scikit-learn ships
    (``datasets/data/digits.csv.gz``: 64 pixels and the label per row) when it is there: importing
    ``sklearn.datasets`` costs ~1.8 s of start-up (SciPy), more than the rest of a small run's set-up."""
    spec = importlib.util.find_spec("sklearn")  # locates the package without importing it
    path = (Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
            if spec is not None and spec.submodule_search_locations else None)
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target.astype(np.int64)
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


@DATASETS.register("digits")
def digits(cfg: DataConfig, seed: int) -> FederatedDataset:
    """scikit-learn's 1,797 8×8 handwritten digits, pixels scaled to [0, 1], shape (1, 8, 8)."""
    images, target = load_digits_arrays()
    x = (images.astype(np.float32) / 16.0)[:, None, :, :]  # (N, 1, 8, 8)
    return FederatedDataset("digits", (1, 8, 8), 10, split_into_clients(x, target, cfg, seed))


@SIZES.register("digits")
def digits_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    """Read (1,797 samples, 0.9 MB): the pool and its largest class as they are. Reading holds scikit-learn's
    float64 rows (65 numbers a sample) and the float32 images beside the clients' tensors."""
    _, target = load_digits_arrays()
    n = len(target)
    return DataSizes((1, 8, 8), 10, n, int(np.bincount(target).max(initial=0)), cfg.num_clients,
                     read=n * (65 * 8 + 64 * 4))
