"""Real-dataset loaders, each on small files written in exactly the dataset's standard format."""

import gzip
import json
import pickle
import struct

import numpy as np
import pytest
import torch

from edgemask.errors import ConfigError, CorruptFileError
from edgemask.trainer.data import DataConfig, DatasetMissingError, build_dataset
from edgemask.trainer.data.leaf import ALL_LETTERS

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


# ---- writers: the standard formats -------------------------------------------------------------------------

def write_cifar(directory, per_batch=20, test=20):
    """cifar-10-batches-py: pickled dicts with b"data" (N, 3072) uint8 row-major R, G, B planes and b"labels".
    Image i of a batch has label i % 10 and constant planes R = 10 + label, G = 100 + label, B = 200 + label."""
    directory.mkdir(parents=True, exist_ok=True)

    def batch(n, name):
        labels = [i % 10 for i in range(n)]
        data = np.stack([np.repeat(np.array([10 + k, 100 + k, 200 + k], np.uint8), 1024) for k in labels])
        d = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
             b"filenames": [f"img_{i}.png".encode() for i in range(n)]}
        with open(directory / name, "wb") as f:
            pickle.dump(d, f, protocol=2)

    for i in range(1, 6):
        batch(per_batch, f"data_batch_{i}")
    batch(test, "test_batch")
    return directory


def write_idx(path, array):
    """IDX: 0x00 0x00, type 0x08 (ubyte), ndim, big-endian uint32 dims, then the bytes."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    raw = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(raw)
    else:
        path.write_bytes(raw)


def write_mnist(directory, n_train=50, n_test=30, gz=False):
    """Image i has label i % 10 and every pixel = 3 × label."""
    directory.mkdir(parents=True, exist_ok=True)
    ext = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        labels = np.arange(n) % 10
        write_idx(directory / f"{prefix}-images-idx3-ubyte{ext}", np.repeat(3 * labels, 784).reshape(n, 28, 28))
        write_idx(directory / f"{prefix}-labels-idx1-ubyte{ext}", labels)
    return directory


def write_leaf(directory, files):
    """LEAF: {split: [ {user: (x, y)} per file ]} -> split/all_data_<i>_niid_0_keep_0_<split>_9.json."""
    for split, per_file in files.items():
        (directory / split).mkdir(parents=True, exist_ok=True)
        for i, users in enumerate(per_file):
            doc = {"users": list(users), "num_samples": [len(v[1]) for v in users.values()],
                   "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}
            (directory / split / f"all_data_{i}_niid_0_keep_0_{split}_9.json").write_text(json.dumps(doc))
    return directory


def write_har(directory, subjects_train=(1, 3), subjects_test=(2,), per_subject=14):
    """UCI HAR text: 561 features per line in '%.7e' with leading spaces; feature 0 = subject, feature 1 = the
    activity; activities 1..6 cycle per subject."""
    for split, subjects in (("train", subjects_train), ("test", subjects_test)):
        (directory / split).mkdir(parents=True, exist_ok=True)
        xs, ys, ss = [], [], []
        for s in subjects:
            for j in range(per_subject):
                act = j % 6 + 1
                feats = np.full(561, 0.25)
                feats[0], feats[1] = s, act
                xs.append("".join(f" {v: .7e}" for v in feats))
                ys.append(str(act)), ss.append(str(s))
        (directory / split / f"X_{split}.txt").write_text("\n".join(xs) + "\n")
        (directory / split / f"y_{split}.txt").write_text("\n".join(ys) + "\n")
        (directory / split / f"subject_{split}.txt").write_text("\n".join(ss) + "\n")
    return directory


def write_medmnist(directory, n_train=27, n_test=18):
    """MedMNIST .npz: *_images uint8 (N, 28, 28[, 3]), *_labels (N, 1). PathMNIST pixels (R, G, B) = (30, 60, 90);
    grayscale pixels = 5 × label."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, k, rgb in (("pathmnist", 9, True), ("octmnist", 4, False), ("tissuemnist", 8, False)):
        arrays = {}
        for split, n in (("train", n_train), ("val", 4), ("test", n_test)):
            labels = (np.arange(n) % k).reshape(n, 1)
            if rgb:
                images = np.broadcast_to(np.array([30, 60, 90], np.uint8), (n, 28, 28, 3)).copy()
            else:
                images = np.repeat(5 * labels, 784).reshape(n, 28, 28).astype(np.uint8)
            arrays[f"{split}_images"], arrays[f"{split}_labels"] = images, labels.astype(np.uint8)
        np.savez_compressed(directory / f"{name}.npz", **arrays)
    return directory


# ---- CIFAR-10 ------------------------------------------------------------------------------------------------

def test_cifar10_shapes_channel_normalization_and_two_classes_per_client(tmp_path):
    root = write_cifar(tmp_path / "cifar-10-batches-py")
    cfg = DataConfig(name="cifar10", num_clients=5, classes_per_client=2, root=str(tmp_path))  # finds the subdir
    ds = build_dataset(cfg, 0)
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10 and len(ds.clients) == 5
    for c in ds.clients:
        assert c.train_x.shape[1:] == (3, 32, 32) and c.train_x.dtype == torch.float32
        assert len(torch.unique(c.train_y)) == 2
        assert set(c.test_y.tolist()) == set(c.train_y.tolist())  # test follows train
        k = int(c.train_y[0])
        expected = [((base + k) / 255 - m) / s for base, m, s in zip((10, 100, 200), CIFAR_MEAN, CIFAR_STD)]
        torch.testing.assert_close(c.train_x[0, :, 5, 7], torch.tensor(expected), rtol=1e-5, atol=1e-5)
    assert sum(c.num_train + len(c.test_y) for c in ds.clients) == 120  # train and test batches pooled
    assert root.is_dir()


def test_cifar10_balance_rate_and_determinism(tmp_path):
    write_cifar(tmp_path, per_batch=80, test=20)  # 42 per class, pooled
    cfg = DataConfig(name="cifar10", num_clients=5, classes_per_client=2, balance_rate=0.5, root=str(tmp_path))
    a, b = build_dataset(cfg, 7), build_dataset(cfg, 7)
    for c in a.clients:  # each class has one holder: all 42 of its first class, 21 of its second
        y = torch.cat([c.train_y, c.test_y])
        assert sorted(torch.bincount(y)[torch.unique(y)].tolist()) == [21, 42]
    assert all(torch.equal(x.train_y, y.train_y) and torch.equal(x.train_x, y.train_x)
               for x, y in zip(a.clients, b.clients))


def test_cifar10_fedselect_counts(tmp_path):
    write_cifar(tmp_path, per_batch=20, test=20)  # 12 per class
    cfg = DataConfig(name="cifar10", num_clients=10, classes_per_client=2, root=str(tmp_path),
                     options={"train_per_class": 2, "test_per_class": 3})
    for c in build_dataset(cfg, 0).clients:  # 2 classes each, exactly 2 train and 3 test samples of each
        tr, te = torch.bincount(c.train_y, minlength=10), torch.bincount(c.test_y, minlength=10)
        assert tr[tr > 0].tolist() == [2, 2]
        assert torch.equal(te > 0, tr > 0) and te[te > 0].tolist() == [3, 3]


def test_cifar10_missing_and_corrupt_files(tmp_path):
    write_cifar(tmp_path)
    (tmp_path / "data_batch_3").unlink()
    with pytest.raises(DatasetMissingError) as e:
        build_dataset(DataConfig(name="cifar10", root=str(tmp_path)), 0)
    assert str(e.value) == (f"cifar10: data_batch_3 not found in {tmp_path}; put the CIFAR-10 python batches "
                            "(data_batch_1..5, test_batch from cifar-10-python.tar.gz) there")
    assert "\n" not in str(e.value)
    with pytest.raises(DatasetMissingError, match="data.root is not set"):
        build_dataset(DataConfig(name="cifar10"), 0)

    write_cifar(tmp_path)
    (tmp_path / "test_batch").write_bytes(b"\x80\x02}q\x00(trunc")
    with pytest.raises(CorruptFileError, match="test_batch: not a CIFAR-10 python batch"):
        build_dataset(DataConfig(name="cifar10", root=str(tmp_path)), 0)

    class Evil:  # a pickle that would run code when loaded
        def __reduce__(self):
            import os
            return (os.system, ("echo pwned",))

    with open(tmp_path / "test_batch", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": []}, f)
    with pytest.raises(CorruptFileError, match="is not allowed"):
        build_dataset(DataConfig(name="cifar10", root=str(tmp_path)), 0)


# ---- MNIST ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_files(tmp_path, gz):
    write_mnist(tmp_path, gz=gz)
    ds = build_dataset(DataConfig(name="mnist", num_clients=5, classes_per_client=2, root=str(tmp_path)), 0)
    assert ds.input_shape == (1, 28, 28)
    assert sum(c.num_train + len(c.test_y) for c in ds.clients) == 80
    for c in ds.clients:
        assert c.train_x.shape[1:] == (1, 28, 28)
        assert len(torch.unique(c.train_y)) == 2
        expected = (3 * c.train_y.double() / 255 - 0.1307) / 0.3081  # every pixel of image i = 3 × label
        torch.testing.assert_close(c.train_x[:, 0, 13, 13].double(), expected, rtol=1e-5, atol=1e-5)


def test_mnist_truncated_and_missing(tmp_path):
    write_mnist(tmp_path)
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(CorruptFileError, match="train-images-idx3-ubyte: .* bytes but its header"):
        build_dataset(DataConfig(name="mnist", root=str(tmp_path)), 0)
    path.write_bytes(b"\x00\x00\x08\x03\x00")
    with pytest.raises(CorruptFileError, match="IDX header truncated"):
        build_dataset(DataConfig(name="mnist", root=str(tmp_path)), 0)
    path.unlink()
    with pytest.raises(DatasetMissingError, match=r"mnist: train-images-idx3-ubyte not found in .*; put the MNIST"):
        build_dataset(DataConfig(name="mnist", root=str(tmp_path)), 0)


# ---- CIFAR-MNIST ---------------------------------------------------------------------------------------------

def test_cifar_mnist_natural_split_labels_and_upscaling(tmp_path):
    write_cifar(tmp_path / "cifar")  # 10 train, 2 test per class
    write_mnist(tmp_path / "mnist")  # 5 train, 3 test per class
    cfg = DataConfig(name="cifar_mnist", num_clients=2, partition="natural",
                     options={"cifar_root": str(tmp_path / "cifar"), "mnist_root": str(tmp_path / "mnist"),
                              "pool_train_per_class": 4, "pool_test_per_class": 2})
    ds = build_dataset(cfg, 0)
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 20
    cif, mni = ds.clients
    assert (cif.user, mni.user) == ("cifar10", "mnist")
    assert torch.bincount(cif.train_y).tolist() == [4] * 10
    assert torch.bincount(mni.train_y, minlength=20)[10:].tolist() == [4] * 10
    assert set(mni.test_y.tolist()) == set(range(10, 20)) and set(cif.test_y.tolist()) == set(range(10))
    assert mni.train_x.shape[1:] == (3, 32, 32)
    digit = mni.train_y - 10  # pixels 3 × digit, upscaled and replicated to 3 channels
    expected = ((3 * digit.double() / 255 - 0.1307) / 0.3081)[:, None].expand(-1, 3)
    torch.testing.assert_close(mni.train_x[:, :, 31, 0].double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.bincount(ds.global_test_y).tolist() == [2] * 20
    with pytest.raises(ConfigError, match="num_clients = 2"):
        build_dataset(DataConfig(name="cifar_mnist", num_clients=3, partition="natural", options=cfg.options), 0)


# ---- MedMNIST ------------------------------------------------------------------------------------------------

def test_medmnist_natural_one_dataset_per_client_with_label_offsets(tmp_path):
    write_medmnist(tmp_path)
    ds = build_dataset(DataConfig(name="medmnist", num_clients=3, partition="natural", root=str(tmp_path)), 0)
    assert ds.input_shape == (3, 28, 28) and ds.num_classes == 21
    path, oct_, tissue = ds.clients
    assert [c.user for c in ds.clients] == ["pathmnist", "octmnist", "tissuemnist"]
    assert sorted(set(path.train_y.tolist())) == list(range(0, 9))
    assert sorted(set(oct_.train_y.tolist())) == list(range(9, 13))
    assert sorted(set(tissue.test_y.tolist())) == list(range(13, 21))
    # RGB kept as (R, G, B); grayscale replicated to 3 channels; (pixel / 255 - 0.5) / 0.5
    torch.testing.assert_close(path.train_x[0, :, 3, 3], torch.tensor([30, 60, 90]) / 127.5 - 1)
    g = oct_.train_x[:, :, 3, 3]
    torch.testing.assert_close(g, (5 * (oct_.train_y - 9).float() / 127.5 - 1)[:, None].expand(-1, 3))
    assert len(ds.global_test_y) == 3 * 18


def test_medmnist_dirichlet_missing_and_corrupt(tmp_path):
    write_medmnist(tmp_path)
    ds = build_dataset(DataConfig(name="medmnist", num_clients=4, partition="dirichlet", alpha=1.0,
                                  root=str(tmp_path), options={"image_size": 32}), 0)
    assert ds.input_shape == (3, 32, 32) and ds.clients[0].train_x.shape[1:] == (3, 32, 32)
    assert sum(c.num_train for c in ds.clients) == 81
    (tmp_path / "octmnist.npz").unlink()
    with pytest.raises(DatasetMissingError, match=r"medmnist: octmnist.npz not found in .*; put the MedMNIST"):
        build_dataset(DataConfig(name="medmnist", num_clients=3, partition="natural", root=str(tmp_path)), 0)
    (tmp_path / "octmnist.npz").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(CorruptFileError, match="octmnist.npz"):
        build_dataset(DataConfig(name="medmnist", num_clients=3, partition="natural", root=str(tmp_path)), 0)


# ---- FEMNIST ---------------------------------------------------------------------------------------------------

def _writer(pixel, labels):
    return [[pixel] * 784 for _ in labels], list(labels)


def _femnist_files(root):
    # users spread over files, in no particular order; each writer's pixels identify it
    return write_leaf(root, {
        "train": [{"f_0003": _writer(0.3, [1, 2, 61]), "f_0001": _writer(0.1, [0, 5])},
                  {"f_0002": _writer(0.2, [7, 7, 9, 35])}],
        "test": [{"f_0002": _writer(0.2, [9]), "f_0001": _writer(0.1, [5])}, {"f_0003": _writer(0.3, [61])}],
    })


def test_femnist_one_writer_per_client_in_sorted_order(tmp_path):
    _femnist_files(tmp_path)
    ds = build_dataset(DataConfig(name="femnist", num_clients=2, partition="natural", root=str(tmp_path)), 0)
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 62
    assert [c.user for c in ds.clients] == ["f_0001", "f_0002"]
    one, two = ds.clients
    assert one.train_y.tolist() == [0, 5] and one.test_y.tolist() == [5]
    assert two.train_y.tolist() == [7, 7, 9, 35] and two.test_y.tolist() == [9]
    assert one.train_x.shape == (2, 1, 28, 28) and torch.all(one.train_x == 0.1) and torch.all(two.test_x == 0.2)
    every = build_dataset(DataConfig(name="femnist", num_clients=50, partition="natural", root=str(tmp_path)), 0)
    assert [c.user for c in every.clients] == ["f_0001", "f_0002", "f_0003"]


def test_femnist_random_users_are_seeded(tmp_path):
    _femnist_files(tmp_path)
    cfg = DataConfig(name="femnist", num_clients=2, partition="natural", root=str(tmp_path),
                     options={"users": "random"})
    picks = {tuple(c.user for c in build_dataset(cfg, s).clients) for s in range(12)}
    assert len(picks) > 1  # the seed matters
    assert all(p == tuple(sorted(p)) and len(p) == 2 for p in picks)
    assert [c.user for c in build_dataset(cfg, 5).clients] == [c.user for c in build_dataset(cfg, 5).clients]


def test_femnist_missing_corrupt_and_partition(tmp_path):
    with pytest.raises(DatasetMissingError, match=r"femnist: directory .*train not found; put LEAF's FEMNIST"):
        build_dataset(DataConfig(name="femnist", partition="natural", root=str(tmp_path)), 0)
    _femnist_files(tmp_path)
    bad = tmp_path / "train" / "all_data_1_niid_0_keep_0_train_9.json"
    bad.write_text('{"users": ["f_0002"], "user_data": {')
    with pytest.raises(CorruptFileError, match="all_data_1_niid_0_keep_0_train_9.json: not a LEAF JSON file"):
        build_dataset(DataConfig(name="femnist", partition="natural", root=str(tmp_path)), 0)
    with pytest.raises(ConfigError, match="must be 'natural'"):
        build_dataset(DataConfig(name="femnist", partition="dirichlet", root=str(tmp_path)), 0)


# ---- Shakespeare -----------------------------------------------------------------------------------------------

def test_shakespeare_tokens_and_roles(tmp_path):
    line = ("To be, or not to be: that is the question}\n" * 2)[:80]
    write_leaf(tmp_path, {
        "train": [{"HAMLET": ([line, "A" * 80], ["a", "}"]), "OPHELIA": (["z" * 80], [" "])}],
        "test": [{"HAMLET": (["a" * 80], ["\n"]), "OPHELIA": (["?" * 80], ["A"])}],
    })
    ds = build_dataset(DataConfig(name="shakespeare", num_clients=5, partition="natural", root=str(tmp_path)), 0)
    assert len(ALL_LETTERS) == 80 and ds.num_classes == 80 and ds.input_dtype == "int64"
    assert ds.input_shape == (80,)
    hamlet, ophelia = ds.clients
    assert (hamlet.user, ophelia.user) == ("HAMLET", "OPHELIA")
    assert hamlet.train_x.dtype == torch.int64 and hamlet.train_x.shape == (2, 80)
    # LEAF's indices: '\n' 0, ' ' 1, '?' 24, 'A' 25, 'a' 53, 'z' 78, '}' 79
    assert hamlet.train_x[0, :3].tolist() == [44, 67, 1]  # 'T', 'o', ' '
    assert hamlet.train_x[1].tolist() == [25] * 80 and ophelia.train_x[0].tolist() == [78] * 80
    assert hamlet.train_y.tolist() == [53, 79] and hamlet.test_y.tolist() == [0]
    assert ophelia.train_y.tolist() == [1] and ophelia.test_x[0, 0].item() == 24 and ophelia.test_y.tolist() == [25]


def test_shakespeare_refuses_characters_outside_the_vocabulary(tmp_path):
    write_leaf(tmp_path, {"train": [{"ROMEO": (["é" * 80], ["a"])}], "test": [{"ROMEO": ([], [])}]})
    with pytest.raises(CorruptFileError, match="character 'é' outside LEAF's 80-character vocabulary"):
        build_dataset(DataConfig(name="shakespeare", partition="natural", root=str(tmp_path)), 0)


# ---- UCI HAR ---------------------------------------------------------------------------------------------------

def test_har_one_subject_per_client_stratified(tmp_path):
    write_har(tmp_path)
    ds = build_dataset(DataConfig(name="har", num_clients=30, partition="natural", test_fraction=0.25,
                                  root=str(tmp_path)), 0)
    assert ds.input_shape == (561,) and ds.num_classes == 6
    assert [c.user for c in ds.clients] == ["subject-01", "subject-02", "subject-03"]
    for c, s in zip(ds.clients, (1, 2, 3)):
        assert c.train_x.shape[1:] == (561,)
        assert torch.all(c.train_x[:, 0] == s) and torch.all(c.test_x[:, 0] == s)  # only this subject
        torch.testing.assert_close(c.train_x[:, 1], c.train_y.float() + 1)  # labels 1..6 -> 0..5
        assert sorted(set(c.train_y.tolist())) == sorted(set(c.test_y.tolist())) == list(range(6))
        assert c.num_train + len(c.test_y) == 14
    first_two = build_dataset(DataConfig(name="har", num_clients=2, partition="natural", root=str(tmp_path)), 0)
    assert [c.user for c in first_two.clients] == ["subject-01", "subject-02"]


def test_har_also_under_uci_folder_and_errors(tmp_path):
    write_har(tmp_path / "UCI HAR Dataset")
    ds = build_dataset(DataConfig(name="har", num_clients=3, partition="pathological", classes_per_client=2,
                                  root=str(tmp_path)), 0)
    assert all(len(torch.unique(c.train_y)) == 2 for c in ds.clients)
    x = tmp_path / "UCI HAR Dataset" / "train" / "X_train.txt"
    x.write_text(x.read_text().replace(" 2.5000000e-01\n", "\n", 1))  # one row loses a feature
    with pytest.raises(CorruptFileError, match="X_train.txt: expected 561 numbers on each of 28 lines"):
        build_dataset(DataConfig(name="har", partition="natural", root=str(tmp_path)), 0)
    (tmp_path / "UCI HAR Dataset" / "test" / "subject_test.txt").unlink()  # missing is reported before corrupt
    with pytest.raises(DatasetMissingError, match="har: test/subject_test.txt not found in .*UCI HAR Dataset"):
        build_dataset(DataConfig(name="har", partition="natural", root=str(tmp_path)), 0)


def test_digits_read_from_scikit_learns_file_equal_load_digits():
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from edgemask.trainer.data.embedded import load_digits_arrays

    images, target = load_digits_arrays()
    ref = load_digits()
    assert np.array_equal(images, ref.images) and np.array_equal(target, ref.target) and target.dtype == np.int64
    assert images.shape == (1797, 8, 8) and np.bincount(target).tolist() == np.bincount(ref.target).tolist()
    # read without importing scikit-learn (its import is most of a small run's start-up)
    out = subprocess.run([sys.executable, "-c", "import sys; from edgemask.trainer.data.embedded import load_digits_arrays; "
                          "load_digits_arrays(); print('sklearn' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_normalized_pool_normalizes_only_what_is_read_with_the_same_bits():
    from edgemask.trainer.data.transforms import CIFAR10_MEAN, CIFAR10_STD, NormalizedPool, normalize

    images = np.random.default_rng(0).integers(0, 256, (50, 3, 4, 4), dtype=np.uint8)
    pool = NormalizedPool(images, CIFAR10_MEAN, CIFAR10_STD)
    idx = np.array([7, 3, 41])
    got = pool[idx]
    assert got.dtype == np.float32 and got.tobytes() == normalize(images, CIFAR10_MEAN, CIFAR10_STD)[idx].tobytes()
    assert pool.images.dtype == np.uint8 and len(pool) == 50  # the pool itself stays one byte a pixel
