"""FedPeWS's CIFAR-MNIST (Tastan et al., §5.1): CIFAR-10's 10 classes (labels 0..9) and MNIST's 10 digits
(labels 10..19) in one 20-class task. MNIST is upscaled 28×28 -> 32×32 (bilinear) and replicated to 3 channels,
so every sample is (3, 32, 32). Each part keeps its own usual normalization (CIFAR-10 per-channel means/stds,
MNIST 0.1307/0.3081), since that is how each is normally fed to a network.

A balanced subset: 400 train samples per class drawn (seeded) from the official train sets and 200 test samples
per class from the official test sets (8,000 / 4,000 in all; ``cfg.options`` ``pool_train_per_class`` and
``pool_test_per_class`` change these). The 4,000 test samples are the global test set.

Partitions: ``natural`` with N = 2 is FedPeWS's manual split — all CIFAR-10 samples to participant 1, all MNIST
samples to participant 2 (§5.1; Fig. 6's caption swaps the two, which changes nothing but the order). Otherwise
``dirichlet`` (FedPeWS's N ≥ 10), ``pathological`` or ``iid`` over the 8,000 train samples. Roots:
``cfg.options["cifar_root"]`` and ``cfg.options["mnist_root"]``.
"""

from __future__ import annotations

import numpy as np
import torch

from edgemask.errors import ConfigError
from edgemask.trainer.data.base import DATASETS, SIZES, DataConfig, DataSizes, FederatedDataset
from edgemask.trainer.data.cifar import IMAGE_BYTES, cifar10_counts, load_cifar10
from edgemask.trainer.data.clients import clients_with_test_pool
from edgemask.trainer.data.mnist import load_mnist, mnist_counts
from edgemask.trainer.data.partition import partition
from edgemask.trainer.data.transforms import (CIFAR10_MEAN, CIFAR10_STD, MNIST_MEAN, MNIST_STD, normalize, resize,
                                              to_channels)

TRAIN_PER_CLASS = 400
TEST_PER_CLASS = 200


def balanced_subset(labels: np.ndarray, per_class: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """``per_class`` random indices of every class (sorted)."""
    picks = []
    for k in np.unique(labels):
        ik = np.flatnonzero(labels == k)
        if len(ik) < per_class:
            raise ConfigError(f"cifar_mnist: {what} has {len(ik)} samples of class {int(k)}, fewer than the "
                              f"{per_class} per class asked for")
        picks.append(rng.choice(ik, size=per_class, replace=False))
    return np.sort(np.concatenate(picks))


@DATASETS.register("cifar_mnist")
def cifar_mnist(cfg: DataConfig, seed: int) -> FederatedDataset:
    n_tr = int(cfg.options.get("pool_train_per_class", TRAIN_PER_CLASS))
    n_te = int(cfg.options.get("pool_test_per_class", TEST_PER_CLASS))
    rng = np.random.default_rng(seed)
    c_xtr, c_ytr, c_xte, c_yte = load_cifar10(cfg.options.get("cifar_root"), "cifar_mnist", "data.options.cifar_root")
    m_xtr, m_ytr, m_xte, m_yte = load_mnist(cfg.options.get("mnist_root"), "cifar_mnist", "data.options.mnist_root")

    def cifar(images: np.ndarray) -> np.ndarray:  # uint8 (n, 3, 32, 32) -> float32 (n, 3, 32, 32)
        return normalize(images, CIFAR10_MEAN, CIFAR10_STD)

    def digits(images: np.ndarray) -> np.ndarray:  # uint8 (n, 1, 28, 28) -> float32 (n, 3, 32, 32)
        return to_channels(resize(normalize(images, MNIST_MEAN, MNIST_STD), 32), 3)

    parts_x, parts_y = {}, {}
    for split, (cx, cy, mx, my, n) in {"train": (c_xtr, c_ytr, m_xtr, m_ytr, n_tr),
                                        "test": (c_xte, c_yte, m_xte, m_yte, n_te)}.items():
        ci = balanced_subset(cy, n, rng, f"CIFAR-10 {split}")
        mi = balanced_subset(my, n, rng, f"MNIST {split}")
        parts_x[split] = np.concatenate([cifar(cx[ci]), digits(mx[mi])])
        parts_y[split] = np.concatenate([cy[ci], my[mi] + 10])
    x_tr, y_tr, x_te, y_te = parts_x["train"], parts_y["train"], parts_x["test"], parts_y["test"]

    users = None
    if cfg.partition == "natural":
        if cfg.num_clients != 2:
            raise ConfigError(f"cifar_mnist: data.partition 'natural' needs data.num_clients = 2 (CIFAR-10 | "
                              f"MNIST), got {cfg.num_clients}; use dirichlet for other counts")
        parts = [np.flatnonzero(y_tr < 10), np.flatnonzero(y_tr >= 10)]
        users = ["cifar10", "mnist"]
    else:
        parts = partition(y_tr, cfg, rng)
    clients = clients_with_test_pool(x_tr, y_tr, x_te, y_te, parts, cfg, rng, users)
    return FederatedDataset("cifar_mnist", (3, 32, 32), 20, clients,
                            global_test_x=torch.from_numpy(x_te), global_test_y=torch.from_numpy(y_te))


@SIZES.register("cifar_mnist")
def cifar_mnist_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    """20 classes of ``pool_train_per_class`` train and ``pool_test_per_class`` test samples (3, 32, 32); the
    test set shared out and held again as the global one; the natural split's two clients hold 10 classes
    each. Reading holds the raw CIFAR-10 (its train batches twice while they are joined) and MNIST (its files'
    bytes, twice while inflated) and, per split, the float32 samples picked and their concatenation."""
    n_tr = int(cfg.options.get("pool_train_per_class", TRAIN_PER_CLASS))
    n_te = int(cfg.options.get("pool_test_per_class", TEST_PER_CLASS))
    c_tr, c_te = cifar10_counts(cfg.options.get("cifar_root"), "cifar_mnist", "data.options.cifar_root")
    m_tr, m_te, _ = mnist_counts(cfg.options.get("mnist_root"), "cifar_mnist", "data.options.mnist_root")
    picked = 20 * (n_tr + n_te) * 3 * 32 * 32 * 4
    read = (2 * c_tr + c_te) * IMAGE_BYTES + 2 * (m_tr + m_te) * 28 * 28 + 2 * picked
    natural = cfg.partition == "natural"
    return DataSizes((3, 32, 32), 20, 20 * n_tr, n_tr, 2 if natural else cfg.num_clients, test_pool=20 * n_te,
                     global_test=20 * n_te, read=read, largest_part=10 * n_tr if natural else None)
