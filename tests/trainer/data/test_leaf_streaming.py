"""LEAF's JSON read a file at a time (trainer.data.leaf.read_leaf, issue #45): each file's chosen users become
arrays before the next file is parsed, a user split across files is joined in file order, and the estimate's
reading term is one file's parse, not every file's (FEMNIST at the paper's size was refused on a 16 GB host)."""

import json

import numpy as np

from edgemask.trainer.data.base import DataConfig
from edgemask.trainer.data.leaf import PARSED_PER_BYTE, femnist_sizes, read_leaf


def write(path, users):
    path.write_text(json.dumps({"users": list(users), "num_samples": [len(v[1]) for v in users.values()],
                                "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}}))


def test_each_file_is_converted_before_the_next_and_a_split_user_is_joined_in_order(tmp_path):
    (tmp_path / "train").mkdir()
    write(tmp_path / "train" / "a.json", {"w1": ([[1.0], [2.0]], [0, 1]), "w2": ([[5.0]], [2])})
    write(tmp_path / "train" / "b.json", {"w1": ([[3.0]], [1]), "w3": ([[9.0]], [3])})
    calls = []

    def convert(where, user, x, y):
        calls.append((where.name, user, len(x)))
        return np.asarray(x, dtype=np.float32), np.asarray(y, dtype=np.int64)

    got = read_leaf(tmp_path, "train", "femnist", "hint", lambda users: ["w1", "w2"], convert)
    assert calls == [("train", "w1", 2), ("train", "w2", 1), ("train", "w1", 1)]  # a.json's users, then b.json's
    assert got["w1"][0].ravel().tolist() == [1.0, 2.0, 3.0] and got["w1"][1].tolist() == [0, 1, 1]
    assert set(got) == {"w1", "w2"}


def test_the_reading_term_is_one_files_parse(tmp_path):
    for split in ("train", "test"):
        (tmp_path / split).mkdir()
        for i in range(4):
            write(tmp_path / split / f"{i}.json", {f"u{i}": ([[0.5] * 784], [1])})
    biggest = max(p.stat().st_size for p in tmp_path.rglob("*.json"))
    sizes = femnist_sizes(DataConfig(name="femnist", root=str(tmp_path), num_clients=4, partition="natural"), 0)
    assert sizes.read == 2 * PARSED_PER_BYTE["femnist"] * biggest  # not × every file's bytes
