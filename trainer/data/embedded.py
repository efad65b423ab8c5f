"""Datasets that need no download: scikit-learn's bundled digits."""

from __future__ import annotations

import numpy as np
import torch

from trainer.data.base import DATASETS, ClientData, DataConfig, FederatedDataset, client_id
from trainer.data.partition import partition, train_test_split


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


@DATASETS.register("digits")
def digits(cfg: DataConfig, seed: int) -> FederatedDataset:
    """scikit-learn's 1,797 8×8 handwritten digits, pixels scaled to [0, 1], shape (1, 8, 8)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None, :, :]  # (N, 1, 8, 8)
    y = d.target.astype(np.int64)
    return FederatedDataset("digits", (1, 8, 8), 10, split_into_clients(x, y, cfg, seed))
