"""Mask operations as plain functions: binarize (FedMask Eq. 3), bit packing for transmission and storage."""

from __future__ import annotations

import math

import numpy as np
import torch

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
