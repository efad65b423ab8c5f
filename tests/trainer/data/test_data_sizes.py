"""Each dataset's sizes before it is built (trainer.data.base.DataSizes, issue #44): every bound holds for what the
builder then makes, on the loaders' own small files, and the partition's largest part is never under a real one."""

import numpy as np
import pytest
import torch

from edgemask.trainer.data import DataConfig, build_dataset
from edgemask.trainer.data.base import SIZES, data_sizes
from edgemask.trainer.data.partition import largest_part, partition

from test_data_loaders import _femnist_files, write_cifar, write_har, write_leaf, write_medmnist, write_mnist


def held_samples(ds) -> int:
    tests = [ds.global_test_y] if ds.global_test_y is not None else []
    return sum(int(c.train_y.shape[0] + c.test_y.shape[0]) for c in ds.clients) + sum(int(t.shape[0]) for t in tests)


def check(cfg: DataConfig, seed: int = 0):
    """The sizes bound what the builder makes: shapes and classes equal, clients, samples and the largest
    client's training samples at most."""
    sizes = data_sizes(cfg, seed)
    ds = build_dataset(cfg, seed)
    assert sizes.input_shape == ds.input_shape and sizes.num_classes == ds.num_classes
    assert sizes.input_dtype == ds.input_dtype
    assert len(ds.clients) <= sizes.clients
    assert held_samples(ds) <= sizes.held(cfg)
    assert max(c.num_train for c in ds.clients) <= sizes.largest_train(cfg)
    x = ds.clients[0].train_x
    assert sizes.sample_bytes == x[0].numel() * x.element_size() + 8
    return sizes, ds


@pytest.mark.parametrize("kw", [
    dict(num_clients=8), dict(num_clients=3, classes_per_client=3, balance_rate=0.5),
    dict(num_clients=40, samples_per_client=20), dict(num_clients=5, partition="iid"),
    dict(num_clients=6, partition="dirichlet", alpha=0.3),
    dict(num_clients=4, options={"train_per_class": 5, "test_per_class": 5}),
])
def test_digits_sizes_bound_the_built_clients(kw):
    sizes, ds = check(DataConfig(name="digits", **kw))
    assert sizes.pool == 1797 and sizes.largest_class == 183  # digits' 1,797 samples, its largest class (a "3")
    cfg = DataConfig(name="digits", **kw)
    if cfg.partition != "pathological" or kw == dict(num_clients=8):  # every sample goes to a client
        assert held_samples(ds) == sizes.held(cfg)


@pytest.mark.parametrize("kw", [dict(num_clients=2, partition="natural"), dict(num_clients=4, partition="natural"),
                                dict(num_clients=10, partition="dirichlet"),
                                dict(num_clients=6, samples_per_client=50)])
def test_synthetic_sizes_bound_the_built_clients(kw):
    sizes, ds = check(DataConfig(name="synthetic", options={"size": "3.2k"}, **kw))
    assert held_samples(ds) <= sizes.held(DataConfig(name="synthetic", **kw))


def test_file_datasets_sizes_bound_the_built_clients(tmp_path):
    cifar = write_cifar(tmp_path / "cifar", per_batch=30, test=40)
    mnist = write_mnist(tmp_path / "mnist", gz=True)
    check(DataConfig(name="cifar10", root=str(cifar), num_clients=6))
    check(DataConfig(name="cifar10", root=str(cifar), num_clients=20, samples_per_client=5))
    sizes, _ = check(DataConfig(name="mnist", root=str(mnist), num_clients=4))
    assert (sizes.pool, sizes.largest_class) == (80, 8)  # the headers' counts, the labels' largest class
    check(DataConfig(name="cifar_mnist", num_clients=4, partition="dirichlet",
                     options={"cifar_root": str(cifar), "mnist_root": str(mnist), "pool_train_per_class": 2,
                              "pool_test_per_class": 1}))
    med = write_medmnist(tmp_path / "med")
    check(DataConfig(name="medmnist", root=str(med), num_clients=3, partition="natural"))
    check(DataConfig(name="medmnist", root=str(med), num_clients=5, partition="dirichlet",
                     options={"max_train_per_dataset": 20}))
    har = write_har(tmp_path / "har")
    check(DataConfig(name="har", root=str(har), num_clients=2, partition="natural"))
    check(DataConfig(name="har", root=str(har), num_clients=3, partition="iid"))
    check(DataConfig(name="femnist", root=str(_femnist_files(tmp_path / "femnist")), num_clients=2,
                     partition="natural"))
    roles = {"r1": (["a" * 80] * 3, ["b"] * 3), "r2": (["c" * 80] * 2, ["d"] * 2)}
    shakespeare = write_leaf(tmp_path / "shakespeare", {"train": [roles], "test": [roles]})
    check(DataConfig(name="shakespeare", root=str(shakespeare), num_clients=2, partition="natural"))


def test_every_registered_dataset_has_a_size_function():
    from edgemask.trainer.data import DATASETS

    assert set(DATASETS) == set(SIZES)


def test_a_missing_dataset_is_the_loaders_one_line_before_any_read(tmp_path):
    from edgemask.trainer.data import DatasetMissingError

    with pytest.raises(DatasetMissingError, match="data_batch_1 not found"):
        data_sizes(DataConfig(name="cifar10", root=str(tmp_path), num_clients=4), 0)


@pytest.mark.parametrize("seed", range(6))
def test_the_largest_part_bound_holds_for_random_partitions(seed):
    rng = np.random.default_rng(seed)
    classes = int(rng.integers(2, 12))
    labels = rng.integers(0, classes, int(rng.integers(50, 600)))
    for cfg in (DataConfig(num_clients=int(rng.integers(1, 60)), classes_per_client=int(rng.integers(1, classes + 1)),
                           balance_rate=float(rng.uniform(0.1, 1))),
                DataConfig(num_clients=int(rng.integers(1, 60)), partition="iid")):
        parts = partition(labels, cfg, np.random.default_rng(seed))
        bound = largest_part(cfg, len(labels), int(np.bincount(labels).max()), classes, cfg.num_clients)
        assert max(len(p) for p in parts) <= bound
    # pathological, 400 devices of 2 of 10 classes of 6,000: 80 holders a class, 75 a share, 150 a device
    assert largest_part(DataConfig(num_clients=400), 60_000, 6000, 10, 400) == 150


def test_a_dataset_without_a_size_function_is_measured_as_built(monkeypatch):
    from edgemask.trainer.data import base

    monkeypatch.delitem(base.SIZES._entries, "digits")
    cfg = DataConfig(name="digits", num_clients=4)
    sizes = data_sizes(cfg, 0)
    ds = build_dataset(cfg, 0)
    assert sizes.held(cfg) == held_samples(ds) and sizes.largest_train(cfg) == max(c.num_train for c in ds.clients)
    assert torch.is_tensor(ds.clients[0].train_x)
