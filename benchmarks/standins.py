"""STAND-INS for the papers' datasets, written in the real files' layouts so the repository's loaders read them
unchanged (``trainer/data/cifar.py``, ``leaf.py``, ``har.py``): no real sample is in them.

At the papers' sizes by default (FedMask, Table 4; CIFAR-10's own 50,000 + 10,000 images):

* ``cifar10``: CIFAR-10's python batches, ``data_batch_1..5`` and ``test_batch`` (10,000 images each);
* ``femnist``: LEAF's FEMNIST JSON, ``train/*.json`` and ``test/*.json``, 2,414 writers × 232.8 samples on average,
  62 classes, 28×28 pixels in [0, 1] (784 numbers a sample, as LEAF stores them);
* ``shakespeare``: LEAF's Shakespeare JSON, 1,129 roles × 3,743.2 sequences on average (4.2 M in all), x an
  80-character string of LEAF's vocabulary, y the next character;
* ``har``: the UCI HAR text files (``train/X_train.txt``, ``y_train.txt``, ``subject_train.txt``, ``test/``
  likewise), 30 subjects × 364 samples on average, 561 features, 6 activities, UCI's 9 test subjects in ``test/``.

Each class has a fixed pattern and each sample adds noise, so a mask has something to learn: a random image per
CIFAR class, a random blocky glyph per FEMNIST character, a random 561-vector per HAR activity (plus a small offset
per subject); a Shakespeare role reads a fixed random script from its own offset, a character in 20 replaced, so
the next character follows from the last few. Per-user sample counts are drawn around the paper's mean (a gamma
distribution, rescaled so the total is exactly users × mean); LEAF's split keeps ``max(1, ⌊0.9·n⌋)`` of a user's
samples for training (Shakespeare's the first ones, its sequences overlapping).

A stand-in is written once into a temporary directory beside its target and renamed into place
(``edgemask.fileio.atomic_dir``); ``STANDIN.json`` in it says what it is and with which parameters, and a complete
one with the same parameters is reused. A LEAF file says it too (its ``"stand_in"`` field, which the loader
ignores). Memory stays at one LEAF file's users (FEMNIST's 100 writers: ~90 MB of JSON) or one HAR split.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from edgemask.fileio import atomic_dir
from edgemask.trainer.data.leaf import ALL_LETTERS, SEQ_LEN

MARKER = "STANDIN.json"
NOTICE = "STAND-IN written by benchmarks/standins.py: not the real dataset"
TRAIN_FRACTION = 0.9  # LEAF's default split (split_data.py --tf 0.9), per user, by sample
UCI_TEST_SUBJECTS = frozenset({2, 4, 9, 10, 12, 13, 18, 20, 24})  # UCI HAR's 9 test volunteers of 30


@dataclass(frozen=True)
class Size:
    """A natural split's size: users (writers, roles, subjects) × samples per user on average (train + test)."""

    users: int
    mean_samples: float


# FedMask, Table 4 (its Shakespeare figure is LEAF's 4,226,158 samples / 1,129 roles)
PAPER = {"femnist": Size(2414, 232.8), "shakespeare": Size(1129, 3743.2), "har": Size(30, 364.0)}


def sample_counts(users: int, mean: float, rng: np.random.Generator, minimum: int, shape: float) -> np.ndarray:
    """Per-user sample counts, each at least ``minimum``, summing to ``round(users · mean)``: ``minimum`` plus a
    share of the rest proportional to a Gamma(``shape``) draw (a smaller shape, a wider spread), the rounding's
    remainder going to the largest fractions."""
    total = round(users * mean)
    spare = total - minimum * users
    if spare < 0:
        raise ValueError(f"{users} users × at least {minimum} samples exceed {total} = {users} × {mean:g}")
    raw = rng.gamma(shape, 1.0, users)
    raw = raw / raw.sum() * spare
    counts = np.floor(raw).astype(np.int64)
    counts[np.argsort(counts - raw)[: spare - int(counts.sum())]] += 1  # largest remainders first
    return counts + minimum


def leaf_train_count(n: int) -> int:
    return max(1, int(TRAIN_FRACTION * n))


def written(directory: Path, params: dict) -> bool:
    """A complete stand-in with these parameters is in ``directory`` (its marker is written last)."""
    try:
        return json.loads((directory / MARKER).read_text())["parameters"] == params
    except (OSError, ValueError, KeyError, TypeError):
        return False


def cached(directory: Path, params: dict, write: Callable[[Path], dict]) -> Path:
    """``directory``, written by ``write(tmp)`` (which returns the totals for the marker) unless it holds a
    complete stand-in of these parameters; built beside it and renamed into place, replacing an empty directory
    or a stand-in of other parameters, never anything else."""
    directory = Path(directory)
    if written(directory, params):
        return directory
    def ours(p: Path) -> bool:  # a stand-in (of other parameters), or nothing yet
        return (p / MARKER).is_file() or not any(p.iterdir())

    with atomic_dir(directory, ours, "a stand-in dataset (no STANDIN.json)") as tmp:
        totals = write(tmp)
        (tmp / MARKER).write_text(json.dumps({"what": NOTICE, "parameters": params, **totals}, indent=1) + "\n")
    return directory


# ---- CIFAR-10 ------------------------------------------------------------------------------------------------

CIFAR_BATCHES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def write_cifar10(directory: Path, seed: int = 0) -> Path:
    """CIFAR-10's python batches (5 × 10,000 train, 10,000 test): class c's images are its fixed random colour
    pattern plus Gaussian noise (σ = 48 of 255), clipped to uint8. Written once: a directory holding the six
    batches is reused (one a stand-in wrote before its marker existed too)."""
    directory = Path(directory)
    if all((directory / n).is_file() for n in CIFAR_BATCHES):
        return directory

    def write(tmp: Path) -> dict:
        rng = np.random.default_rng(seed)
        patterns = rng.integers(0, 256, (10, 3072)).astype(np.float32)
        for name in CIFAR_BATCHES:
            labels = rng.integers(0, 10, 10_000)
            data = np.clip(patterns[labels] + rng.normal(0, 48, (10_000, 3072)), 0, 255).astype(np.uint8)
            with open(tmp / name, "wb") as f:
                pickle.dump({b"batch_label": name.encode(), b"labels": labels.tolist(), b"data": data}, f,
                            protocol=2)
        return {"train": 50_000, "test": 10_000, "classes": 10}

    return cached(directory, {"kind": "cifar10", "seed": seed}, write)


# ---- LEAF: FEMNIST, Shakespeare ------------------------------------------------------------------------------

class LeafFile:
    """One LEAF JSON file written a user at a time: ``{"stand_in", "users", "num_samples", "user_data"}``, the
    header known up front (the users' counts are drawn before their samples)."""

    def __init__(self, path: Path, users: list[str], counts: list[int]) -> None:
        self.f = open(path, "wb")
        self.first = True
        self.f.write(b'{"stand_in": ' + json.dumps(NOTICE).encode() + b', "users": ' + json.dumps(users).encode()
                     + b', "num_samples": ' + json.dumps(counts).encode() + b', "user_data": {')

    def user(self, name: str, x_json: bytes, y: list) -> None:
        sep = b"" if self.first else b", "
        self.first = False
        self.f.write(sep + json.dumps(name).encode() + b': {"x": ' + x_json + b', "y": ' + json.dumps(y).encode()
                     + b"}")

    def close(self) -> None:
        self.f.write(b"}}")
        self.f.close()


def write_leaf(directory: Path, prefix: str, size: Size, users_per_file: int, minimum: int, shape: float,
               seed: int, user_name: Callable[[int], str],
               user_samples: Callable[[np.random.Generator, int, int], tuple[bytes, list, bytes, list]]) -> dict:
    """LEAF's split layout: ``train/all_data_<i>_niid_0_keep_0_train_9.json`` and its ``test`` twin, each holding
    ``users_per_file`` users; ``user_samples(rng, user, n)`` gives a user's (train x as JSON, train y, test x as
    JSON, test y) for its ``n`` samples."""
    rng = np.random.default_rng(seed)
    counts = sample_counts(size.users, size.mean_samples, rng, minimum, shape)
    for split in ("train", "test"):
        (directory / split).mkdir()
    totals = {"train": 0, "test": 0}
    for i, start in enumerate(range(0, size.users, users_per_file)):
        members = range(start, min(start + users_per_file, size.users))
        names = [user_name(u) for u in members]
        ntrain = [leaf_train_count(int(counts[u])) for u in members]
        ntest = [int(counts[u]) - t for u, t in zip(members, ntrain)]
        files = {split: LeafFile(directory / split / f"{prefix}_{i}_niid_0_keep_0_{split}_9.json", names, n)
                 for split, n in (("train", ntrain), ("test", ntest))}
        for u, name in zip(members, names):
            xtr, ytr, xte, yte = user_samples(rng, u, int(counts[u]))
            files["train"].user(name, xtr, ytr)
            files["test"].user(name, xte, yte)
        for f in files.values():
            f.close()
        totals["train"] += sum(ntrain)
        totals["test"] += sum(ntest)
    return {**totals, "users": size.users, "samples_per_user": {"min": int(counts.min()), "max": int(counts.max()),
                                                                "mean": float(counts.mean())}}


# FEMNIST pixels as LEAF's floats in [0, 1], two decimals: a fixed-width table of the 101 levels, "0.00".."1.00"
_LEVELS = np.array([list(f"{k / 100:.2f}".encode()) for k in range(101)], dtype=np.uint8)  # (101, 4)


def pixels_json(q: np.ndarray) -> bytes:
    """``(n, 784)`` levels 0..100 -> ``[[0.51,1.00,...],[...]]`` (LEAF's x), built as one byte array."""
    n, d = q.shape
    cells = np.empty((n, d, 5), dtype=np.uint8)  # each number 4 bytes and a comma
    cells[:, :, :4] = _LEVELS[q]
    cells[:, :, 4] = ord(",")
    buf = np.empty((n, d * 5 + 2), dtype=np.uint8)  # a row's numbers, its last comma a "]", then ",["
    buf[:, : d * 5] = cells.reshape(n, d * 5)
    buf[:, d * 5 - 1] = ord("]")
    buf[:, d * 5] = ord(",")
    buf[:, d * 5 + 1] = ord("[")
    return b"[[" + buf.tobytes()[:-2] + b"]" if n else b"[]"


def write_femnist(directory: Path, users: int = PAPER["femnist"].users,
                  mean_samples: float = PAPER["femnist"].mean_samples, seed: int = 0, users_per_file: int = 100
                  ) -> Path:
    """A FEMNIST stand-in (module docstring): class c is a blocky 28×28 glyph (ink 0.1 on background 1.0, 4×4
    blocks of a random 7×7 pattern), each sample adding Gaussian noise (σ = 0.25), clipped to [0, 1]; labels
    uniform over the 62 classes; at least 10 samples a writer."""
    size = Size(users, mean_samples)
    params = {"kind": "femnist", **asdict(size), "seed": seed, "users_per_file": users_per_file}

    def write(tmp: Path) -> dict:
        glyphs = np.kron(np.random.default_rng([seed, 1]).random((62, 7, 7)) < 0.4, np.ones((4, 4)))
        patterns = np.where(glyphs.reshape(62, 784) > 0, 0.1, 1.0).astype(np.float32)  # (62, 784)

        def samples(rng: np.random.Generator, user: int, n: int):
            y = rng.integers(0, 62, n)
            x = patterns[y] + 0.25 * rng.standard_normal((n, 784), dtype=np.float32)
            q = np.rint(np.clip(x, 0, 1) * 100).astype(np.intp)  # (n, 784) levels
            t = leaf_train_count(n)
            return pixels_json(q[:t]), y[:t].tolist(), pixels_json(q[t:]), y[t:].tolist()

        return write_leaf(tmp, "all_data", size, users_per_file, 10, 4.0, seed, lambda u: f"standin_f{u:04d}",
                          samples) | {"classes": 62}

    return cached(directory, params, write)


def write_shakespeare(directory: Path, users: int = PAPER["shakespeare"].users,
                      mean_samples: float = PAPER["shakespeare"].mean_samples, seed: int = 0,
                      users_per_file: int = 100) -> Path:
    """A Shakespeare stand-in (module docstring): one script of 1,024 characters drawn from LEAF's vocabulary
    (letters and spaces mostly), read cyclically by each role from its own offset with 1 character in 20 replaced
    by a random one; sequence i is characters i..i+79, its label character i+80 (LEAF's windows). At least 2
    sequences a role; the counts spread widely, as roles' lines do (Gamma shape 1.5)."""
    size = Size(users, mean_samples)
    params = {"kind": "shakespeare", **asdict(size), "seed": seed, "users_per_file": users_per_file}
    vocab = np.array(list(ALL_LETTERS))

    def write(tmp: Path) -> dict:
        weights = np.array([6.0 if c.isalpha() else 12.0 if c == " " else 0.5 for c in ALL_LETTERS])
        script = np.random.default_rng([seed, 2]).choice(len(vocab), 1024, p=weights / weights.sum())

        def samples(rng: np.random.Generator, user: int, n: int):
            idx = script[(rng.integers(len(script)) + np.arange(n + SEQ_LEN)) % len(script)]
            noisy = rng.random(len(idx)) < 0.05
            idx[noisy] = rng.integers(0, len(vocab), int(noisy.sum()))
            text = "".join(vocab[idx])
            x = [text[i: i + SEQ_LEN] for i in range(n)]
            y = list(text[SEQ_LEN: SEQ_LEN + n])
            t = leaf_train_count(n)
            return json.dumps(x[:t]).encode(), y[:t], json.dumps(x[t:]).encode(), y[t:]

        return write_leaf(tmp, "all_data", size, users_per_file, 2, 1.5, seed,
                          lambda u: f"STANDIN_PLAY_{u // 40:02d}_ROLE_{u:04d}", samples) | {"classes": len(vocab)}

    return cached(directory, params, write)


# ---- UCI HAR -------------------------------------------------------------------------------------------------

def write_har(directory: Path, users: int = PAPER["har"].users, mean_samples: float = PAPER["har"].mean_samples,
              seed: int = 0) -> Path:
    """A UCI HAR stand-in (module docstring): subjects 1..``users``, UCI's test subjects in ``test/``, the rest
    in ``train/``, each subject's samples in a row; activity a's features are its fixed random vector in
    [-0.8, 0.8]^561, plus the subject's offset (σ = 0.1) and each sample's noise (σ = 0.35), clipped to [-1, 1];
    activities 1..6 uniform; at least 24 samples a subject."""
    size = Size(users, mean_samples)
    params = {"kind": "har", **asdict(size), "seed": seed}

    def write(tmp: Path) -> dict:
        rng = np.random.default_rng(seed)
        counts = sample_counts(users, mean_samples, rng, 24, 20.0)
        patterns = rng.uniform(-0.8, 0.8, (6, 561)).astype(np.float32)
        totals = {}
        for split in ("train", "test"):
            subjects = [s for s in range(1, users + 1) if (s in UCI_TEST_SUBJECTS) == (split == "test")]
            (tmp / split).mkdir()
            with open(tmp / split / f"X_{split}.txt", "w") as fx, open(tmp / split / f"y_{split}.txt", "w") as fy, \
                    open(tmp / split / f"subject_{split}.txt", "w") as fs:
                for s in subjects:
                    n = int(counts[s - 1])
                    y = rng.integers(0, 6, n)
                    offset = 0.1 * rng.standard_normal(561, dtype=np.float32)
                    x = np.clip(patterns[y] + offset + 0.35 * rng.standard_normal((n, 561), dtype=np.float32), -1, 1)
                    np.savetxt(fx, x, fmt="% .7e", delimiter=" ")
                    fy.write("".join(f"{a + 1}\n" for a in y))
                    fs.write(f"{s}\n" * n)
            totals[split] = int(sum(counts[s - 1] for s in subjects))
        return {**totals, "users": users, "classes": 6,
                "samples_per_user": {"min": int(counts.min()), "max": int(counts.max()), "mean": float(counts.mean())}}

    return cached(directory, params, write)


WRITERS = {"cifar10": write_cifar10, "femnist": write_femnist, "shakespeare": write_shakespeare, "har": write_har}


def standin(kind: str, cache: Path, size: Size | None = None, seed: int = 0) -> Path:
    """The stand-in ``kind`` at ``size`` (the paper's by default) under ``cache``, in a directory named by its
    parameters (``femnist-2414x232.8-s0``), written on first use."""
    if kind not in WRITERS:
        raise ValueError(f"no stand-in {kind!r}; there are: {', '.join(sorted(WRITERS))}")
    if kind == "cifar10":  # the name bench_scale.py's stand-in always had (other benchmarks share it)
        return write_cifar10(Path(cache) / ("cifar-standin" if seed == 0 else f"cifar-standin-s{seed}"), seed)
    size = size or PAPER[kind]
    return WRITERS[kind](Path(cache) / f"{kind}-{size.users}x{size.mean_samples:g}-s{seed}", size.users,
                         size.mean_samples, seed)
