"""Atomic file writes: write to a temporary name beside the target, then rename.

A reader never sees a half-written file under the real name, whatever stops the writer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it onto ``target`` only if the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_bytes_atomic(target: str | os.PathLike[str], data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(target: str | os.PathLike[str], text: str) -> None:
    write_bytes_atomic(target, text.encode("utf-8"))


def write_json_atomic(target: str | os.PathLike[str], obj: Any) -> None:
    write_text_atomic(target, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()
