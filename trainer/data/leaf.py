"""LEAF's FEMNIST and Shakespeare (Caldas et al., "LEAF: A Benchmark for Federated Settings") from their JSON.

LEAF writes ``train/*.json`` and ``test/*.json``, each ``{"users": [...], "num_samples": [...],
"user_data": {user: {"x": [...], "y": [...]}}}``, every user's samples already split between the two. A client
is one user — a FEMNIST writer, a Shakespeare role — with its LEAF train and test samples (FedMask §4.1: natural
split). ``cfg.num_clients`` users are taken in sorted order (all of them if there are fewer), or a seeded random
sample with ``cfg.options["users"] = "random"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from edgemask.errors import ConfigError, CorruptFileError
from edgemask.trainer.data.base import DATASETS, SIZES, DataConfig, DataSizes, DatasetMissingError, FederatedDataset
from edgemask.trainer.data.clients import natural_clients, pick_users
from edgemask.trainer.data.files import dataset_root, find_dir

# LEAF's Shakespeare vocabulary (leaf/models/utils/language_utils.py): 80 characters, index = position.
ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
SEQ_LEN = 80
_CHAR_INDEX = {c: i for i, c in enumerate(ALL_LETTERS)}

User = tuple[list, list]  # (x, y) as stored


def _json_files(directory: Path, dataset: str, hint: str) -> list[Path]:
    files = sorted(directory.glob("*.json"))
    if not files:
        raise DatasetMissingError(f"{dataset}: no *.json in {directory}; put {hint} there")
    return files


def _load(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        users, user_data = d["users"], d["user_data"]
        if not isinstance(users, list) or not isinstance(user_data, dict):
            raise TypeError("users must be a list and user_data a mapping")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CorruptFileError(f"{path}: not a LEAF JSON file ({type(e).__name__}: {e}); "
                               "rerun LEAF's preprocessing") from None
    return d


def read_leaf(root: Path, split: str, dataset: str, hint: str, choose: Callable[[list[str]], list[str]],
              convert: Callable[[Path, str, list, list], tuple[np.ndarray, np.ndarray]]
              ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{user: (x, y)}`` as arrays (``convert(where, user, x, y)``) for the users ``choose`` picks from all users of
    ``root/split/*.json``. Files are parsed once to learn the users, and again only where they hold a chosen user,
    one file at a time: a user's samples become arrays as its file is read, so the host holds one file's parsed
    objects at once, not every chosen user's (FEMNIST's 562,000 images as Python floats would be 14 GB: issue #45).
    """
    files = _json_files(find_dir(root, split, dataset, hint), dataset, hint)
    owners: dict[str, set[Path]] = {}
    for path in files:
        for u in _load(path)["users"]:
            owners.setdefault(str(u), set()).add(path)
    chosen = set(choose(list(owners)))
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for path in sorted(set().union(*(owners[u] for u in chosen if u in owners))):
        d = _load(path)
        for u in sorted(chosen.intersection(map(str, d["user_data"]))):
            rec = d["user_data"][u]
            try:
                x, y = rec["x"], rec["y"]
            except (KeyError, TypeError):
                raise CorruptFileError(f"{path}: user_data[{u!r}] has no 'x' and 'y'") from None
            if len(x) != len(y):
                raise CorruptFileError(f"{path}: user {u!r} has {len(x)} x but {len(y)} y")
            parts.setdefault(u, []).append(convert(path.parent, u, list(x), list(y)))
        del d
    return {u: ps[0] if len(ps) == 1 else (np.concatenate([p[0] for p in ps]), np.concatenate([p[1] for p in ps]))
            for u, ps in parts.items()}


def _natural(cfg: DataConfig, seed: int, hint: str,
             convert: Callable[[Path, str, list, list], tuple[np.ndarray, np.ndarray]]):
    if cfg.partition != "natural":
        raise ConfigError(f"{cfg.name}: data.partition must be 'natural' (one LEAF user per client), "
                          f"got {cfg.partition!r}")
    base = dataset_root(cfg.root, cfg.name, hint)
    picked: list[str] = []  # filled from the train users, reused for test

    def choose(users: list[str]) -> list[str]:
        picked[:] = pick_users(users, cfg, seed)
        return picked

    train = read_leaf(base, "train", cfg.name, hint, choose, convert)
    test = read_leaf(base, "test", cfg.name, hint, lambda users: picked, convert)
    rows = []
    for u in picked:
        xtr, ytr = train[u]
        xte, yte = test[u] if u in test else convert(base / "test", u, [], [])
        rows.append((u, xtr, ytr, xte, yte))
    return natural_clients(rows)


FEMNIST_HINT = "LEAF's FEMNIST JSON (train/*.json and test/*.json from leaf/data/femnist)"


def _femnist_arrays(where: Path, user: str, x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    try:
        xa = np.asarray(x, dtype=np.float32).reshape(-1, 1, 28, 28)  # (N, 1, 28, 28), LEAF's [0, 1] pixels
        ya = np.asarray(y, dtype=np.int64).reshape(-1)
    except (ValueError, TypeError) as e:
        raise CorruptFileError(f"{where}: FEMNIST user {user!r} is not 784 pixels per sample ({e})") from None
    if len(ya) and (ya.min() < 0 or ya.max() > 61):
        raise CorruptFileError(f"{where}: FEMNIST user {user!r} has label {int(ya.max())} outside 0..61")
    return xa, ya


@DATASETS.register("femnist")
def femnist(cfg: DataConfig, seed: int) -> FederatedDataset:
    """FEMNIST: 62 classes (10 digits, 26 upper-, 26 lower-case letters), 28×28 grayscale as LEAF stores them,
    shape (1, 28, 28); one writer per client."""
    return FederatedDataset("femnist", (1, 28, 28), 62, _natural(cfg, seed, FEMNIST_HINT, _femnist_arrays))


SHAKESPEARE_HINT = "LEAF's Shakespeare JSON (train/*.json and test/*.json from leaf/data/shakespeare)"


def encode(text: str, where: Path, user: str) -> list[int]:
    """Characters -> indices into :data:`ALL_LETTERS` (LEAF's ``word_to_indices``), refusing unknown ones."""
    try:
        return [_CHAR_INDEX[c] for c in text]
    except KeyError as e:
        raise CorruptFileError(f"{where}: Shakespeare user {user!r} has character {e.args[0]!r} outside "
                               "LEAF's 80-character vocabulary") from None


def _shakespeare_arrays(where: Path, user: str, x: list, y: list) -> tuple[np.ndarray, np.ndarray]:
    if any(not isinstance(s, str) or len(s) != SEQ_LEN for s in x) or any(
            not isinstance(c, str) or len(c) != 1 for c in y):
        raise CorruptFileError(f"{where}: Shakespeare user {user!r} needs x of {SEQ_LEN}-character strings "
                               "and y of single characters")
    xa = np.asarray([encode(s, where, user) for s in x], dtype=np.int64).reshape(-1, SEQ_LEN)  # (N, 80)
    ya = np.asarray([encode(c, where, user)[0] for c in y], dtype=np.int64)  # (N,)
    return xa, ya


@DATASETS.register("shakespeare")
def shakespeare(cfg: DataConfig, seed: int) -> FederatedDataset:
    """Shakespeare next-character prediction: x = 80 characters as int64 indices (N, 80), y = the next
    character's index; 80 classes; one role per client."""
    return FederatedDataset("shakespeare", (SEQ_LEN,), len(ALL_LETTERS),
                            _natural(cfg, seed, SHAKESPEARE_HINT, _shakespeare_arrays), input_dtype="int64")


# The fewest bytes a sample takes in LEAF's JSON: FEMNIST's 784 pixels at 2 bytes each at least ("0,"),
# Shakespeare's 80-character string and its one-character label with their quotes and commas.
MIN_JSON_BYTES = {"femnist": 784 * 2, "shakespeare": SEQ_LEN + 3 + 4}
# Python objects per JSON byte once parsed, at most: a number of 2 bytes becomes a float and a list slot (32 bytes);
# a Shakespeare sample of 87 bytes, its string (49 + 80 bytes) and, encoded, 81 int slots and 2 lists (~850 bytes).
PARSED_PER_BYTE = {"femnist": 16, "shakespeare": 10}


def leaf_sizes(cfg: DataConfig, input_shape: tuple[int, ...], num_classes: int, hint: str,
               input_dtype: str = "float32") -> DataSizes:
    """A LEAF dataset's sizes from its JSON files' lengths alone (JSON has no header: parsing them is the
    reading itself): samples at most the files' bytes over a sample's fewest bytes (:data:`MIN_JSON_BYTES`).
    Reading parses a file at a time and converts its chosen users' samples to arrays before the next
    (:func:`read_leaf`): one file's parsed objects (:data:`PARSED_PER_BYTE`) and their conversion, a loose bound."""
    if cfg.partition != "natural":
        raise ConfigError(f"{cfg.name}: data.partition must be 'natural' (one LEAF user per client), "
                          f"got {cfg.partition!r}")
    base = dataset_root(cfg.root, cfg.name, hint)
    files = [f for split in ("train", "test") for f in _json_files(find_dir(base, split, cfg.name, hint), cfg.name,
                                                                     hint)]
    sizes = [f.stat().st_size for f in files]
    n = sum(sizes) // MIN_JSON_BYTES[cfg.name]
    parsed = PARSED_PER_BYTE[cfg.name]
    return DataSizes(input_shape, num_classes, 0, 0, cfg.num_clients, test_pool=n,
                     read=2 * parsed * max(sizes, default=0), input_dtype=input_dtype, largest_part=n)


@SIZES.register("femnist")
def femnist_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    return leaf_sizes(cfg, (1, 28, 28), 62, FEMNIST_HINT)


@SIZES.register("shakespeare")
def shakespeare_sizes(cfg: DataConfig, seed: int) -> DataSizes:
    return leaf_sizes(cfg, (SEQ_LEN,), len(ALL_LETTERS), SHAKESPEARE_HINT, "int64")
