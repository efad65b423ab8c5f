"""Per-device state off the heap (issue #45): what an algorithm keeps for each device between rounds (FedMask's masks
as bits, Ditto's personal model, SCAFFOLD's control variate, ...) lives in files, one record per device at a fixed
offset, read when the device is selected or evaluated and written back after its round. RAM holds a round's devices
and what all devices share, so a run's host memory does not grow with its device count (IC-EMNIST's 2,414 VGG16
devices keep 7.3 MB each: 17.6 GB on the heap, a file here).

```
<store dir>/<table>.bin    record i = device i (the run's client order), ``record_bytes`` each:
                           [1 byte: held] [1 byte per field: held] [fields, each 8-byte aligned, C order]
<store dir>/<table>.json   {"schema": 1, "clients": [...], "fields": [[name, shape, dtype], ...], "record_bytes": n}
```

A ``bool`` field is stored packed, 8 elements a byte (numpy's big bit order, the layout of
:func:`edgemask.trainer.masks.pack_rows`); every other dtype as its bytes. A table's layout is fixed by its first
write (or given): a later write of another shape or dtype is a bug, refused. A field a device's record does not hold
reads as absent (FedMask's unpruned layers have no pruning structure).

Why positioned reads and writes (``os.preadv`` / ``os.pwrite``) and not ``numpy.memmap``: the same fixed offsets, but
a mapping's resident pages count in the process's RSS (and the set-up writes every device's record once), whereas
the page cache behind ``pread`` is the kernel's, reclaimed under pressure; a record is a few large fields, so one
system call each way costs nothing next to a round's training.

Without a directory (a unit test's algorithm, a benchmark's ``simulate``) each table is an anonymous temporary file,
unlinked as it is created: nothing is left behind, even by a killed process. ``edgemask train`` keeps the store in a
temporary directory beside the run's (:func:`edgemask.fileio.atomic_dir`'s pattern, so a killed run's store is removed
by the next training of the run id); the run directory itself is written as before (docs/contracts.md).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from edgemask.errors import EdgemaskError
from edgemask.fileio import disk_full, temporary_beside, write_json_atomic

LAYOUT_SCHEMA = 1
EVAL_PART_BYTES = 256 << 20  # per-device state an evaluation reads from the store at once, at most (simulation)
ALIGN = 8
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                                                      torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                                                      torch.bool)}


@dataclass(frozen=True)
class Field:
    """One tensor of a device's record: its ``shape`` and ``dtype``, at ``offset`` in the record, ``nbytes`` long
    (a bool tensor packed: ⌈numel / 8⌉ bytes)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int

    @staticmethod
    def size(shape: tuple[int, ...], dtype: torch.dtype) -> int:
        n = math.prod(shape)
        return (n + 7) // 8 if dtype == torch.bool else n * torch.empty((), dtype=dtype).element_size()


def _layout(spec: list[tuple[str, tuple[int, ...], torch.dtype]]) -> tuple[dict[str, Field], int]:
    """The fields at their offsets after the held flags (1 + one per field), each aligned; and the record's size."""
    offset, fields = 1 + len(spec), {}
    for name, shape, dtype in spec:
        offset = -(-offset // ALIGN) * ALIGN
        nbytes = Field.size(shape, dtype)
        fields[name] = Field(name, tuple(shape), dtype, offset, nbytes)
        offset += nbytes
    return fields, -(-offset // ALIGN) * ALIGN


def record_bytes(layout: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> int:
    """A device's record in a table of ``layout`` (``{name: (shape, dtype)}``): its flags, fields and alignment."""
    return _layout([(n, tuple(s), d) for n, (s, d) in layout.items()])[1]


class DeviceTable(MutableMapping):
    """``{cid: {name: tensor}}`` for every device of a run, one fixed-size record each in a file
    (:mod:`edgemask.trainer.device_store`). ``table[cid]`` reads the device's record into fresh tensors (none shared
    with the file or another read); ``table[cid] = tensors`` writes it (a subset of the layout's fields; the others
    read as absent); ``del table[cid]`` forgets it. :meth:`read` reads some fields only. :attr:`bytes_read` /
    :attr:`bytes_written` count the record bytes moved (the benchmark's "bytes a round reads and writes")."""

    def __init__(self, path: Path | None, name: str, client_ids: list[str],
                 layout: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None) -> None:
        self.path, self.name = path, name
        self.client_ids = list(client_ids)
        self.index = {cid: i for i, cid in enumerate(self.client_ids)}
        self.fields: dict[str, Field] = {}
        self.record_bytes = 0
        self.held = np.zeros(len(self.client_ids), dtype=bool)  # a record written and not deleted
        self.bytes_read = self.bytes_written = 0
        self._fd: int | None = None
        self._pinned: set[str] | None = None  # the devices whose records are kept once read (:meth:`pin`)
        self._cache: dict[str, dict[str, torch.Tensor]] = {}
        if path is not None and path.with_suffix(".json").is_file():
            self._reopen()
        elif layout is not None:
            self._fix([(n, tuple(s), d) for n, (s, d) in layout.items()])

    # -- layout and file --------------------------------------------------------------------------------
    def _fix(self, spec: list[tuple[str, tuple[int, ...], torch.dtype]]) -> None:
        """The layout, from the first write: the file is created at its full size, sparse (no disk until written)."""
        self.fields, self.record_bytes = _layout(spec)
        if self.path is None:
            f = tempfile.TemporaryFile(prefix=f"edgemask-{self.name}-")
            self._fd = os.dup(f.fileno())
            f.close()
        else:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            write_json_atomic(self.path.with_suffix(".json"), {
                "schema": LAYOUT_SCHEMA, "clients": self.client_ids, "record_bytes": self.record_bytes,
                "fields": [[f.name, list(f.shape), str(f.dtype).removeprefix("torch.")] for f in self.fields.values()]})
        os.ftruncate(self._fd, self.record_bytes * len(self.client_ids))

    def _reopen(self) -> None:
        """An existing table (a store opened again: a run resumed, or read by another process): its layout from
        the header, which must name the same devices, and which records are held from their flags."""
        header = json.loads(self.path.with_suffix(".json").read_text())
        if header.get("schema") != LAYOUT_SCHEMA or header.get("clients") != self.client_ids:
            raise ValueError(f"{self.path}: a device table of another run (its devices or schema differ)")
        self.fields, self.record_bytes = _layout([(n, tuple(s), _DTYPES[d]) for n, s, d in header["fields"]])
        if self.record_bytes != header["record_bytes"]:
            raise ValueError(f"{self.path}: record size {header['record_bytes']} does not match its fields")
        self._fd = os.open(self.path, os.O_RDWR)
        for i in range(len(self.client_ids)):
            self.held[i] = os.pread(self._fd, 1, i * self.record_bytes) == b"\x01"

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.close()

    def file_bytes(self) -> int:
        """The table's size on disk when every device's record is written."""
        return self.record_bytes * len(self.client_ids)

    def allocated_bytes(self) -> int:
        """The disk the table's file holds now (its written blocks)."""
        return 0 if self._fd is None else os.fstat(self._fd).st_blocks * 512

    # -- records ----------------------------------------------------------------------------------------
    def _slot(self, cid: str) -> int:
        try:
            return self.index[cid]
        except KeyError:
            raise KeyError(cid) from None

    def __setitem__(self, cid: str, tensors: dict[str, torch.Tensor]) -> None:
        i = self._slot(cid)
        if self._fd is None:
            self._fix([(n, tuple(t.shape), t.dtype) for n, t in tensors.items()])
        buf = bytearray(self.record_bytes)
        buf[0] = 1
        names = list(self.fields)
        for n, t in tensors.items():
            f = self.fields.get(n)
            if f is None or tuple(t.shape) != f.shape or t.dtype != f.dtype:
                want = "no such field" if f is None else f"{f.shape} {f.dtype}"
                raise ValueError(f"device table {self.name!r}: {n!r} is {tuple(t.shape)} {t.dtype}, the layout "
                                 f"has {want} (a table's layout is fixed by its first write)")
            a = t.detach().cpu().contiguous().numpy()
            if f.dtype == torch.bool:
                a = np.packbits(a.reshape(-1))
            buf[f.offset: f.offset + f.nbytes] = a.reshape(-1).view(np.uint8).tobytes()
            buf[1 + names.index(n)] = 1
        try:
            os.pwrite(self._fd, buf, i * self.record_bytes)
        except OSError as e:
            full = disk_full(e)
            if full is None:
                raise
            where = self.path or "the temporary directory"
            raise EdgemaskError(f"{where}: the disk is full ({full}) while writing device {cid}'s state; "
                                "free space or pass another --workspace, then run again") from None
        self.bytes_written += self.record_bytes
        self.held[i] = True
        if self._pinned is not None and cid in self._pinned:  # kept as written (a copy: the caller's may change)
            self._cache[cid] = {n: t.detach().cpu().clone() for n, t in tensors.items()}

    def __getitem__(self, cid: str) -> dict[str, torch.Tensor]:
        return self.read(cid)

    def pin(self, cids: list[str]) -> None:
        """Keep the records of ``cids`` in RAM once read, until :meth:`unpin`: a round reads its devices' state once
        (its task, its upload, the aggregate and its costs each ask for it), an evaluation part its devices'."""
        self._pinned, self._cache = set(cids), {}

    def unpin(self) -> None:
        self._pinned, self._cache = None, {}

    def read(self, cid: str, names: list[str] | None = None, copy: bool = True) -> dict[str, torch.Tensor]:
        """The device's held fields (those of ``names`` only, when given), each a fresh tensor; KeyError for a
        device without a record. A pinned device's record is read from the file once (whole) and kept; ``copy``
        False hands out the kept tensors themselves, for a caller that never changes them in place (packed bits)."""
        i = self._slot(cid)
        if not self.held[i]:
            raise KeyError(cid)
        if self._pinned is None or cid not in self._pinned:
            return self._read(i, names)
        rec = self._cache.get(cid)
        if rec is None:
            rec = self._cache[cid] = self._read(i, None)
        return {k: v.clone() if copy else v for k, v in rec.items() if names is None or k in names}

    def _read(self, i: int, names: list[str] | None) -> dict[str, torch.Tensor]:
        base = i * self.record_bytes
        flags = os.pread(self._fd, 1 + len(self.fields), base)
        want = [f for j, f in enumerate(self.fields.values()) if flags[1 + j] and (names is None or f.name in names)]
        if names is None or len(want) == len(self.fields):
            buf = bytearray(self.record_bytes)
            os.preadv(self._fd, [buf], base)
            self.bytes_read += self.record_bytes
            return {f.name: self._tensor(buf, f.offset, f) for f in want}
        out = {}
        for f in want:
            buf = bytearray(f.nbytes)
            os.preadv(self._fd, [buf], base + f.offset)
            self.bytes_read += f.nbytes
            out[f.name] = self._tensor(buf, 0, f)
        return out

    @staticmethod
    def _tensor(buf: bytearray, offset: int, f: Field) -> torch.Tensor:
        raw = np.frombuffer(buf, dtype=np.uint8, count=f.nbytes, offset=offset)
        if f.dtype == torch.bool:
            return torch.from_numpy(np.unpackbits(raw, count=math.prod(f.shape)).astype(bool)).reshape(f.shape)
        if not f.nbytes:
            return torch.empty(f.shape, dtype=f.dtype)
        return torch.frombuffer(buf, dtype=f.dtype, count=math.prod(f.shape), offset=offset).reshape(f.shape)

    def __delitem__(self, cid: str) -> None:
        i = self._slot(cid)
        if not self.held[i]:
            raise KeyError(cid)
        os.pwrite(self._fd, b"\x00", i * self.record_bytes)
        self.held[i] = False
        self._cache.pop(cid, None)

    def __contains__(self, cid: object) -> bool:
        i = self.index.get(cid)  # type: ignore[arg-type]
        return i is not None and bool(self.held[i])

    def __iter__(self) -> Iterator[str]:
        return (self.client_ids[i] for i in np.flatnonzero(self.held))

    def __len__(self) -> int:
        return int(self.held.sum())

    def clear(self) -> None:
        if self._fd is not None:
            for i in np.flatnonzero(self.held):
                os.pwrite(self._fd, b"\x00", int(i) * self.record_bytes)
        self.held[:] = False
        self._cache.clear()


class DeviceStore:
    """A run's device tables (:class:`DeviceTable`), in ``directory`` (each table ``<name>.bin`` with its header) or,
    without one, in anonymous temporary files. ``store.table(name)`` makes (or, in a directory that has it, opens
    again) a table of every device of the run; making a table this store has made already starts it over, empty
    (an algorithm set up again)."""

    def __init__(self, client_ids: list[str], directory: str | os.PathLike[str] | None = None) -> None:
        self.client_ids = list(client_ids)
        self.directory = None if directory is None else Path(directory)
        self.tables: dict[str, DeviceTable] = {}

    def table(self, name: str, layout: dict[str, tuple[tuple[int, ...], torch.dtype]] | None = None) -> DeviceTable:
        path = None if self.directory is None else self.directory / f"{name}.bin"
        if name in self.tables:  # made again (a second set-up): it starts over, empty
            self.tables.pop(name).close()
            if path is not None:
                path.unlink(missing_ok=True)
                path.with_suffix(".json").unlink(missing_ok=True)
        t = self.tables[name] = DeviceTable(path, name, self.client_ids, layout)
        return t

    def bytes_per_device(self) -> int:
        """The records' bytes of one device, over every table."""
        return sum(t.record_bytes for t in self.tables.values())

    def pin(self, cids: list[str]) -> None:
        """:meth:`DeviceTable.pin` on every table: the devices of a round, or of an evaluation part."""
        for t in self.tables.values():
            t.pin(cids)

    def unpin(self) -> None:
        for t in self.tables.values():
            t.unpin()

    def bytes_to_come(self) -> int:
        """Disk the tables may still take: their full size less what their files hold already (they are sparse)."""
        return sum(max(0, t.file_bytes() - t.allocated_bytes()) for t in self.tables.values())

    def io(self) -> tuple[int, int]:
        """Record bytes read and written so far, over every table."""
        return (sum(t.bytes_read for t in self.tables.values()), sum(t.bytes_written for t in self.tables.values()))

    def close(self) -> None:
        for t in self.tables.values():
            t.close()


@contextlib.contextmanager
def store_beside(target: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh directory beside the run directory ``target`` for its device store, removed when the block ends.
    Named as :func:`edgemask.fileio.atomic_dir` names its temporaries (:func:`~edgemask.fileio.temporary_beside`),
    so the next training of the run id, holding its lock, removes one a killed run left
    (:func:`edgemask.fileio.remove_stale_temporaries`); two runs of other ids never share one."""
    tmp = temporary_beside(target)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
