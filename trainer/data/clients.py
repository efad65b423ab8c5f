"""Turning arrays into clients: pooled partitions, FedSelect's fixed per-class counts, test pools, natural users.

Three ways a builder gets its clients:

- :func:`pooled_clients` — one labelled pool (a dataset's train and test files merged), partitioned by
  ``cfg.partition``, then each client's part split train/test stratified per class (FedMask §4.1: "the test data
  also follows the same distribution as the training data on each device"). With ``cfg.options``
  ``train_per_class`` and ``test_per_class`` it takes exactly that many of each class a client holds instead
  (FedSelect's setting: ``s = classes_per_client`` classes, 20 train / 100 test per class).
- :func:`clients_with_test_pool` — train and test stay separate (a global test set exists, as in FedPeWS): the
  train set is partitioned, and the test set is shared out so each client's test follows its train classes.
- :func:`natural_clients` — one user (writer, subject, role, source dataset) per client.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from edgemask.errors import ConfigError
from edgemask.trainer.data.base import ClientData, DataConfig, client_id
from edgemask.trainer.data.partition import partition, split_like, take_per_class, train_test_split


def fedselect_counts(cfg: DataConfig) -> tuple[int, int] | None:
    """``(train_per_class, test_per_class)`` from ``cfg.options`` when both are set, else None."""
    tr, te = cfg.options.get("train_per_class"), cfg.options.get("test_per_class")
    if tr is None and te is None:
        return None
    if tr is None or te is None or int(tr) < 1 or int(te) < 1:
        raise ConfigError(
            "data.options train_per_class and test_per_class go together and must be >= 1 "
            f"(FedSelect: 20 and 100); got {tr} and {te}"
        )
    return int(tr), int(te)


def _client(i: int, x_tr, y_tr, x_te, y_te, user: str | None = None) -> ClientData:
    return ClientData(client_id(i), torch.as_tensor(x_tr), torch.as_tensor(y_tr),
                      torch.as_tensor(x_te), torch.as_tensor(y_te), user)


def pooled_clients(x: np.ndarray, y: np.ndarray, cfg: DataConfig, seed: int,
                   parts: list[np.ndarray] | None = None) -> tuple[ClientData, ...]:
    """Partition one pool ``x (N, ...)``, ``y (N,)`` and split each client's part into train/test.

    ``parts`` overrides ``cfg.partition`` (for a builder's own manual split). ``cfg.samples_per_client``
    caps a part before the split; FedSelect counts (see :func:`fedselect_counts`) replace the split.
    """
    rng = np.random.default_rng(seed)
    if parts is None:
        parts = partition(y, cfg, rng)
    counts = fedselect_counts(cfg)
    clients = []
    for i, idx in enumerate(parts):
        if counts is not None:
            tr, te = take_per_class(idx, y, *counts, rng, who=client_id(i))
        else:
            if cfg.samples_per_client is not None:
                idx = np.sort(rng.permutation(idx)[: cfg.samples_per_client])
            tr, te = train_test_split(idx, y, cfg.test_fraction, rng)
        clients.append(_client(i, x[tr], y[tr], x[te], y[te]))
    return tuple(clients)


def clients_with_test_pool(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray,
                           parts: list[np.ndarray], cfg: DataConfig, rng: np.random.Generator,
                           users: Sequence[str | None] | None = None) -> tuple[ClientData, ...]:
    """Client c trains on ``x_train[parts[c]]`` (capped at ``cfg.samples_per_client``); the test pool is shared
    out by :func:`split_like` so each client's test follows its train classes."""
    if fedselect_counts(cfg) is not None:
        raise ConfigError(f"data.options train_per_class/test_per_class are not supported by {cfg.name!r}, "
                          "which keeps a global test set; use them with cifar10, mnist or digits")
    if cfg.samples_per_client is not None:
        parts = [np.sort(rng.permutation(p)[: cfg.samples_per_client]) for p in parts]
    test_parts = split_like([y_train[p] for p in parts], y_test, rng)
    users = users if users is not None else [None] * len(parts)
    return tuple(
        _client(i, x_train[p], y_train[p], x_test[q], y_test[q], u)
        for i, (p, q, u) in enumerate(zip(parts, test_parts, users))
    )


def natural_clients(users: Sequence[tuple[str, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
                    ) -> tuple[ClientData, ...]:
    """``users`` = ``(user, train_x, train_y, test_x, test_y)`` in client order; one client each."""
    return tuple(_client(i, xtr, ytr, xte, yte, u) for i, (u, xtr, ytr, xte, yte) in enumerate(users))


def pick_users(users: Sequence[str], cfg: DataConfig, seed: int) -> list[str]:
    """``cfg.num_clients`` users in sorted order (all if fewer), or a seeded random sample with
    ``cfg.options["users"] = "random"`` (FedMask samples 2,414 FEMNIST writers)."""
    ordered = sorted(users)
    how = cfg.options.get("users", "sorted")
    if how == "sorted":
        return ordered[: cfg.num_clients]
    if how == "random":
        rng = np.random.default_rng(seed)
        pick = rng.choice(len(ordered), size=min(cfg.num_clients, len(ordered)), replace=False)
        return [ordered[j] for j in np.sort(pick)]
    raise ConfigError(f"data.options.users must be 'sorted' or 'random', got {how!r}")
