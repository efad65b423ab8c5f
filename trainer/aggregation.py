"""Server-side aggregation math as plain functions over tensors (each tested against hand-computed values),
written once for the algorithms that share it."""

from __future__ import annotations

import functools
from operator import attrgetter

import numpy as np
import torch

from edgemask.trainer.sampling import step_plan


STACK_ELEMENTS = 1 << 24  # clients' tensors stacked at once by weighted_average (64 MiB of float32)


def weighted_average(tensors: list[torch.Tensor] | torch.Tensor,
                     weights: list[float] | torch.Tensor) -> torch.Tensor:
    """FedAvg: Σ_k w_k x_k / Σ_k w_k (weights are usually local sample counts). The clients' tensors are
    stacked and contracted with the weights, a chunk of clients at a time (at most :data:`STACK_ELEMENTS`);
    they may come stacked already, ``(K, *shape)``. ``weights`` may come already normalized as a float32 tensor
    (:func:`normalized`; :func:`average_state` does it once)."""
    w = weights if isinstance(weights, torch.Tensor) else normalized(weights)
    n = len(tensors)
    step = max(1, STACK_ELEMENTS // max(tensors[0].numel(), 1))
    out = None
    for s in range(0, n, step):
        rows, ws = (tensors, w) if step >= n else (tensors[s: s + step], w[s: s + step])  # one chunk: no slicing
        part = (rows if isinstance(rows, torch.Tensor) else stack_rows(rows)).float()
        term = torch.tensordot(ws.to(part.device), part, dims=1)
        out = term if out is None else out.add_(term)
    return out


def normalized(weights: list[float]) -> torch.Tensor:
    """``weights / Σ weights`` as float32: the coefficients of :func:`weighted_average`."""
    total = float(sum(weights))
    return torch.tensor([x / total for x in weights], dtype=torch.float32)


def stack_rows(tensors: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(tensors)``, without the copy when they already are consecutive rows of one tensor (the
    batched loop's per-client results): :func:`_as_stacked`."""
    stacked = _as_stacked(tensors)
    return torch.stack(tensors) if stacked is None else stacked


def _as_stacked(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    """``torch.stack(tensors)`` without the copy when the tensors already lie one after another in one storage,
    equally laid out (the rows of the batched loop's stacked parameters); else ``None``. The first tensor's
    storage must hold all the rows; a tensor whose data starts inside it, live, is a view of it (or of the same
    memory), so comparing data pointers is enough. Each check is one C-level ``map`` over the tensors (an
    aggregate reads 100 clients × the model's tensors every round): the data pointers, then contiguity, shape,
    dtype and device (contiguous tensors of one shape address their elements alike)."""
    t0 = tensors[0]
    n = len(tensors)
    if n < 2 or not t0.is_contiguous():
        return None
    row = t0.nbytes
    base, storage = t0.data_ptr(), t0.untyped_storage()
    if row == 0 or base + n * row > storage.data_ptr() + storage.nbytes():
        return None
    if list(map(torch.Tensor.data_ptr, tensors)) != list(range(base, base + n * row, row)):
        return None
    if not (all(map(torch.Tensor.is_contiguous, tensors)) and list(map(_SHAPE, tensors)).count(t0.shape) == n
            and list(map(_DTYPE, tensors)).count(t0.dtype) == n
            and list(map(torch.Tensor.get_device, tensors)).count(t0.get_device()) == n):
        return None
    return t0.as_strided((n, *t0.shape), (t0.numel(), *t0.stride()), t0.storage_offset())


_SHAPE, _DTYPE = attrgetter("shape"), attrgetter("dtype")


def average_state(states: list[dict[str, torch.Tensor]], weights: list[float],
                  keys: list[str] | None = None) -> dict[str, torch.Tensor]:
    """FedAvg's weighted average (:func:`weighted_average`) of the clients' ``states`` under each of ``keys``
    (default: the first state's). The batched engine's results are consecutive rows of one stacked tensor, which
    :func:`stack_rows` reads as they lie: no copy."""
    keys = keys if keys is not None else list(states[0])
    w = normalized(weights)
    return {k: weighted_average([s[k] for s in states], w) for k in keys}


def average_buffers(buffers: dict[str, torch.Tensor], states: list[dict[str, torch.Tensor]],
                    weights: list[float]) -> dict[str, torch.Tensor]:
    """The batch-norm ``buffers`` averaged over the clients' ``states`` that carry them (:func:`average_state`);
    integer buffers (``num_batches_tracked``) keep their dtype. No buffers: ``buffers`` as they are."""
    if not buffers:
        return buffers
    avg = average_state(states, weights, list(buffers))
    return {k: v.to(buffers[k].dtype) for k, v in avg.items()}


def personalization_preserving(previous: torch.Tensor, masks: list[torch.Tensor] | torch.Tensor,
                               keeps: list[torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FedMask §3.6 (Fig. 7-8) on the server's one global mask: each element is averaged only over the uploads
    whose (pruned) structure keeps it, so an element kept by one upload alone takes that upload's value (the
    paper's "unchanged": no other client's value is mixed in); an element no upload keeps keeps its ``previous``
    global value (a client not sampled this round, Alg. 1 line 12 aggregates only the round's uploads).

    ``previous``: the global mask ``(*shape)``; ``masks[k]``: upload k's binary mask, ``keeps[k]``: its one-shot
    pruning structure (1 = kept), either may come stacked ``(K, *shape)``, as 0 / 1 or bool. Returns the new global
    mask, averaged values in [0, 1] (binarized by the caller, Eq. 3), and where some upload kept the element (bool).
    The counts are taken on bool (a byte an element, not four): exact integers, so the float32 mean is the one a
    float sum gives.
    """
    keep = keeps.bool() if isinstance(keeps, torch.Tensor) else torch.stack([k.bool() for k in keeps])
    vals = (masks.bool() if isinstance(masks, torch.Tensor) else torch.stack([m.bool() for m in masks])) & keep
    count = keep.sum(0)  # (*shape) how many uploads keep each element
    kept = count > 0
    mean = vals.sum(0).to(torch.float32) / count.clamp(min=1).to(torch.float32)
    return torch.where(kept, mean, previous), kept


def mask_weighted_average(global_value: torch.Tensor, values: list[torch.Tensor], masks: list[torch.Tensor]
                          ) -> torch.Tensor:
    """w_g = Σ_n k_n ⊙ w_n, (k_n)_l = (m_n)_l / Σ_n' (m_n')_l; elements with Σ m = 0 keep ``global_value``."""
    den = sum(m.float() for m in masks)
    num = sum(v.float() * m for v, m in zip(values, masks))
    return torch.where(den > 0, num / den.clamp(min=1e-12), global_value)


@functools.lru_cache(maxsize=4096)
def local_steps(num_train: int, batch_size: int, epochs: int, max_steps: int | None = None) -> int:
    """τ: how many optimizer steps the local-training loop takes on ``num_train`` samples (its own plan; asked
    for every client every round, so remembered)."""
    return len(step_plan([np.arange(num_train)], epochs, max_steps, batch_size))


def momentum_norm(tau: int, rho: float) -> float:
    """‖a‖₁ of τ steps of SGD with momentum ρ: Σ_{j=1..τ} (1 − ρ^j)/(1 − ρ) = [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ);
    τ when ρ = 0."""
    if rho == 0.0:
        return float(tau)
    return (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)
