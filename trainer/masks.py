"""Mask operations as plain functions: binarize (FedMask Eq. 3), bit packing for transmission and storage
(:func:`pack_bits`, and in torch on any device :func:`pack_rows` / :func:`unpack_rows`), every client's binary masks
held as bits (:class:`BitMasks`), and a client's masked model for evaluation (:func:`masked_model`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from edgemask.trainer.models.masking import MaskSite, effective_params, unit_alive
from edgemask.trainer.records import EvalModel
from edgemask.trainer.task_functions import ModelContext

if TYPE_CHECKING:
    from edgemask.trainer.device_store import DeviceStore, DeviceTable

MASK_PREFIX = "mask:"  # a mask's name in a masked model's EvalModel.params (masked_model)
BITS_PREFIX = "bits:"  # a packed mask's name there (uint8, unpacked in the forward: masked_model)
THRESHOLD = 0.5  # FedMask §3.3: σ(m^r) is binarized at 0.5 for transmission and inference


def binarize(soft: torch.Tensor, threshold: float = THRESHOLD) -> torch.Tensor:
    """Eq. 3: m = 1 where σ(m^r) ≥ τ, else 0 (as float32)."""
    return (soft >= threshold).to(torch.float32)


def sigmoid_at_least(scores: torch.Tensor) -> torch.Tensor:
    """Eq. 3 on real-valued scores, as bool: ``torch.sigmoid(scores) >= THRESHOLD``, bit for bit, without the
    sigmoid. σ is monotone, so on the CPU in float32 it is ``scores >= x_τ``, x_τ the least float32 whose σ torch
    rounds to at least τ (:func:`_least_at_threshold`: −1.788e−7 for τ = 0.5, not 0, since σ(x) rounds to 0.5 for
    tiny negative x); one comparison instead of an exp, a division and a comparison (ClientPruning binarizes every
    device's 15 M VGG16 scores). Elsewhere (CUDA's σ rounds in its own way, another dtype) σ is computed."""
    if scores.device.type == "cpu" and scores.dtype == torch.float32:
        return scores >= _least_at_threshold()
    return torch.sigmoid(scores) >= THRESHOLD


@functools.cache
def _least_at_threshold() -> float:
    """The least float32 x with ``torch.sigmoid(x) >= THRESHOLD`` on the CPU, by bisection over the floats' bit
    patterns (as a vector and as one element: the kernels' vectorized body and their scalar tail); checked on
    the 4,096 floats on either side of it."""
    def at_least(bits: int) -> bool:
        x = float(np.int32(bits).view(np.float32))
        v = torch.sigmoid(torch.full((64,), x)) >= THRESHOLD
        one = bool(torch.sigmoid(torch.tensor([x]))[0] >= THRESHOLD)
        if not (bool(v.all()) == bool(v.any()) == one):
            raise RuntimeError(f"torch.sigmoid({x!r}) compares with {THRESHOLD} differently in its kernels")
        return one

    # a negative float's bit pattern grows with its magnitude: lo stays at least τ, hi below
    lo, hi = int(np.float32(-0.0).view(np.int32)), int(np.float32(-1.0).view(np.int32))
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if at_least(mid) else (lo, mid)
    x0 = float(np.int32(lo).view(np.float32))
    near = torch.from_numpy(np.arange(lo - 4096, lo + 4096, dtype=np.int32).view(np.float32))
    near = torch.cat([near, near.neg()])
    if not torch.equal(torch.sigmoid(near) >= THRESHOLD, near >= x0):
        raise RuntimeError(f"torch.sigmoid is not monotone at {THRESHOLD} around {x0!r}")
    return x0


def pack_bits(mask: torch.Tensor) -> np.ndarray:
    """A binary mask as uint8 bytes, 8 elements per byte (C order, big bit order): ⌈n/8⌉ bytes."""
    flat = mask.detach().reshape(-1).cpu().numpy()
    if flat.size and not np.isin(flat, (0, 1)).all():
        raise ValueError("pack_bits: mask is not binary")
    return np.packbits(flat.astype(np.uint8))


def unpack_bits(packed: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    if packed.dtype != np.uint8 or packed.size != (n + 7) // 8:
        raise ValueError(f"packed mask of {packed.size} bytes does not fit shape {tuple(shape)} "
                         f"({(n + 7) // 8} bytes expected)")
    bits = np.unpackbits(packed, count=n)
    return torch.from_numpy(bits.astype(np.float32)).reshape(shape)


def pack_rows(bits: torch.Tensor, lead: int = 0) -> torch.Tensor:
    """Binary ``bits`` as packed uint8, the layout of :func:`pack_bits` (big bit order, ⌈n/8⌉ bytes, the last byte
    zero-padded) on the tensor's own device: ``(*lead_dims, ⌈n/8⌉)`` for the first ``lead`` dims kept (a
    client's rows, ``lead = 1`` on the clients' stacked ``(K, *shape)``), n the numel of the rest."""
    head = bits.shape[:lead]
    if bits.device.type == "cpu":  # numpy's packbits: the same layout, one pass (the shifts below take ~8)
        flat = bits.detach().reshape(*head, -1)
        flat = flat if flat.dtype in (torch.bool, torch.uint8) else flat.to(torch.uint8)
        return torch.from_numpy(np.packbits(flat.numpy(), axis=-1))
    flat = bits.detach().reshape(*head, -1).to(torch.uint8)
    n = flat.shape[-1]
    if n % 8:
        flat = torch.nn.functional.pad(flat, (0, 8 - n % 8))
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=flat.device)
    return (flat.view(*head, -1, 8) << shifts).sum(-1, dtype=torch.uint8)


def unpack_rows(packed: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """:func:`pack_rows` undone: ``(*lead, ⌈n/8⌉)`` uint8 → ``(*lead, *shape)`` of 0 / 1 in ``dtype``. Elementwise
    and reshapes only, so it runs under ``vmap`` (a masked model's forward unpacks its client's bits there)."""
    n = math.prod(shape)
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8, device=packed.device)
    bits = (packed.unsqueeze(-1) >> shifts) & 1  # (*lead, nb, 8)
    return bits.reshape(*packed.shape[:-1], -1)[..., :n].reshape(*packed.shape[:-1], *shape).to(dtype)


_POPCOUNT = torch.tensor([bin(i).count("1") for i in range(256)], dtype=torch.int64)


def count_ones(packed: torch.Tensor) -> int:
    """How many elements a packed mask keeps (the padding bits are 0)."""
    return int(_POPCOUNT.to(packed.device)[packed.long()].sum())


class BitMasks(MutableMapping):
    """Every client's binary masks, ``{cid: {weight: mask}}``, held as packed bits (1 bit per element,
    :func:`pack_rows`): 32× less memory than float32 masks (FedMask's IC-CIFAR10 keeps three masks of a VGG16 for
    each of its 400 devices). With a ``table`` (:class:`~edgemask.trainer.device_store.DeviceTable`, made by
    :meth:`in_store`) the bits live in the run's device store, off the heap, read when a client's are asked for;
    without one, in RAM (what matters only within a round). Reading a client's masks unpacks them to float32 0 / 1;
    a weight in ``ones`` that a client's masks do not hold reads as that one shared tensor (a mask that keeps every
    element: FedMask's unpruned layers in its pruning structure). Store with ``store[cid] = masks`` (a dict of
    binary tensors) or, already packed, :meth:`set_packed`. Packed bits are never changed in place, so the last
    client read from the table is kept to answer the next question about it (an evaluation asks each site)."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], ones: dict[str, torch.Tensor] | None = None,
                 table: "DeviceTable | None" = None) -> None:
        self.shapes = {w: tuple(s) for w, s in shapes.items()}
        self.ones = dict(ones or {})
        self.table = table
        self._ram: dict[str, dict[str, torch.Tensor]] = {}
        self._last: tuple[str | None, dict[str, torch.Tensor]] = (None, {})

    @classmethod
    def in_store(cls, store: "DeviceStore", name: str, shapes: dict[str, tuple[int, ...]],
                 ones: dict[str, torch.Tensor] | None = None, stored: list[str] | None = None) -> "BitMasks":
        """Masks of ``shapes`` in ``store``'s table ``name``: a field of ⌈n/8⌉ bytes per mask (of the masks
        ``stored`` only, when given: the others always read as ``ones``)."""
        return cls(shapes, ones, store.table(name, cls.layout(shapes, stored)))

    @staticmethod
    def layout(shapes: dict[str, tuple[int, ...]], stored: list[str] | None = None) -> dict:
        """The device table's layout of masks of ``shapes`` (those ``stored``): uint8, ⌈n/8⌉ bytes each."""
        return {w: ((packed_nbytes(math.prod(s)),), torch.uint8) for w, s in shapes.items()
                if stored is None or w in stored}

    def _get(self, cid: str) -> dict[str, torch.Tensor]:
        if self.table is None:
            return self._ram[cid]
        if self._last[0] != cid:
            self._last = (cid, self.table.read(cid, copy=False))
        return self._last[1]

    def __getitem__(self, cid: str) -> dict[str, torch.Tensor]:
        bits = self._get(cid)
        return self.unpacked(cid, [w for w in self.shapes if w in bits or w in self.ones])

    def __setitem__(self, cid: str, masks: dict[str, torch.Tensor]) -> None:
        self.set_packed(cid, {w: pack_rows(m) for w, m in masks.items()
                              if w not in self.ones or m is not self.ones[w]})

    def __delitem__(self, cid: str) -> None:
        if self.table is None:
            del self._ram[cid]
        else:
            del self.table[cid]
            self._last = (None, {})

    def __contains__(self, cid: object) -> bool:  # without unpacking
        return cid in (self._ram if self.table is None else self.table)

    def clear(self) -> None:  # without unpacking
        self._ram.clear()
        if self.table is not None:
            self.table.clear()
            self._last = (None, {})

    def __iter__(self) -> Iterator[str]:
        return iter(self._ram if self.table is None else self.table)

    def __len__(self) -> int:
        return len(self._ram if self.table is None else self.table)

    def unpacked(self, cid: str, names: list[str], dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
        """The client's masks ``names`` (each stored or in ``ones``) as 0 / 1 in ``dtype`` (``torch.bool``: a
        quarter of float32's bytes, for a local task's pruning structure)."""
        bits = self._get(cid)
        return {w: unpack_rows(bits[w], self.shapes[w], dtype) if w in bits else self.ones[w].to(dtype)
                for w in names}

    def packed(self, cid: str) -> dict[str, torch.Tensor]:
        """The client's masks as they are held: packed uint8 (a weight read from ``ones`` is absent)."""
        return self._get(cid)

    def set_packed(self, cid: str, packed: dict[str, torch.Tensor]) -> None:
        if self.table is None:
            self._ram[cid] = dict(packed)
        else:
            self.table[cid] = packed
            self._last = (cid, dict(packed)) if self._last[0] == cid else self._last

    def unit_alive(self, cid: str, site: MaskSite) -> torch.Tensor | list[torch.Tensor]:
        """:func:`~edgemask.trainer.models.masking.unit_alive` of the client's mask at ``site``, from its bits: where
        a unit's row is whole bytes (a conv with a multiple of 8 inputs × taps, a linear layer with a multiple of 8
        inputs), the row is alive where any of its bytes is non-zero, read without unpacking; otherwise that
        site's masks are unpacked."""
        bits, w = self._get(cid), site.weights[0]
        if site.kind != "lstm" and w in bits:
            shape = self.shapes[w]
            row = math.prod(shape[1:])
            if row % 8 == 0:
                return bits[w].view(shape[0], row // 8).ne(0).any(1)
        return unit_alive(site, self.unpacked(cid, list(site.weights), torch.bool))

    def count(self, cid: str) -> int:
        """The elements the client's masks keep (a weight read from ``ones`` counts whole)."""
        bits = self._get(cid)
        return sum(count_ones(bits[w]) if w in bits else math.prod(s) for w, s in self.shapes.items()
                   if w in bits or w in self.ones)

    def nbytes(self) -> int:
        """Host (heap) bytes of the packed masks held: those in RAM; a table's are in its file
        (:meth:`file_nbytes`)."""
        return sum(t.nbytes for d in self._ram.values() for t in d.values())

    def file_nbytes(self) -> int:
        """Bytes of the packed masks held in the table's file (its records' fields, not their flags)."""
        if self.table is None:
            return 0
        return sum(f.nbytes for f in self.table.fields.values()) * len(self.table)


def packed_nbytes(numel: int) -> int:
    """Bytes to send a binary mask of ``numel`` elements: 1 bit per element, packed."""
    return (numel + 7) // 8


def masked_model(context: ModelContext, weights: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
                 buffers: dict[str, torch.Tensor]) -> EvalModel:
    """The ``weights`` (the global ones) under a client's ``masks`` (Eq. 2,
    :func:`~edgemask.trainer.models.masking.effective_params`) on ``context``'s model, as an :class:`EvalModel`. Its
    ``params`` hold the weights too (under their names; the masks under :data:`MASK_PREFIX` + the weight's name): every
    client holds the very same weight tensors, so stacking them is a broadcast view, and they move to the evaluation
    device with the masks."""
    return EvalModel({**weights, **{MASK_PREFIX + k: m for k, m in masks.items()}}, buffers, masked_forward(context))


def packed_masked_model(context: ModelContext, weights: dict[str, torch.Tensor], packed: dict[str, torch.Tensor],
                        buffers: dict[str, torch.Tensor]) -> EvalModel:
    """:func:`masked_model` with the client's masks as packed bits (:func:`pack_rows`, under :data:`BITS_PREFIX`),
    unpacked inside the forward: a chunk of stacked clients holds 1 bit per mask element until it runs."""
    return EvalModel({**weights, **{BITS_PREFIX + k: m for k, m in packed.items()}}, buffers,
                     masked_forward(context))


def masked_forward(context: ModelContext) -> Callable:
    """The :attr:`EvalModel.forward` of :func:`masked_model`: the weights in ``params`` under its masks. One
    function per model context (kept in its cache), so the engines stack every client's masked model together."""
    fn = context.cache.get("masked_forward")
    if fn is None:
        n, sites, call = len(MASK_PREFIX), context.sites, context.call
        site_of = {w: s for s in sites for w in s.weights}

        def fn(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            weights = {k: v for k, v in params.items() if not k.startswith((MASK_PREFIX, BITS_PREFIX))}
            masks = {k[n:]: v for k, v in params.items() if k.startswith(MASK_PREFIX)}
            for k, v in params.items():
                if k.startswith(BITS_PREFIX):
                    w = k[len(BITS_PREFIX):]
                    masks[w] = unpack_rows(v, site_of[w].mask_shape(weights[w]), weights[w].dtype)
            return call(effective_params(weights, masks, sites), buffers, x)

        context.cache["masked_forward"] = fn
    return fn
