"""Mask operations as plain functions: binarize (FedMask Eq. 3), bit packing for transmission and storage, and a
client's masked model for evaluation (:func:`masked_model`)."""

from __future__ import annotations

import math

from typing import Callable

import numpy as np
import torch

from edgemask.trainer.models.masking import effective_params
from edgemask.trainer.records import EvalModel
from edgemask.trainer.task_functions import ModelContext

MASK_PREFIX = "mask:"  # a mask's name in a masked model's EvalModel.params (masked_model)
THRESHOLD = 0.5  # FedMask §3.3: σ(m^r) is binarized at 0.5 for transmission and inference


def binarize(soft: torch.Tensor, threshold: float = THRESHOLD) -> torch.Tensor:
    """Eq. 3: m = 1 where σ(m^r) ≥ τ, else 0 (as float32)."""
    return (soft >= threshold).to(torch.float32)


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


def masked_forward(context: ModelContext) -> Callable:
    """The :attr:`EvalModel.forward` of :func:`masked_model`: the weights in ``params`` under its masks. One
    function per model context (kept in its cache), so the engines stack every client's masked model together."""
    fn = context.cache.get("masked_forward")
    if fn is None:
        n, sites, call = len(MASK_PREFIX), context.sites, context.call

        def fn(params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            weights = {k: v for k, v in params.items() if not k.startswith(MASK_PREFIX)}
            masks = {k[n:]: v for k, v in params.items() if k.startswith(MASK_PREFIX)}
            return call(effective_params(weights, masks, sites), buffers, x)

        context.cache["masked_forward"] = fn
    return fn
