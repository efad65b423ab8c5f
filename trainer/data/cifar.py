"""CIFAR-10 from the standard python pickle batches (``data_batch_1`` .. ``data_batch_5``, ``test_batch``).

Pixels are scaled to [0, 1] and normalized per channel with the usual CIFAR-10 means and stds; shape (3, 32, 32).
FedMask's IC-CIFAR10 (§4.1): ``pathological``, 2 classes per client, ``balance_rate`` between them, each client's
test split following its train distribution. We pool the official train and test batches (60,000 images) and
split every client's part stratified per class (``test_fraction``), which gives exactly that; FedSelect's setting
is ``data.options = {train_per_class = 20, test_per_class = 100}``.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from edgemask.errors import CorruptFileError
from edgemask.trainer.data.base import DATASETS, SIZES, DataConfig, DataSizes, FederatedDataset
from edgemask.trainer.data.clients import pooled_clients
from edgemask.trainer.data.files import dataset_root, find_file
from edgemask.trainer.data.transforms import CIFAR10_MEAN, CIFAR10_STD, NormalizedPool

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
HINT = "the CIFAR-10 python batches (data_batch_1..5, test_batch from cifar-10-python.tar.gz)"
SUBDIRS = ("", "cifar-10-batches-py")
IMAGE_BYTES = 3 * 32 * 32  # one image's uint8 pixels in a batch file
CLASS_IMAGES = 6000  # CIFAR-10's images of each class (5,000 train + 1,000 test)


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists and numpy arrays only: a batch file cannot run code."""

    ALLOWED = {
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One batch -> images uint8 ``(N, 3, 32, 32)``, labels int64 ``(N,)``."""
    try:
        with open(path, "rb") as f:
            d = _ArrayUnpickler(f, encoding="bytes").load()
        data = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d[b"labels"], dtype=np.int64)
        images = data.reshape(-1, 3, 32, 32)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError, AttributeError,
            IndexError) as e:
        raise CorruptFileError(f"{path}: not a CIFAR-10 python batch ({type(e).__name__}: {e}); "
                               "download cifar-10-python.tar.gz again") from None
    if len(labels) != len(images) or labels.min(initial=0) < 0 or labels.max(initial=0) > 9:
        raise CorruptFileError(f"{path}: {len(images)} images but {len(labels)} labels in 0..9; "
                               "download cifar-10-python.tar.gz again")
    return images, labels


def cifar10_counts(root: str | Path | None, dataset: str = "cifar10", field: str = "data.root") -> tuple[int, int]:
    """``(train images, test images)`` at most, from the batch files' lengths (an image is 3,072 bytes of a batch
    file; its label and the pickle's framing add a few more), without reading them; a missing file is the
    loader's one-line error."""
    base = dataset_root(root, dataset, HINT, field)
    train = sum(find_file(base, [name], dataset, HINT, SUBDIRS).stat().st_size // IMAGE_BYTES for name in TRAIN_BATCHES)
    return train, find_file(base, [TEST_BATCH], dataset, HINT, SUBDIRS).stat().st_size // IMAGE_BYTES


def load_cifar10(root: str | Path | None, dataset: str = "cifar10", field: str = "data.root"
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw ``(train_images uint8 (50000, 3, 32, 32), train_labels, test_images, test_labels)``."""
    base = dataset_root(root, dataset, HINT, field)
    batches = [read_batch(find_file(base, [name], dataset, HINT, SUBDIRS)) for name in TRAIN_BATCHES]
    test = read_batch(find_file(base, [TEST_BATCH], dataset, HINT, SUBDIRS))
    return (np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches]), *test)


@DATASETS.register("cifar10")
def cifar10(cfg: DataConfig, seed: int) -> FederatedDataset:
    xtr, ytr, xte, yte = load_cifar10(cfg.root)
    x = NormalizedPool(np.concatenate([xtr, xte]), CIFAR10_MEAN, CIFAR10_STD)  # (60000, 3, 32, 32), when read
    y = np.concatenate([ytr, yte])
    return FederatedDataset("cifar10", (3, 32, 32), 10, pooled_clients(x, y, cfg, seed))


@SIZES.register("cifar10")
def cifar10_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    """The pooled train and test images (:func:`cifar10_counts`), CIFAR-10's 6,000 a class. Reading holds the
    uint8 batches twice at once (the train batches and their concatenation, then train + test and the pool) and
    the labels."""
    train, test = cifar10_counts(cfg.root)
    n = train + test
    return DataSizes((3, 32, 32), 10, n, min(n, CLASS_IMAGES), cfg.num_clients, read=n * (2 * IMAGE_BYTES + 24),
                     per_class_counts=True)
