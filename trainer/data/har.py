"""UCI Human Activity Recognition Using Smartphones (Anguita et al., 2013) from its text files.

``train/X_train.txt`` (561 whitespace-separated features per line), ``train/y_train.txt`` (activity 1..6),
``train/subject_train.txt`` (subject 1..30), and ``test/`` likewise; ``cfg.root`` may also be the directory
that holds ``UCI HAR Dataset/``. Labels 1..6 become 0..5 (walking, upstairs, downstairs, sitting, standing,
lying); shape (561,).

UCI splits train and test by subject (21 / 9), so FedMask's natural split (§4.1, Table 4: 30 clients) pools
both and gives each subject its own client, named ``subject-NN``, ``cfg.num_clients`` subjects in order; each
subject's samples are split train/test stratified per activity (``cfg.test_fraction``). Any other
``cfg.partition`` partitions the pooled samples like CIFAR-10.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from edgemask.errors import CorruptFileError
from edgemask.trainer.data.base import DATASETS, SIZES, DataConfig, DataSizes, FederatedDataset
from edgemask.trainer.data.clients import natural_clients, pooled_clients
from edgemask.trainer.data.files import dataset_root, find_file
from edgemask.trainer.data.partition import train_test_split

NUM_FEATURES = 561
HINT = ("the UCI HAR text files (train/X_train.txt, train/y_train.txt, train/subject_train.txt and test/ "
        "likewise, from 'UCI HAR Dataset.zip')")


def read_table(path: Path, columns: int, dtype) -> np.ndarray:
    """A whitespace-separated text table with ``columns`` numbers per line -> ``(N, columns)``."""
    try:
        text = path.read_text(encoding="ascii")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        values = np.asarray(text.split(), dtype=np.float64)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CorruptFileError(f"{path}: not a whitespace-separated number table ({e})") from None
    if len(values) != len(lines) * columns:
        raise CorruptFileError(f"{path}: expected {columns} numbers on each of {len(lines)} lines, "
                               f"found {len(values)} in all")
    return values.reshape(len(lines), columns).astype(dtype)


def har_files(root: str | Path | None) -> dict[str, list[Path]]:
    """``{split: [X, y, subject files]}``, every file looked for before any is read."""
    base = dataset_root(root, "har", HINT)
    if not (base / "train").is_dir() and (base / "UCI HAR Dataset").is_dir():
        base = base / "UCI HAR Dataset"
    return {split: [find_file(base, [f"{split}/{stem}_{split}.txt"], "har", HINT) for stem in ("X", "y", "subject")]
            for split in ("train", "test")}


def load_har(root: str | Path | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pooled train + test: features float32 ``(N, 561)``, labels int64 0..5, subjects int64 1..30."""
    found = har_files(root)
    xs, ys, ss = [], [], []
    for files in found.values():
        x = read_table(files[0], NUM_FEATURES, np.float32)
        y = read_table(files[1], 1, np.int64).reshape(-1)
        s = read_table(files[2], 1, np.int64).reshape(-1)
        if not len(x) == len(y) == len(s):
            raise CorruptFileError(f"{files[0].parent}: {len(x)} feature rows, {len(y)} labels, {len(s)} "
                                   "subjects; the three files must have one line per sample")
        if len(y) and (y.min() < 1 or y.max() > 6):
            raise CorruptFileError(f"{files[1]}: activity labels must be 1..6, found {y.min()}..{y.max()}")
        xs.append(x), ys.append(y - 1), ss.append(s)
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ss)


@DATASETS.register("har")
def har(cfg: DataConfig, seed: int) -> FederatedDataset:
    x, y, subjects = load_har(cfg.root)
    if cfg.partition != "natural":
        return FederatedDataset("har", (NUM_FEATURES,), 6, pooled_clients(x, y, cfg, seed))
    rng = np.random.default_rng(seed)
    rows = []
    for s in np.unique(subjects)[: cfg.num_clients]:
        tr, te = train_test_split(np.flatnonzero(subjects == s), y, cfg.test_fraction, rng)
        rows.append((f"subject-{int(s):02d}", x[tr], y[tr], x[te], y[te]))
    return FederatedDataset("har", (NUM_FEATURES,), 6, natural_clients(rows))


@SIZES.register("har")
def har_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    """The labels and subjects read (a line a sample), not the features: the pool, its largest activity and,
    for the natural split, its subjects and the largest. Reading a feature file holds its text twice (the text
    and its lines), every number as a Python string in a list (its size measured on the file's first number)
    and as float64, and the pooled float32 features."""
    found = har_files(cfg.root)
    labels = [read_table(files[1], 1, np.int64).reshape(-1) for files in found.values()]
    subjects = np.concatenate([read_table(files[2], 1, np.int64).reshape(-1) for files in found.values()])
    y = np.concatenate(labels)
    n = len(y)
    per_class = np.bincount(y[(y >= 1) & (y <= 6)], minlength=7)
    text = max(files[0].stat().st_size for files in found.values())
    with open(found["train"][0], encoding="ascii", errors="replace") as f:
        first = (f.readline().split() or ["0"])[0]
    per_value = sys.getsizeof(first) + 8 + 8  # the string, its slot in split()'s list, its float64
    read = 2 * text + max(len(t) for t in labels) * NUM_FEATURES * per_value + n * NUM_FEATURES * 4
    if cfg.partition == "natural":
        counts = np.unique(subjects, return_counts=True)[1][: cfg.num_clients]
        return DataSizes((NUM_FEATURES,), 6, n, int(per_class.max()), len(counts), read=read,
                         largest_part=int(counts.max(initial=0)))
    return DataSizes((NUM_FEATURES,), 6, n, int(per_class.max()), cfg.num_clients, read=read,
                     per_class_counts=True)
