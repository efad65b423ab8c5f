"""Partitioners: split (labels) across clients. Pure functions over numpy index arrays.

- ``pathological``: each client gets ``classes_per_client`` classes drawn per client (FedMask §4.1 after
  LotteryFL), unbalanced by a balance rate between its classes (FedMask §4.5, Fig. 13), optionally capped.
- ``dirichlet``: class proportions per client drawn from Dir(α) (FedPeWS §5.1).
- ``iid``: a uniform random split.
Natural splits (one writer / subject / role per client) are done by the loaders that know the users.
"""

from __future__ import annotations

import numpy as np

from edgemask.errors import ConfigError


def _draw_classes(classes: np.ndarray, num_clients: int, k: int, rng: np.random.Generator) -> list[list[int]]:
    """Per device, ``k`` distinct classes: the ``k`` least used so far, ties broken at random, in a random order.

    Each device draws its own classes (FedMask §4.1: "this two classes can be varied across devices"), so pairs
    vary from device to device, while picking the least used keeps every class's number of holders within 1 of
    every other's at all times (if the spread is ≤ 1 before a device draws, raising the k lowest keeps it ≤ 1).
    Returns ``num_clients`` lists of ``k`` class labels; a device's first class is its major one.
    """
    used = np.zeros(len(classes), dtype=np.int64)
    out = []
    for _ in range(num_clients):
        tie = rng.random(len(classes))
        pick = np.lexsort((tie, used))[:k]  # fewest holders first, random among equals
        used[pick] += 1
        out.append([int(classes[j]) for j in rng.permutation(pick)])
    return out


def pathological(
    labels: np.ndarray, num_clients: int, classes_per_client: int, rng: np.random.Generator,
    balance_rate: float = 1.0, samples_per_client: int | None = None,
) -> list[np.ndarray]:
    """FedMask §4.1's non-IID split (following LotteryFL [33]): each device holds ``classes_per_client`` classes,
    drawn per device, with unbalanced volumes.

    Classes: :func:`_draw_classes` (pairs vary across devices; every class has the same number of holders ± 1).
    Each class's samples are shuffled and cut into equal shares, one per holder. Volumes, with r =
    ``balance_rate`` the ratio between a minor class's volume and the major one's (FedMask §4.5, Fig. 13):
    uncapped, a device's first (major) class keeps its whole share and every other class ``max(1, round(r·
    share))`` of its own share; with a cap C = ``samples_per_client`` (Table 4: 25 samples per device on
    average for IC-CIFAR10), ``b = min(major share, C / (1 + (k-1)·r))``, each minor class keeps
    ``max(1, round(r·b))`` and the major class ``C - (k-1)·minor`` (at most its share), so a device holds at
    most C. Returns one sorted index array per device, disjoint.
    """
    classes = np.unique(labels)
    k = classes_per_client
    if k > len(classes):
        raise ConfigError(f"data.classes_per_client = {k} but the dataset has only {len(classes)} classes")
    if not 0 < balance_rate <= 1:
        raise ConfigError(f"data.balance_rate must be in (0, 1], got {balance_rate}")
    if samples_per_client is not None and samples_per_client < k:
        raise ConfigError(f"data.samples_per_client = {samples_per_client} is fewer than data.classes_per_client "
                          f"= {k}: a device needs at least one sample of each of its classes")
    assignment = _draw_classes(classes, num_clients, k, rng)
    holders: dict[int, list[int]] = {int(c): [] for c in classes}
    for d, ks in enumerate(assignment):
        for c in ks:
            holders[c].append(d)
    share: dict[tuple[int, int], np.ndarray] = {}  # (device, class) -> that device's share of the class
    for c, hs in holders.items():
        if hs:
            idx = rng.permutation(np.flatnonzero(labels == c))
            share.update({(d, c): chunk for d, chunk in zip(hs, np.array_split(idx, len(hs)))})
    parts = []
    for d, (major, *minors) in enumerate(assignment):
        if samples_per_client is None:
            keep = [share[d, major]] + [share[d, c][:max(1, int(round(len(share[d, c]) * balance_rate)))]
                                        for c in minors]
        else:
            b = min(len(share[d, major]), samples_per_client / (1 + (k - 1) * balance_rate))
            n_minor = max(1, int(round(b * balance_rate)))
            n_major = min(len(share[d, major]), samples_per_client - (k - 1) * n_minor)
            keep = [share[d, major][:n_major]] + [share[d, c][:n_minor] for c in minors]
        parts.append(np.sort(np.concatenate(keep).astype(np.int64)))
    return parts


def dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator,
              min_size: int = 2) -> list[np.ndarray]:
    """Per class, split its samples over clients with proportions ~ Dir(α); redraw until every client has
    at least ``min_size`` samples (the usual practice, e.g. FedLab, FL-bench)."""
    if alpha <= 0:
        raise ConfigError(f"data.alpha must be > 0, got {alpha}")
    classes = np.unique(labels)
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(num_clients)]
        for k in classes:
            idx = rng.permutation(np.flatnonzero(labels == k))
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p) * len(idx)).astype(int)[:-1]
            for c, chunk in enumerate(np.split(idx, cuts)):
                parts[c].extend(chunk.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ConfigError(f"could not draw a Dirichlet(α={alpha}) split giving every one of {num_clients} clients "
                      f"{min_size} samples; lower data.num_clients or raise data.alpha")


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    idx = rng.permutation(len(labels))
    return [np.sort(chunk) for chunk in np.array_split(idx, num_clients)]


PARTITIONERS = ("pathological", "dirichlet", "iid", "natural")  # DataConfig.partition's valid names


def largest_part(cfg, pool: int, largest_class: int, num_classes: int, clients: int) -> int:
    """The most samples :func:`partition` gives one of ``clients`` clients from a pool of ``pool`` samples whose
    most frequent class has ``largest_class``, without partitioning (the memory estimate's bound):

    * pathological: ``classes_per_client`` classes, each class cut into equal shares among its holders, of whom
      :func:`_draw_classes` gives every held class at least ``max(1, ⌊clients·k / classes⌋)`` (fewer classes in
      the pool than ``num_classes`` only adds holders), so at most ``k·⌈largest_class / holders⌉``;
    * iid: ``⌈pool / clients⌉``; dirichlet and any other: the pool.
    """
    if cfg.partition == "pathological":
        k = min(cfg.classes_per_client, max(num_classes, 1))
        holders = max(1, clients * k // max(num_classes, 1))
        return min(pool, k * -(-largest_class // holders))
    if cfg.partition == "iid":
        return -(-pool // max(clients, 1))
    return pool


def partition(labels: np.ndarray, cfg, rng: np.random.Generator) -> list[np.ndarray]:
    """Dispatch on ``cfg.partition`` for datasets without natural users."""
    if cfg.partition == "pathological":
        return pathological(labels, cfg.num_clients, cfg.classes_per_client, rng, cfg.balance_rate,
                            cfg.samples_per_client)
    if cfg.partition == "dirichlet":
        return dirichlet(labels, cfg.num_clients, cfg.alpha, rng)
    if cfg.partition == "iid":
        return iid(labels, cfg.num_clients, rng)
    raise ConfigError(
        f"data.partition {cfg.partition!r} is not available for dataset {cfg.name!r}; "
        f"valid: pathological, dirichlet, iid" + (" (natural needs a dataset with users)" if cfg.partition == "natural" else "")
    )


def train_test_split(idx: np.ndarray, labels: np.ndarray, test_fraction: float,
                     rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Stratified per class, so a client's test split follows its train distribution (FedMask §4.1).
    Every class with ≥ 2 samples gives at least one to each side."""
    train, test = [], []
    for k in np.unique(labels[idx]):
        ik = rng.permutation(idx[labels[idx] == k])
        n_test = int(round(len(ik) * test_fraction))
        if len(ik) >= 2:
            n_test = min(max(n_test, 1), len(ik) - 1)
        test.extend(ik[:n_test].tolist())
        train.extend(ik[n_test:].tolist())
    return np.sort(np.asarray(train, dtype=np.int64)), np.sort(np.asarray(test, dtype=np.int64))


def split_like(train_labels: list[np.ndarray], test_labels: np.ndarray,
               rng: np.random.Generator) -> list[np.ndarray]:
    """Partition a separate test pool so each client's test split follows its train distribution.

    ``train_labels[c]`` are client c's train labels. Each class's test samples are shared, disjointly and in
    full, among the clients that train on that class, in proportion to how many train samples of it they hold
    (so a client with classes {3: 300, 7: 75} gets test samples of 3 and 7 in about that 4:1 ratio).
    Classes no client trains on are left out. Returns indices into ``test_labels``, one sorted array per client.
    """
    counts = [{int(k): int(n) for k, n in zip(*np.unique(t, return_counts=True))} for t in train_labels]
    parts: list[list[int]] = [[] for _ in train_labels]
    for k in np.unique(test_labels):
        k = int(k)
        holders = [c for c, cnt in enumerate(counts) if cnt.get(k, 0) > 0]
        if not holders:
            continue
        idx = rng.permutation(np.flatnonzero(test_labels == k))
        weights = np.array([counts[c][k] for c in holders], dtype=np.float64)
        cuts = np.round(np.cumsum(weights) / weights.sum() * len(idx)).astype(int)[:-1]
        for c, chunk in zip(holders, np.split(idx, cuts)):
            parts[c].extend(chunk.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def take_per_class(idx: np.ndarray, labels: np.ndarray, train_per_class: int, test_per_class: int,
                   rng: np.random.Generator, who: str = "a client") -> tuple[np.ndarray, np.ndarray]:
    """FedSelect's setting (Tamirisa et al., §5): from a client's samples take exactly ``train_per_class``
    train and ``test_per_class`` test samples of every class it holds (20 / 100 in the paper)."""
    train, test = [], []
    need = train_per_class + test_per_class
    for k in np.unique(labels[idx]):
        ik = rng.permutation(idx[labels[idx] == k])
        if len(ik) < need:
            raise ConfigError(
                f"{who} holds {len(ik)} samples of class {int(k)} but data.options train_per_class + "
                f"test_per_class = {need}; lower them or data.num_clients"
            )
        train.extend(ik[:train_per_class].tolist())
        test.extend(ik[train_per_class:need].tolist())
    return np.sort(np.asarray(train, dtype=np.int64)), np.sort(np.asarray(test, dtype=np.int64))
