"""MNIST from the standard IDX files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``; each may be gzipped, ``.gz``).

Pixels scaled to [0, 1] and normalized with MNIST's usual mean 0.1307 and std 0.3081; shape (1, 28, 28).
Like CIFAR-10, the official train and test sets are pooled and each client's part split stratified per class.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from edgemask.errors import CorruptFileError
from edgemask.trainer.data.base import DATASETS, SIZES, DataConfig, DataSizes, FederatedDataset
from edgemask.trainer.data.clients import pooled_clients
from edgemask.trainer.data.files import dataset_root, find_file
from edgemask.trainer.data.transforms import MNIST_MEAN, MNIST_STD, NormalizedPool

FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
HINT = ("the MNIST IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, "
        "t10k-labels-idx1-ubyte, optionally .gz)")
_IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def read_idx(path: Path) -> np.ndarray:
    """An IDX file: magic ``0x00 0x00 <type> <ndim>``, ``ndim`` big-endian uint32 sizes, then the data."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise CorruptFileError(f"{path}: cannot be read ({e}); download it again") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise CorruptFileError(f"{path}: not an IDX file (bad magic number); download it again")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise CorruptFileError(f"{path}: IDX header truncated; download it again")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(raw) != expected:
        raise CorruptFileError(f"{path}: {len(raw)} bytes but its header {shape} needs {expected}; "
                               "download it again")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)


def idx_shape(path: Path) -> tuple[int, ...]:
    """An IDX file's shape from its header alone (the magic number and the sizes: a few bytes read)."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) < 4 or head[0] != 0 or head[1] != 0 or head[2] not in _IDX_DTYPES:
                raise CorruptFileError(f"{path}: not an IDX file (bad magic number); download it again")
            dims = f.read(4 * head[3])
    except (OSError, EOFError) as e:
        raise CorruptFileError(f"{path}: cannot be read ({e}); download it again") from None
    if len(dims) < 4 * head[3]:
        raise CorruptFileError(f"{path}: IDX header truncated; download it again")
    return tuple(int(d) for d in np.frombuffer(dims, dtype=">u4"))


def _find(base: Path, key: str, dataset: str) -> Path:
    name = FILES[key]
    dotted = name.replace("-idx", ".idx")  # some mirrors write train-images.idx3-ubyte
    return find_file(base, [name, name + ".gz", dotted, dotted + ".gz"], dataset, HINT, ("", "raw", "MNIST/raw"))


def mnist_counts(root: str | Path | None, dataset: str = "mnist", field: str = "data.root") -> tuple[int, int, int]:
    """``(train images, test images, the largest class's images in both)``: the image files' headers and the
    labels (one byte a sample) read, not the images."""
    base = dataset_root(root, dataset, HINT, field)
    counts, per_class = [], np.zeros(256, dtype=np.int64)
    for split in ("train", "test"):
        counts.append(idx_shape(_find(base, f"{split}_images", dataset))[0])
        per_class += np.bincount(read_idx(_find(base, f"{split}_labels", dataset)).reshape(-1).astype(np.uint8),
                                 minlength=256)
    return counts[0], counts[1], int(per_class.max())


def load_mnist(root: str | Path | None, dataset: str = "mnist", field: str = "data.root"
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Raw ``(train_images uint8 (60000, 1, 28, 28), train_labels int64, test_images, test_labels)``."""
    base = dataset_root(root, dataset, HINT, field)
    out = []
    for split in ("train", "test"):
        ipath, lpath = _find(base, f"{split}_images", dataset), _find(base, f"{split}_labels", dataset)
        images, labels = read_idx(ipath), read_idx(lpath)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise CorruptFileError(f"{ipath}: expected uint8 images (N, 28, 28), got {images.dtype} {images.shape}")
        if labels.ndim != 1 or len(labels) != len(images):
            raise CorruptFileError(f"{lpath}: {labels.shape} labels for {len(images)} images in {ipath.name}")
        if labels.max(initial=0) > 9:
            raise CorruptFileError(f"{lpath}: label {int(labels.max())} is outside 0..9")
        out += [images[:, None, :, :], labels.astype(np.int64)]
    return tuple(out)  # type: ignore[return-value]


@DATASETS.register("mnist")
def mnist(cfg: DataConfig, seed: int) -> FederatedDataset:
    xtr, ytr, xte, yte = load_mnist(cfg.root)
    x = NormalizedPool(np.concatenate([xtr, xte]), MNIST_MEAN, MNIST_STD)  # (70000, 1, 28, 28), when read
    y = np.concatenate([ytr, yte])
    return FederatedDataset("mnist", (1, 28, 28), 10, pooled_clients(x, y, cfg, seed))


IMAGE_BYTES = 28 * 28


@SIZES.register("mnist")
def mnist_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    """The pooled train and test images and the largest class (:func:`mnist_counts`). Reading holds each
    file's bytes (twice while a ``.gz`` one is inflated), the pool's concatenation and the labels."""
    train, test, largest = mnist_counts(cfg.root)
    n = train + test
    return DataSizes((1, 28, 28), 10, n, largest, cfg.num_clients, read=n * (3 * IMAGE_BYTES + 24),
                     per_class_counts=True)
