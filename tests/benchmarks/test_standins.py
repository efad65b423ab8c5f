"""benchmarks/standins.py: the stand-ins, at a few users, read by the repository's own loaders with the shapes,
classes and users the real datasets have, each user's counts as LEAF splits them, and a pattern to learn."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import standins  # noqa: E402

from edgemask.trainer.data import build_dataset  # noqa: E402
from edgemask.trainer.data.base import SIZES, DataConfig  # noqa: E402


def natural(name, root, clients=100, **kw):
    return DataConfig(name=name, num_clients=clients, partition="natural", root=str(root), **kw)


def test_sample_counts_sum_to_users_times_mean_each_at_least_the_minimum():
    rng = np.random.default_rng(0)
    counts = standins.sample_counts(2414, 232.8, rng, 10, 4.0)
    assert counts.sum() == 561_979 and counts.min() >= 10 and len(counts) == 2414  # round(2414 × 232.8)
    assert 150 < np.median(counts) < 232.8 < counts.max()  # spread around the mean, skewed right
    assert standins.sample_counts(4, 10, rng, 10, 4.0).tolist() == [10, 10, 10, 10]  # nothing left to spread
    with pytest.raises(ValueError, match="exceed"):
        standins.sample_counts(4, 9.5, rng, 10, 4.0)


def test_pixels_are_leaf_json_floats():
    q = np.array([[0, 100, 51], [7, 30, 99]])
    assert json.loads(standins.pixels_json(q)) == [[0.0, 1.0, 0.51], [0.07, 0.3, 0.99]]
    assert json.loads(standins.pixels_json(q[:0])) == []


def test_femnist_standin_is_read_by_the_leaf_loader(tmp_path):
    root = standins.write_femnist(tmp_path / "femnist", users=5, mean_samples=40, users_per_file=2)
    files = {split: sorted(p.name for p in (root / split).iterdir()) for split in ("train", "test")}
    assert files["train"] == [f"all_data_{i}_niid_0_keep_0_train_9.json" for i in range(3)]  # 2 + 2 + 1 writers
    assert files["test"] == [f"all_data_{i}_niid_0_keep_0_test_9.json" for i in range(3)]
    first = json.loads((root / "train" / files["train"][0]).read_text())
    assert first["stand_in"].startswith("STAND-IN") and first["users"] == ["standin_f0000", "standin_f0001"]
    marker = json.loads((root / "STANDIN.json").read_text())
    assert marker["parameters"]["kind"] == "femnist" and marker["train"] + marker["test"] == 200

    ds = build_dataset(natural("femnist", root), 0)
    assert (ds.input_shape, ds.num_classes, len(ds.clients)) == ((1, 28, 28), 62, 5)
    test_counts = {}
    for f in files["test"]:
        d = json.loads((root / "test" / f).read_text())
        test_counts.update(zip(d["users"], d["num_samples"]))
    for c in ds.clients:  # LEAF's split: max(1, ⌊0.9 n⌋) of a writer's n samples train
        n = c.num_train + test_counts[c.user]
        assert c.num_train == max(1, int(0.9 * n)) and c.test_y.shape[0] == test_counts[c.user]
        assert tuple(c.train_x.shape[1:]) == (1, 28, 28) and 0 <= float(c.train_x.min()) <= float(c.train_x.max()) <= 1
    assert sum(c.num_train + c.test_y.shape[0] for c in ds.clients) == 200
    random = build_dataset(natural("femnist", root, clients=2, options={"users": "random"}), 0)
    assert len(random.clients) == 2  # the IC-EMNIST config's seeded sample of writers
    sizes = SIZES.get("femnist")(natural("femnist", root), 0)  # the memory estimate reads them too
    assert sizes.input_shape == (1, 28, 28) and sizes.num_classes == 62


def test_femnist_classes_are_learnable(tmp_path):
    """Each class's glyph shows through the noise: the nearest train class mean names the test samples."""
    ds = build_dataset(natural("femnist", standins.write_femnist(tmp_path, users=3, mean_samples=400)), 0)
    x = np.concatenate([c.train_x.numpy().reshape(-1, 784) for c in ds.clients])
    y = np.concatenate([c.train_y.numpy() for c in ds.clients])
    xt = np.concatenate([c.test_x.numpy().reshape(-1, 784) for c in ds.clients])
    yt = np.concatenate([c.test_y.numpy() for c in ds.clients])
    seen = np.unique(y)
    means = np.stack([x[y == k].mean(0) for k in seen])
    keep = np.isin(yt, seen)
    guess = seen[np.argmin(((xt[keep, None, :] - means[None]) ** 2).sum(-1), axis=1)]
    assert keep.sum() > 50 and (guess == yt[keep]).mean() > 0.9


def test_shakespeare_standin_is_read_by_the_leaf_loader(tmp_path):
    root = standins.write_shakespeare(tmp_path, users=5, mean_samples=50, users_per_file=2)
    ds = build_dataset(natural("shakespeare", root), 0)
    assert (ds.input_shape, ds.num_classes, len(ds.clients), ds.input_dtype) == ((80,), 80, 5, "int64")
    assert sum(c.num_train + c.test_y.shape[0] for c in ds.clients) == 250
    c = ds.clients[0]
    x, y = c.train_x.numpy(), c.train_y.numpy()
    assert x.shape == (c.num_train, 80)
    assert (x[1:, :-1] == x[:-1, 1:]).all() and (y[:-1] == x[1:, -1]).all()  # LEAF's sliding windows
    first = build_dataset(natural("shakespeare", root, clients=2), 0)  # the NCP config's roles in sorted order
    assert [c.user for c in first.clients] == ["STANDIN_PLAY_00_ROLE_0000", "STANDIN_PLAY_00_ROLE_0001"]


def test_har_standin_is_read_by_the_uci_loader(tmp_path):
    root = standins.write_har(tmp_path, users=4, mean_samples=40)
    assert sorted(set((root / "test" / "subject_test.txt").read_text().split())) == ["2", "4"]  # UCI's test subjects
    ds = build_dataset(natural("har", root), 0)
    assert (ds.input_shape, ds.num_classes) == ((561,), 6)
    assert [c.user for c in ds.clients] == ["subject-01", "subject-02", "subject-03", "subject-04"]
    assert sum(c.num_train + c.test_y.shape[0] for c in ds.clients) == 160
    x = np.concatenate([c.train_x.numpy() for c in ds.clients])
    y = np.concatenate([c.train_y.numpy() for c in ds.clients])
    assert x.min() >= -1 and x.max() <= 1 and set(np.unique(y)) == set(range(6))
    assert SIZES.get("har")(natural("har", root), 0).largest_part == max(c.num_train + c.test_y.shape[0]
                                                                        for c in ds.clients)


def test_a_complete_standin_is_reused_and_other_parameters_rewrite_it(tmp_path):
    root = standins.write_har(tmp_path / "har", users=3, mean_samples=30)
    stamp = (root / "STANDIN.json").stat().st_mtime_ns
    assert standins.write_har(root, users=3, mean_samples=30) == root
    assert (root / "STANDIN.json").stat().st_mtime_ns == stamp
    standins.write_har(root, users=3, mean_samples=40)
    assert json.loads((root / "STANDIN.json").read_text())["parameters"]["mean_samples"] == 40
    assert sorted(p.name for p in tmp_path.iterdir()) == ["har"]  # no temporary left beside it
    named = standins.standin("har", tmp_path, standins.Size(3, 30))
    assert named.name == "har-3x30-s0"
    with pytest.raises(ValueError, match="no stand-in 'mnist'; there are: cifar10, femnist, har, shakespeare"):
        standins.standin("mnist", tmp_path)


def test_a_foreign_directory_is_not_replaced(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not a stand-in")
    with pytest.raises(Exception, match="is not a stand-in dataset"):
        standins.write_har(tmp_path / "mine", users=3, mean_samples=30)
    assert (tmp_path / "mine" / "notes.txt").is_file()
