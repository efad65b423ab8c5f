"""FedPeWS's {Path-OCT-Tissue}MNIST (Tastan et al., §5.1) from local MedMNIST ``.npz`` files
(``pathmnist.npz``, ``octmnist.npz``, ``tissuemnist.npz``; keys ``train_images``, ``train_labels``,
``test_images``, ``test_labels``; the ``val_*`` arrays are not used).

One 21-class task: PathMNIST's 9 classes are labels 0..8, OCTMNIST's 4 are 9..12, TissueMNIST's 8 are 13..20.
Shapes are unified to (3, S, S): PathMNIST is RGB, the grayscale OCT and Tissue images are replicated to three
channels (so PathMNIST keeps its colour); ``S`` is 28 unless ``cfg.options["image_size"]`` asks otherwise (32
matches the CIFAR-MNIST network FedPeWS reuses; bilinear). Pixels are scaled to [0, 1] and normalized with
mean 0.5, std 0.5 as in MedMNIST's own examples. ``cfg.options`` ``max_train_per_dataset`` /
``max_test_per_dataset`` take a seeded random subset of each (TissueMNIST alone has 165,466 train images).

Partitions: ``natural`` with N = 3 is FedPeWS's split, one dataset per participant (Path, OCT, Tissue), each
client testing on its dataset's test split. Otherwise ``dirichlet``, ``pathological`` or ``iid`` over the pooled
train sets, tests shared out to follow each client's classes. The pooled test sets are the global test set.
"""

from __future__ import annotations

import math
import zipfile
from pathlib import Path

import numpy as np
import torch

from edgemask.errors import ConfigError, CorruptFileError
from edgemask.trainer.data.base import DATASETS, SIZES, DataConfig, DataSizes, FederatedDataset
from edgemask.trainer.data.clients import clients_with_test_pool, natural_clients
from edgemask.trainer.data.files import dataset_root, find_file
from edgemask.trainer.data.partition import partition
from edgemask.trainer.data.transforms import normalize, resize, to_channels

PARTS = (("pathmnist", 9), ("octmnist", 4), ("tissuemnist", 8))  # FedPeWS's order, with class counts
KEYS = ("train_images", "train_labels", "test_images", "test_labels")
HINT = "the MedMNIST files pathmnist.npz, octmnist.npz and tissuemnist.npz (MedMNIST v2, medmnist.com)"


def read_npz(path: Path, num_classes: int) -> dict[str, np.ndarray]:
    """One MedMNIST file -> images uint8 ``(N, C, H, W)`` and labels int64 ``(N,)`` for train and test."""
    try:
        with np.load(path, allow_pickle=False) as z:
            missing = [k for k in KEYS if k not in z.files]
            if missing:
                raise CorruptFileError(f"{path}: missing arrays {', '.join(missing)}; expected a MedMNIST .npz")
            out = {k: z[k] for k in KEYS}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise CorruptFileError(f"{path}: not a readable .npz ({e}); download it again") from None
    for split in ("train", "test"):
        images, labels = out[f"{split}_images"], out[f"{split}_labels"].reshape(-1).astype(np.int64)
        if images.ndim == 3:  # grayscale (N, H, W)
            images = images[:, None]
        elif images.ndim == 4 and images.shape[-1] == 3:  # RGB (N, H, W, 3)
            images = images.transpose(0, 3, 1, 2)
        else:
            raise CorruptFileError(f"{path}: {split}_images has shape {images.shape}; expected (N, H, W) or "
                                   "(N, H, W, 3)")
        if len(labels) != len(images) or labels.min(initial=0) < 0 or labels.max(initial=0) >= num_classes:
            raise CorruptFileError(f"{path}: {split}_labels must be {len(images)} labels in 0..{num_classes - 1}")
        out[f"{split}_images"], out[f"{split}_labels"] = images.astype(np.uint8), labels
    return out


def _subset(n: int, cap, rng: np.random.Generator) -> np.ndarray:
    return np.arange(n) if cap is None or int(cap) >= n else np.sort(rng.choice(n, size=int(cap), replace=False))


@DATASETS.register("medmnist")
def medmnist(cfg: DataConfig, seed: int) -> FederatedDataset:
    base = dataset_root(cfg.root, "medmnist", HINT)
    size = int(cfg.options.get("image_size", 28))
    rng = np.random.default_rng(seed)
    per_part = []  # (name, x_tr, y_tr, x_te, y_te)
    offset = 0
    for name, n_classes in PARTS:
        d = read_npz(find_file(base, [f"{name}.npz"], "medmnist", HINT), n_classes)
        xs = []
        for split in ("train", "test"):
            keep = _subset(len(d[f"{split}_labels"]), cfg.options.get(f"max_{split}_per_dataset"), rng)
            x = to_channels(resize(normalize(d[f"{split}_images"][keep], (0.5,), (0.5,)), size), 3)
            xs += [x, d[f"{split}_labels"][keep] + offset]  # x: (n, 3, size, size)
        per_part.append((name, *xs))
        offset += n_classes

    x_te = np.concatenate([p[3] for p in per_part])
    y_te = np.concatenate([p[4] for p in per_part])
    if cfg.partition == "natural":
        if cfg.num_clients != 3:
            raise ConfigError(f"medmnist: data.partition 'natural' needs data.num_clients = 3 (Path | OCT | "
                              f"Tissue), got {cfg.num_clients}; use dirichlet for other counts")
        clients = natural_clients(per_part)
    else:
        x_tr = np.concatenate([p[1] for p in per_part])
        y_tr = np.concatenate([p[2] for p in per_part])
        clients = clients_with_test_pool(x_tr, y_tr, x_te, y_te, partition(y_tr, cfg, rng), cfg, rng)
    return FederatedDataset("medmnist", (3, size, size), offset, clients,
                            global_test_x=torch.from_numpy(x_te), global_test_y=torch.from_numpy(y_te))


def npz_shapes(path: Path) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """Each array of an ``.npz`` file: its shape and dtype from the ``.npy`` header alone (no data read)."""
    out = {}
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                with z.open(info) as f:
                    version = np.lib.format.read_magic(f)
                    shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                       else np.lib.format.read_array_header_2_0(f))
                out[info.filename[:-4]] = (tuple(shape), dtype)
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
        raise CorruptFileError(f"{path}: not a readable .npz ({e}); download it again") from None
    return out


@SIZES.register("medmnist")
def medmnist_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    """Per file, its arrays' headers (:func:`npz_shapes`) and its training labels (read: a byte or so a sample)
    give what is kept (``max_*_per_dataset``) and the largest class; the test sets are shared out and held
    again as the global one; the natural split's three clients hold one file each. Reading holds one file's
    arrays (and their channels-first copy), the float32 samples kept per file and their concatenation."""
    base = dataset_root(cfg.root, "medmnist", HINT)
    size = int(cfg.options.get("image_size", 28))
    sample = 3 * size * size * 4
    train = test = largest = largest_part = raw = 0
    for name, _ in PARTS:
        path = find_file(base, [f"{name}.npz"], "medmnist", HINT)
        shapes = npz_shapes(path)
        missing = [k for k in KEYS if k not in shapes]
        if missing:
            raise CorruptFileError(f"{path}: missing arrays {', '.join(missing)}; expected a MedMNIST .npz")
        kept = {}
        for split in ("train", "test"):
            n, cap = shapes[f"{split}_labels"][0][0], cfg.options.get(f"max_{split}_per_dataset")
            kept[split] = n if cap is None else min(n, int(cap))
        with np.load(path, allow_pickle=False) as z:
            labels = z["train_labels"].reshape(-1).astype(np.int64)
        largest = max(largest, int(np.bincount(labels[labels >= 0]).max(initial=0)))
        train, test = train + kept["train"], test + kept["test"]
        largest_part = max(largest_part, kept["train"])
        raw = max(raw, sum(math.prod(shape) * dt.itemsize for k, (shape, dt) in shapes.items() if k in KEYS))
    natural = cfg.partition == "natural"
    return DataSizes((3, size, size), sum(k for _, k in PARTS), train, min(largest, train),
                     3 if natural else cfg.num_clients, test_pool=test, global_test=test,
                     read=2 * raw + 3 * (train + test) * sample, largest_part=largest_part if natural else None)
