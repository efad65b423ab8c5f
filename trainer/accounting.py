"""Exact cost accounting: bytes on the wire and FLOPs with the current masks.

Bytes: a float32 tensor costs 4 bytes per element; a binary mask 1 bit per element, packed (⌈n/8⌉ bytes);
Top-k sends values (4 bytes) plus indices (4 bytes, int32).
FLOPs: a multiply-add counts 2. A masked weight element that is zero costs nothing, and neither does any
weight feeding or fed by a dead unit; backward ≈ 2 × forward (input gradients + weight/mask gradients).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainer.masks import packed_nbytes
from trainer.models.masking import MaskSite, effective_params

FLOAT_BYTES = 4
INDEX_BYTES = 4


def tensor_bytes(tensors: dict[str, torch.Tensor] | list[torch.Tensor]) -> int:
    ts = tensors.values() if isinstance(tensors, dict) else tensors
    return sum(t.numel() * FLOAT_BYTES for t in ts)


def mask_bytes(masks: dict[str, torch.Tensor]) -> int:
    return sum(packed_nbytes(m.numel()) for m in masks.values())


def topk_bytes(k: int) -> int:
    return k * (FLOAT_BYTES + INDEX_BYTES)


def layer_positions(model: nn.Module, sites: tuple[MaskSite, ...], example: torch.Tensor) -> dict[str, int]:
    """How many times each site's weight is applied per sample: output H·W for a conv, sequence length for
    an LSTM, the product of leading dims for a linear on sequences; found with forward hooks."""
    mods = dict(model.named_modules())
    out: dict[str, int] = {}
    hooks = []
    for s in sites:
        def hook(mod, inp, outp, s=s):
            if s.kind == "conv":
                o = outp
                out[s.name] = math.prod(o.shape[2:])
            elif s.kind == "lstm":
                x = inp[0]
                out[s.name] = x.shape[1] if getattr(mod, "batch_first", False) else x.shape[0]
            else:
                out[s.name] = math.prod(outp.shape[1:-1]) if outp.dim() > 2 else 1
        hooks.append(mods[s.name].register_forward_hook(hook))
    try:
        with torch.no_grad():
            model.eval()(example[:1])
    finally:
        for h in hooks:
            h.remove()
    return out


def forward_flops(model: nn.Module, sites: tuple[MaskSite, ...], masks: dict[str, torch.Tensor],
                  positions: dict[str, int]) -> int:
    """Forward FLOPs of one sample for the masked layers: 2 × (non-zero effective weights) × positions.
    Dead units are zero in the effective weights, so they cost nothing."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    eff = effective_params(params, {k: v.detach() for k, v in masks.items()}, sites) if masks else params
    total = 0
    for s in sites:
        nnz = sum(int(eff[w].ne(0).sum()) for w in s.weights)
        total += 2 * nnz * positions.get(s.name, 1)
    return total
