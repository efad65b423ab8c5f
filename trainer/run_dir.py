"""The run directory (docs/contracts.md): writer, loader, and the rebuild of any client's model.

```
runs/<run-id>/config.toml  model.safetensors  clients/<client-id>.safetensors  history.parquet  summary.json
               digests.json
```
Checkpoints are safetensors: loading never unpickles anything.

``digests.json`` records the sha256 of every other file, written last at train time. :class:`Run` reads each file
once, into memory, and checks those bytes against it before parsing them: a flipped byte in a client's mask
(issue #27) is refused instead of exported, and what export hashes is exactly what it read.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import struct
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import save_file as np_save_file

from edgemask.errors import CorruptFileError, EdgemaskError
from edgemask.fileio import (atomic_dir, atomic_path, file_lock, remove_stale_temporaries, sha256_file,
                             write_json_atomic, write_text_atomic)
from edgemask.workspace import check_name
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.masks import pack_bits, unpack_bits
from edgemask.trainer.records import ClientState

REQUIRED = ("config.toml", "model.safetensors", "summary.json")
DIGESTS = "digests.json"  # {"schema": 1, "sha256": {relative path: hex digest}} of every other file of the run
DIGESTS_SCHEMA = 1
_RETRAIN = "re-train the run (`edgemask train`)"


def save_state_dict(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    arrays = {k: v.detach().cpu().contiguous().numpy() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        np_save_file(arrays, str(tmp), metadata=metadata)


def _load_safetensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if not path.is_file():
        raise EdgemaskError(f"{path}: file not found")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise CorruptFileError(f"{path}: cannot read it ({e.strerror}); re-run the stage that wrote it") from None
    return _parse_safetensors(data, path)


def _parse_safetensors(data: bytes, path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors and the metadata of a safetensors file's bytes (``path`` names it in the message). The format:
    an 8-byte little-endian header length, a JSON header (``__metadata__``: a string map), the tensors' bytes."""
    from safetensors.numpy import load as np_load

    try:
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        meta = header.get("__metadata__") or {}
        if not isinstance(meta, dict):
            raise ValueError("__metadata__ is not a string map")
        return np_load(data), meta
    except (SafetensorError, struct.error, ValueError, UnicodeDecodeError, AttributeError, OSError) as e:
        raise CorruptFileError(f"{path}: not a readable safetensors checkpoint ({' '.join(str(e).split())}); "
                               f"re-run the stage that wrote it") from None


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
    return _client_from(*_load_safetensors(path), path)


def _client_from(arrays: dict[str, np.ndarray], meta: dict[str, str], path: Path) -> ClientState:
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
    and written). Holding it, the temporaries a killed writer of this run left are removed.

    ``edgemask export`` takes the same lock shared (:func:`run_read_lock`), so a run is never replaced while it is
    exported, nor exported while it is trained (issue #27)."""
    path = Path(path)
    with file_lock(run_lock_path(path), f"run {path.name}", wait_s):
        remove_stale_temporaries(path)
        yield path


def run_lock_path(path: Path) -> Path:
    """``runs/.<run-id>.lock`` beside the run directory ``path``, symlinks resolved: a run reached through a link
    (``runs/alias -> demo``, a linked ``runs/``) takes the same lock as through its real path."""
    real = Path(path).resolve()
    return real.parent / f".{real.name}.lock"


@contextlib.contextmanager
def run_read_lock(path: Path, wait_s: float = 0.0) -> Iterator[Path]:
    """Hold run directory ``path``'s lock shared for the block (readers: ``edgemask export``): any number of
    readers, and no ``edgemask train`` of that run id meanwhile; a training in progress makes this wait
    ``wait_s`` seconds, then leave with a one-line reason. Yields the run directory's real path."""
    real = Path(path).resolve()
    with file_lock(run_lock_path(real), f"run {real.name} (being trained)", wait_s, shared=True, create=False):
        yield real


def _file_bytes(tensors: Iterable[torch.Tensor], bits: bool = False) -> int:
    """Bytes a safetensors file of these tensors holds: float32 values, or packed bits (a mask), plus headers."""
    body = sum((t.numel() + 7) // 8 if bits else t.numel() * 4 for t in tensors)
    return body + 1024  # the JSON header: names, shapes, offsets, metadata


def check_room(path: Path, shared: dict[str, torch.Tensor], one_client: ClientState, n_clients: int,
               history_rows: int, store_bytes: int = 0) -> None:
    """Refuse, before any training, a run that will not fit on ``path``'s disk.

    The new run is assembled beside the old one (which stays until the rename), so it needs its whole size free:
    the shared model, ``n_clients`` client files the size of ``one_client``'s, and the history (at most 32 bytes a
    row before compression), each file rounded up to the file system's block. A rough upper estimate: a run that
    passes may still meet a disk filled meanwhile, which :func:`write_run` reports in one line. ``store_bytes``:
    what the run's device store will still write beside it (:mod:`edgemask.trainer.device_store`).
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
            + 4 * on_disk(16 << 10) + 2 * block + store_bytes)  # config, summary, the directories
    free = shutil.disk_usage(root).free
    if need > free:
        raise EdgemaskError(f"{path}: the run needs about {need >> 10} KiB and {root} has {free >> 10} KiB free; "
                            f"free some space or train into another --workspace (checked before training)")


def write_run(path: Path, config: TrainConfig, model_state: dict[str, torch.Tensor],
              clients: Mapping[str, ClientState], history: Iterable[dict[str, Any]],
              summary: dict[str, Any]) -> Path:
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
        write_digests(tmp)  # last: it vouches for the files above
    return path


def write_digests(path: Path) -> dict[str, str]:
    """Write ``path/digests.json``: the sha256 of every file of the run directory ``path`` (``clients/`` included),
    as it is now. :func:`write_run` calls it last; nothing else should (it would vouch for a changed file)."""
    path = Path(path)
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.name != DIGESTS and not p.name.startswith("."))
    digests = {p.relative_to(path).as_posix(): sha256_file(p) for p in files}
    write_json_atomic(path / DIGESTS, {"schema": DIGESTS_SCHEMA, "sha256": digests})
    return digests


def _read_digests(path: Path) -> dict[str, str]:
    f = path / DIGESTS
    try:
        d = json.loads(f.read_bytes())
    except FileNotFoundError:
        raise CorruptFileError(f"{f}: missing, so the run's files cannot be checked (a run written before edgemask "
                               f"recorded digests, or not by `edgemask train`); {_RETRAIN}") from None
    except (OSError, ValueError) as e:
        raise CorruptFileError(f"{f}: not valid JSON ({' '.join(str(e).split())}); {_RETRAIN}") from None
    ok = (isinstance(d, dict) and d.get("schema") == DIGESTS_SCHEMA and isinstance(d.get("sha256"), dict)
          and all(isinstance(k, str) and isinstance(v, str) and len(v) == 64 for k, v in d["sha256"].items()))
    if not ok:
        raise CorruptFileError(f"{f}: not a digest list of schema {DIGESTS_SCHEMA} "
                               '({"schema": 1, "sha256": {file: hex}}); ' + _RETRAIN)
    missing = [r for r in REQUIRED if r not in d["sha256"]]
    if missing:
        raise CorruptFileError(f"{f}: no digest for {missing[0]}; {_RETRAIN}")
    return d["sha256"]


class Run:
    """A run directory, read lazily. ``build_model(client_id)`` rebuilds that client's personalized model.

    Every file is read once into memory and its bytes are checked against ``digests.json`` before they are parsed
    (:meth:`read`); :meth:`digest` is the sha256 of the bytes actually used. :meth:`snapshot` reads a set of files
    up front, so what an export builds from and what it hashes are one consistent state of the run."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise EdgemaskError(f"run directory {self.path} not found; train one with `edgemask train` "
                                f"(or `edgemask demo`) or pass the right --run")
        for f in REQUIRED:
            if not (self.path / f).is_file():
                raise CorruptFileError(f"{self.path / f}: missing; {self.path} is not a complete run directory")
        self.digests = _read_digests(self.path)
        self._bytes: dict[str, bytes] = {}
        text = self.read("config.toml")
        try:
            raw = tomllib.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise CorruptFileError(f"{self.path / 'config.toml'}: not valid TOML: {e}") from None
        self.config = TrainConfig.from_dict(raw, str(self.path / "config.toml"))

    def read(self, rel: str) -> bytes:
        """The bytes of the run's file ``rel`` (``clients/client-000.safetensors``), read once and checked against
        the digest recorded at train time; a file not recorded, missing or changed is refused in one line."""
        if rel in self._bytes:
            return self._bytes[rel]
        f = self.path / rel
        want = self.digests.get(rel)
        if want is None:
            raise CorruptFileError(f"{f}: not among the files {DIGESTS} records for this run (added after training?); "
                                   f"{_RETRAIN}")
        try:
            data = f.read_bytes()
        except FileNotFoundError:
            raise CorruptFileError(f"{f}: missing, though {DIGESTS} records it; {_RETRAIN}") from None
        got = hashlib.sha256(data).hexdigest()
        if got != want:
            raise CorruptFileError(f"{f}: sha256 {got[:12]}... differs from {want[:12]}... recorded in {DIGESTS} at "
                                   f"train time: the file changed after training; {_RETRAIN}")
        self._bytes[rel] = data
        return data

    def digest(self, rel: str) -> str:
        """The sha256 of the bytes of ``rel`` this object read (reading them if not yet)."""
        self.read(rel)
        return self.digests[rel]

    @staticmethod
    def client_file(client_id: str) -> str:
        return f"clients/{client_id}.safetensors"

    def snapshot(self, client_ids: Iterable[str]) -> None:
        """Read (and check) now every file an export of these clients uses: the config (read already), the shared
        weights and each client's file. Later reads use these bytes, whatever happens on disk meanwhile."""
        self.read("model.safetensors")
        for cid in client_ids:
            self.read(self.client_file(check_name(cid, f"client id of run {self.run_id}")))

    @property
    def run_id(self) -> str:
        return self.path.name

    @cached_property
    def summary(self) -> dict[str, Any]:
        f = self.path / "summary.json"
        try:
            return json.loads(self.read("summary.json"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptFileError(f"{f}: not valid JSON ({e})") from None

    @cached_property
    def model_state(self) -> dict[str, torch.Tensor]:
        arrays, _ = _parse_safetensors(self.read("model.safetensors"), self.path / "model.safetensors")
        return {k: torch.from_numpy(v.copy()) for k, v in arrays.items()}

    @property
    def client_ids(self) -> list[str]:
        """The clients ``digests.json`` records (a client file copied in later is not one of them)."""
        return sorted(k[len("clients/"):-len(".safetensors")] for k in self.digests
                      if k.startswith("clients/") and k.endswith(".safetensors") and k.count("/") == 1)

    def client_state(self, client_id: str) -> ClientState:
        rel = self.client_file(check_name(client_id, f"client id of run {self.run_id}"))
        f = self.path / rel
        if client_id not in self.client_ids:
            raise EdgemaskError(f"{f}: no such client in run {self.run_id}; clients: "
                                f"{', '.join(self.client_ids) or '(none)'}")
        return _client_from(*_parse_safetensors(self.read(rel), f), f)

    def history(self):
        import pandas as pd

        f = self.path / "history.parquet"
        data = self.read("history.parquet")
        try:
            return pd.read_parquet(io.BytesIO(data))
        except (OSError, ValueError) as e:
            raise CorruptFileError(f"{f}: not a readable Parquet file ({e})") from None

    @cached_property
    def dataset(self):
        from edgemask.trainer.data import build_dataset

        return build_dataset(self.config.data, self.config.run.seed)

    def build_model(self, client_id: str | None = None):
        """The client's personalized model as a :class:`MaskedModel` (binary masks, personal params loaded).
        ``client_id=None`` gives the dense model: the shared weights with no mask (the export baseline)."""
        from edgemask.trainer.models import MaskedModel, build_model, model_sites

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
