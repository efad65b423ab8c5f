"""The run directory (docs/contracts.md): writer, loader, and the rebuild of any client's model.

```
runs/<run-id>/config.toml  model.safetensors  clients/<client-id>.safetensors  history.parquet  summary.json
```
Checkpoints are safetensors: loading never unpickles anything.
"""

from __future__ import annotations

import contextlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load_file as np_load_file
from safetensors.numpy import save_file as np_save_file

from edgemask.errors import CorruptFileError, EdgemaskError
from edgemask.fileio import (atomic_dir, atomic_path, exclusive_lock, remove_stale_temporaries, write_json_atomic,
                             write_text_atomic)
from edgemask.workspace import check_name
from trainer.config import TrainConfig
from trainer.masks import pack_bits, unpack_bits
from trainer.records import ClientState

REQUIRED = ("config.toml", "model.safetensors", "summary.json")


def save_state_dict(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    arrays = {k: v.detach().cpu().contiguous().numpy() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        np_save_file(arrays, str(tmp), metadata=metadata)


def _load_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if not path.is_file():
        raise EdgemaskError(f"{path}: file not found")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            meta = f.metadata() or {}
        return np_load_file(str(path)), meta
    except (SafetensorError, OSError, ValueError) as e:
        raise CorruptFileError(f"{path}: not a readable safetensors checkpoint ({e}); re-run the stage that "
                               f"wrote it") from None


def save_client(path: Path, state: ClientState) -> None:
    tensors: dict[str, Any] = {}
    shapes = {}
    for name, m in state.masks.items():
        tensors[f"mask.{name}"] = torch.from_numpy(pack_bits(m))
        shapes[name] = list(m.shape)
    for name, p in state.params.items():
        tensors[f"param.{name}"] = p.float()
    save_state_dict(path, tensors, {"mask_shapes": json.dumps(shapes)})


def load_client(path: Path) -> ClientState:
    """A client file as :func:`save_client` writes it: ``mask.<param>`` packed bits whose shapes the metadata
    ``mask_shapes`` records (``{}`` for a client without masks), ``param.<param>`` personal parameters.

    A file without that metadata, or with tensors it does not describe, is refused: read without its masks it
    would pass for the dense model (issue #19)."""
    arrays, meta = _load_safetensors(path)
    if "mask_shapes" not in meta:
        raise CorruptFileError(f"{path}: no 'mask_shapes' metadata, so its masks cannot be read; it is not a client "
                               "file written by `edgemask train`: re-train the run")
    try:
        shapes = json.loads(meta["mask_shapes"])
        masks = {n: unpack_bits(arrays[f"mask.{n}"], tuple(s)) for n, s in shapes.items()}
    except (KeyError, ValueError, TypeError, AttributeError) as e:
        raise CorruptFileError(f"{path}: masks do not match their recorded shapes ({e})") from None
    known = {f"mask.{n}" for n in shapes}
    stray = sorted(k for k in arrays if k not in known and not k.startswith("param."))
    if stray:
        raise CorruptFileError(f"{path}: tensor {stray[0]!r} is neither a recorded mask nor a personal "
                               "parameter; re-train the run")
    params = {k[len("param."):]: torch.from_numpy(v.copy()) for k, v in arrays.items() if k.startswith("param.")}
    return ClientState(masks, params)


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run directory edgemask wrote (it holds the contract's required files)."""
    return path.is_dir() and all((path / f).is_file() for f in REQUIRED)


@contextlib.contextmanager
def run_lock(path: Path, wait_s: float = 0.0) -> Iterator[Path]:
    """Hold the lock of run directory ``path``'s writers (``runs/.<run-id>.lock``) for the block: one ``edgemask
    train`` of a run id at a time; a second one waits ``wait_s`` seconds, then leaves with a one-line reason.
    Taken before the first round, it also proves ``runs/`` writable before any training (the lock file is created
    and written). Holding it, the temporaries a killed writer of this run left are removed."""
    path = Path(path)
    with exclusive_lock(path.with_name(f".{path.name}.lock"), f"run {path.name}", wait_s):
        remove_stale_temporaries(path)
        yield path


def _file_bytes(tensors: Iterable[torch.Tensor], bits: bool = False) -> int:
    """Bytes a safetensors file of these tensors holds: float32 values, or packed bits (a mask), plus headers."""
    body = sum((t.numel() + 7) // 8 if bits else t.numel() * 4 for t in tensors)
    return body + 1024  # the JSON header: names, shapes, offsets, metadata


def check_room(path: Path, shared: dict[str, torch.Tensor], one_client: ClientState, n_clients: int,
               history_rows: int) -> None:
    """Refuse, before any training, a run that will not fit on ``path``'s disk.

    The new run is assembled beside the old one (which stays until the rename), so it needs its whole size free:
    the shared model, ``n_clients`` client files the size of ``one_client``'s, and the history (at most 32 bytes a
    row before compression), each file rounded up to the file system's block. A rough upper estimate: a run that
    passes may still meet a disk filled meanwhile, which :func:`write_run` reports in one line.
    """
    import os
    import shutil

    root = path.parent
    while not root.exists():  # runs/ itself may not exist yet
        root = root.parent
    block = max(os.statvfs(root).f_frsize, 1)

    def on_disk(n: int) -> int:
        return -(-n // block) * block

    client = on_disk(_file_bytes(one_client.masks.values(), bits=True) + _file_bytes(one_client.params.values()))
    need = (on_disk(_file_bytes(shared.values())) + n_clients * client + on_disk(32 * history_rows)
            + 4 * on_disk(16 << 10) + 2 * block)  # config, summary, the directories
    free = shutil.disk_usage(root).free
    if need > free:
        raise EdgemaskError(f"{path}: the run needs about {need >> 10} KiB and {root} has {free >> 10} KiB free; "
                            f"free some space or train into another --workspace (checked before training)")


def write_run(path: Path, config: TrainConfig, model_state: dict[str, torch.Tensor],
              clients: dict[str, ClientState], history: Iterable[dict[str, Any]], summary: dict[str, Any]) -> Path:
    """Write a complete run directory. It is assembled under a temporary name unique to this process and renamed
    into place, so a stopped run never leaves a half-written directory under the real name and a run already
    there stays whole until the new one replaces it. ``path`` must be a plain name (never ``runs/..``); an
    existing ``path`` that is not a run directory is refused, never removed (:func:`edgemask.fileio.atomic_dir`).
    A full disk is one ``EdgemaskError`` naming the run, with no temporary left behind."""
    import pandas as pd

    path = Path(path)
    check_name(path.name, f"run id of {path}")
    for cid in clients:
        check_name(cid, f"client id of run {path.name}")
    with atomic_dir(path, is_run_dir, "an edgemask run directory") as tmp:
        (tmp / "clients").mkdir()
        write_text_atomic(tmp / "config.toml", config.to_toml())
        save_state_dict(tmp / "model.safetensors", {k: v.float() if v.is_floating_point() else v
                                                    for k, v in model_state.items()})
        for cid, st in clients.items():
            save_client(tmp / "clients" / f"{cid}.safetensors", st)
        df = pd.DataFrame(list(history), columns=["round", "client", "metric", "value"])
        df = df.astype({"round": "int64", "client": "string", "metric": "string", "value": "float64"})
        df.to_parquet(tmp / "history.parquet", index=False)
        write_json_atomic(tmp / "summary.json", summary)
    return path


class Run:
    """A run directory, read lazily. ``build_model(client_id)`` rebuilds that client's personalized model."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise EdgemaskError(f"run directory {self.path} not found; train one with `edgemask train` "
                                f"(or `edgemask demo`) or pass the right --run")
        for f in REQUIRED:
            if not (self.path / f).is_file():
                raise CorruptFileError(f"{self.path / f}: missing; {self.path} is not a complete run directory")
        self.config = TrainConfig.load(self.path / "config.toml")

    @property
    def run_id(self) -> str:
        return self.path.name

    @cached_property
    def summary(self) -> dict[str, Any]:
        f = self.path / "summary.json"
        try:
            return json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptFileError(f"{f}: not valid JSON ({e})") from None

    @cached_property
    def model_state(self) -> dict[str, torch.Tensor]:
        arrays, _ = _load_safetensors(self.path / "model.safetensors")
        return {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}

    @property
    def client_ids(self) -> list[str]:
        return sorted(p.stem for p in (self.path / "clients").glob("*.safetensors"))

    def client_state(self, client_id: str) -> ClientState:
        f = self.path / "clients" / f"{check_name(client_id, f'client id of run {self.run_id}')}.safetensors"
        if not f.is_file():
            raise EdgemaskError(f"{f}: no such client in run {self.run_id}; clients: "
                                f"{', '.join(self.client_ids) or '(none)'}")
        return load_client(f)

    def history(self):
        import pandas as pd

        f = self.path / "history.parquet"
        try:
            return pd.read_parquet(f)
        except (OSError, ValueError) as e:
            raise CorruptFileError(f"{f}: not a readable Parquet file ({e})") from None

    @cached_property
    def dataset(self):
        from trainer.data import build_dataset

        return build_dataset(self.config.data, self.config.run.seed)

    def build_model(self, client_id: str | None = None):
        """The client's personalized model as a :class:`MaskedModel` (binary masks, personal params loaded).
        ``client_id=None`` gives the dense model: the shared weights with no mask (the export baseline)."""
        from trainer.models import MaskedModel, build_model, model_sites

        ds = self.dataset
        base = build_model(self.config.model.name, ds.input_shape, ds.num_classes, **self.config.model.args)
        state = dict(self.model_state)
        masks: dict[str, torch.Tensor] = {}
        if client_id is not None:
            cs = self.client_state(client_id)
            state.update(cs.params)
            masks = cs.masks
        try:
            base.load_state_dict(state, strict=True)
        except RuntimeError as e:
            raise CorruptFileError(f"{self.path}: weights do not fit model {self.config.model.name!r} "
                                   f"({str(e).splitlines()[0]})") from None
        sites = model_sites(base)
        params = dict(base.named_parameters())
        for name, m in masks.items():
            site = next((s for s in sites if name in s.weights), None)
            if site is None or tuple(m.shape) != site.mask_shape(params[name]):
                raise CorruptFileError(f"{self.path}/clients/{client_id}.safetensors: mask {name!r} of shape "
                                       f"{tuple(m.shape)} does not fit model {self.config.model.name!r}")
        return MaskedModel(base.eval(), sites, masks)


def load_run(path: str | Path) -> Run:
    return Run(Path(path))
