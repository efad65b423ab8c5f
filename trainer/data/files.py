"""Finding a real dataset's files under ``DataConfig.root``, with one-line errors that say what to put where."""

from __future__ import annotations

from pathlib import Path

from edgemask.trainer.data.base import DatasetMissingError


def dataset_root(root: str | Path | None, dataset: str, hint: str, field: str = "data.root") -> Path:
    """The directory a real dataset lives in; ``hint`` names the files it should hold, ``field`` the setting."""
    if root is None:
        raise DatasetMissingError(f"{dataset}: {field} is not set; point it at a directory holding {hint}")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise DatasetMissingError(f"{dataset}: directory {path} not found; create it and put {hint} there")
    return path


def find_file(root: Path, names: list[str], dataset: str, hint: str, subdirs: tuple[str, ...] = ("",)) -> Path:
    """The first of ``names`` found in ``root`` or one of its ``subdirs``; otherwise a one-line error."""
    for sub in subdirs:
        for name in names:
            p = root / sub / name if sub else root / name
            if p.is_file():
                return p
    raise DatasetMissingError(f"{dataset}: {names[0]} not found in {root}; put {hint} there")


def find_dir(root: Path, name: str, dataset: str, hint: str) -> Path:
    p = root / name
    if not p.is_dir():
        raise DatasetMissingError(f"{dataset}: directory {p} not found; put {hint} there")
    return p
