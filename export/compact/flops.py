"""FLOP and parameter counting: forward MACs × 2 at batch 1, summed by forward hooks over the handler table."""

from __future__ import annotations

import torch
from torch import nn

from export.compact.handlers import handler_for


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def count_flops(model: nn.Module, example: tuple[torch.Tensor, ...]) -> int:
    """Forward FLOPs of one sample (``example`` has batch 1): 2 × the MACs of every conv, linear and LSTM.

    Element-wise ops, pooling and normalization are not counted (as in the papers' FLOP figures)."""
    total = 0

    def hook(mod, inputs, output):
        nonlocal total
        out = output[0] if isinstance(output, tuple) else output
        total += handler_for(mod).macs(mod, inputs, out)

    hooks = [m.register_forward_hook(hook) for m in model.modules()
             if not list(m.children()) and handler_for(m) is not None]
    try:
        with torch.no_grad():
            model(*example)
    finally:
        for h in hooks:
            h.remove()
    return 2 * total
