"""Partitioners and splits: pathological classes and balance rate, Dirichlet concentration, stratified splits,
test pools that follow the train distribution, FedSelect's fixed per-class counts."""

import numpy as np
import pytest

from edgemask.errors import ConfigError
from edgemask.trainer.data.partition import dirichlet, pathological, split_like, take_per_class, train_test_split


def _labels(num_classes=10, per_class=100):
    return np.repeat(np.arange(num_classes), per_class)


def _class_fractions(labels, part, num_classes):
    return np.bincount(labels[part], minlength=num_classes) / len(part)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_pathological_gives_exactly_k_classes_per_client(k):
    y = _labels()
    parts = pathological(y, num_clients=10, classes_per_client=k, rng=np.random.default_rng(0))
    assert [len(np.unique(y[p])) for p in parts] == [k] * 10
    every = np.concatenate(parts)
    assert len(np.unique(every)) == len(every)  # disjoint


def test_pathological_balance_rate_is_the_ratio_between_a_clients_classes():
    y = _labels(per_class=200)
    # 10 clients × 2 classes over 10 classes: every class has 2 holders with 100 samples each; the first class
    # of a client keeps 100, the second keeps 100 × 0.25 = 25.
    parts = pathological(y, 10, 2, np.random.default_rng(1), balance_rate=0.25)
    for p in parts:
        counts = np.sort(np.bincount(y[p])[np.unique(y[p])])
        assert counts.tolist() == [25, 100]
    balanced = pathological(y, 10, 2, np.random.default_rng(1), balance_rate=1.0)
    assert all(np.bincount(y[p])[np.unique(y[p])].tolist() == [100, 100] for p in balanced)


def _classes(y, parts):
    return [tuple(sorted(np.unique(y[p]).tolist())) for p in parts]


def test_pathological_pairs_vary_across_devices_and_classes_are_used_equally():
    # FedMask §4.1 / Table 4: 400 devices, 2 of CIFAR-10's 10 classes each. Dealing the classes round-robin over
    # one shuffled order gave 5 distinct pairs (5 groups of 80 identical devices); drawn per device, the pairs
    # cover almost all of the C(10, 2) = 45.
    y = _labels(per_class=6000)
    parts = pathological(y, 400, 2, np.random.default_rng(0), balance_rate=0.5)
    pairs = _classes(y, parts)
    assert all(len(set(p)) == 2 for p in pairs)
    assert len(set(pairs)) >= 40
    # every class has the same number of holders ± 1 (here 400 × 2 / 10 = 80 exactly), also when it does not divide
    assert np.bincount(np.concatenate(pairs), minlength=10).tolist() == [80] * 10
    uneven = np.bincount(np.concatenate(_classes(y, pathological(y, 37, 3, np.random.default_rng(5)))),
                         minlength=10)
    assert uneven.sum() == 111 and uneven.max() - uneven.min() <= 1


def test_pathological_volumes_are_unbalanced_by_the_balance_rate():
    # 4 classes × 12 samples, 4 devices × 2 classes: every class has 2 holders, a share of 6 each. The major
    # class keeps its 6, the minor one round(6 × 0.5) = 3; the major class of each device is a different class
    # only by chance, but each device holds one class 6 times and the other 3 times.
    y = _labels(num_classes=4, per_class=12)
    parts = pathological(y, 4, 2, np.random.default_rng(3), balance_rate=0.5)
    assert [sorted(np.bincount(y[p])[np.unique(y[p])].tolist()) for p in parts] == [[3, 6]] * 4
    every = np.concatenate(parts)
    assert len(np.unique(every)) == len(every)  # disjoint


def test_pathological_cap_keeps_the_balance_rate():
    # cap C = 7, r = 0.5: b = min(6, 7 / 1.5) = 4.67, minor round(2.33) = 2, major 7 - 2 = 5.
    y = _labels(num_classes=4, per_class=12)
    parts = pathological(y, 4, 2, np.random.default_rng(3), balance_rate=0.5, samples_per_client=7)
    assert [sorted(np.bincount(y[p])[np.unique(y[p])].tolist()) for p in parts] == [[2, 5]] * 4
    # IC-CIFAR10 (Table 4: 25 samples per device): 400 devices, r = 0.5 -> 17 + 8 on every device
    y = _labels(per_class=6000)
    parts = pathological(y, 400, 2, np.random.default_rng(0), balance_rate=0.5, samples_per_client=25)
    assert {tuple(sorted(np.bincount(y[p])[np.unique(y[p])].tolist())) for p in parts} == {(8, 17)}
    with pytest.raises(ConfigError, match="samples_per_client = 1 is fewer"):
        pathological(y, 4, 2, np.random.default_rng(0), samples_per_client=1)


def test_pathological_is_deterministic_by_seed():
    y = _labels(per_class=300)
    a, b = (pathological(y, 50, 2, np.random.default_rng(7), 0.5, 20) for _ in range(2))
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    c = pathological(y, 50, 2, np.random.default_rng(8), 0.5, 20)
    assert _classes(y, a) != _classes(y, c)


def test_pathological_rejects_more_classes_than_exist():
    with pytest.raises(ConfigError, match="classes_per_client"):
        pathological(_labels(num_classes=3), 4, 5, np.random.default_rng(0))


def test_dirichlet_huge_alpha_is_nearly_uniform_and_tiny_alpha_concentrated():
    y = _labels(per_class=1000)
    flat = dirichlet(y, 10, alpha=1e5, rng=np.random.default_rng(0))
    fr = np.stack([_class_fractions(y, p, 10) for p in flat])  # (clients, classes)
    assert np.abs(fr - 0.1).max() < 0.02
    assert np.ptp([len(p) for p in flat]) < 0.05 * len(y) / 10 * 2

    peaked = dirichlet(y, 10, alpha=0.01, rng=np.random.default_rng(0))
    # share of each class held by the client holding most of it: ~1 for tiny α, ~1/10 for huge α
    share = lambda parts: np.stack([np.bincount(y[p], minlength=10) for p in parts]).max(axis=0) / 1000
    assert share(peaked).mean() > 0.95
    assert share(flat).max() < 0.12
    assert sum(len(p) for p in peaked) == len(y)


def test_stratified_split_keeps_every_class_on_both_sides():
    y = np.array([0] * 2 + [1] * 3 + [2] * 40 + [3] * 7)
    idx = np.arange(len(y))
    tr, te = train_test_split(idx, y, 0.25, np.random.default_rng(0))
    assert set(y[tr]) == set(y[te]) == {0, 1, 2, 3}
    assert np.bincount(y[te]).tolist() == [1, 1, 10, 2]  # round(n × 0.25), at least 1, at most n - 1
    assert sorted(np.concatenate([tr, te]).tolist()) == idx.tolist()


def test_split_like_shares_each_class_in_proportion_to_train_holdings():
    test_y = np.repeat(np.arange(3), 100)
    train_labels = [np.array([0] * 300 + [1] * 75), np.array([0] * 100 + [2] * 10), np.array([2] * 10)]
    parts = split_like(train_labels, test_y, np.random.default_rng(0))
    counts = [np.bincount(test_y[p], minlength=3).tolist() for p in parts]
    assert counts == [[75, 100, 0], [25, 0, 50], [0, 0, 50]]
    every = np.concatenate(parts)
    assert len(np.unique(every)) == len(every) == 300


def test_take_per_class_is_fedselects_twenty_train_hundred_test():
    y = np.repeat(np.arange(4), 150)
    idx = np.flatnonzero(y < 2)
    tr, te = take_per_class(idx, y, 20, 100, np.random.default_rng(0))
    assert np.bincount(y[tr]).tolist() == [20, 20]
    assert np.bincount(y[te]).tolist() == [100, 100]
    assert not set(tr) & set(te)
    with pytest.raises(ConfigError, match="holds 150 samples of class 0"):
        take_per_class(idx, y, 100, 100, np.random.default_rng(0))
