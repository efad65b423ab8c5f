"""Server-side aggregation math as plain functions over tensors (each tested against hand-computed values)."""

from __future__ import annotations

import torch


STACK_ELEMENTS = 1 << 24  # clients' tensors stacked at once by weighted_average (64 MiB of float32)


def weighted_average(tensors: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """FedAvg: Σ_k w_k x_k / Σ_k w_k (weights are usually local sample counts). The clients' tensors are
    stacked and contracted with the weights, a chunk of clients at a time (at most :data:`STACK_ELEMENTS`)."""
    total = float(sum(weights))
    w = torch.tensor([x / total for x in weights], dtype=torch.float32)
    out = torch.zeros_like(tensors[0], dtype=torch.float32)
    step = max(1, STACK_ELEMENTS // max(tensors[0].numel(), 1))
    for s in range(0, len(tensors), step):
        chunk = tensors[s: s + step]
        part = _as_stacked(chunk)
        part = (torch.stack(chunk) if part is None else part).float()
        out += torch.tensordot(w[s: s + step].to(part.device), part, dims=1)
    return out


def _as_stacked(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """``torch.stack(tensors)`` without the copy when the tensors already lie one after another in one storage,
    equally laid out (the rows of the batched loop's stacked parameters); else ``None``."""
    t0 = tensors[0]
    n, size, step = len(tensors), t0.shape, t0.numel()
    if n < 2 or not t0.is_contiguous():
        return None
    ptr, off = t0.untyped_storage().data_ptr(), t0.storage_offset()
    for i, t in enumerate(tensors):
        if (t.shape != size or t.dtype != t0.dtype or t.device != t0.device or not t.is_contiguous()
                or t.storage_offset() != off + i * step or t.untyped_storage().data_ptr() != ptr):
            return None
    return t0.as_strided((n, *size), (step, *t0.stride()), off)


def average_state(states: list[dict[str, torch.Tensor]], weights: list[float],
                  keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    keys = keys if keys is not None else list(states[0])
    return {k: weighted_average([s[k] for s in states], weights) for k in keys}


def personalization_preserving(masks: list[torch.Tensor], keeps: list[torch.Tensor]) -> list[torch.Tensor]:
    """FedMask §3.6 (Fig. 7-8): each element is averaged only over the clients whose (pruned) structure keeps
    it, and only where two or more do; an element kept by one client alone keeps that client's value.

    ``masks[k]`` is client k's uploaded binary mask, ``keeps[k]`` its one-shot pruning structure (1 = kept).
    Returns each client's updated mask (averaged values, in [0, 1]; zero where the client pruned).
    """
    keep = torch.stack([k.float() for k in keeps])  # (K, *shape)
    vals = torch.stack([m.float() for m in masks]) * keep
    count = keep.sum(0)  # (*shape) how many clients keep each element
    avg = vals.sum(0) / count.clamp(min=1)
    shared = count >= 2
    return [torch.where(shared, avg, v) * kp for v, kp in zip(vals, keep)]
