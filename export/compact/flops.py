"""FLOP and parameter counting: forward MACs × 2 at batch 1, summed by forward hooks over the handler table."""

from __future__ import annotations

import torch
from torch import nn

from edgemask.export.compact.handlers import handler_for


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def layer_flops(model: nn.Module, example: tuple[torch.Tensor, ...]) -> dict[str, int]:
    """Module path -> forward FLOPs of one sample (``example`` has batch 1): 2 × the MACs of each conv, linear and
    LSTM leaf (the handler's term), summed over its calls."""
    flops: dict[str, int] = {}
    hooks = []
    for name, mod in model.named_modules():
        h = handler_for(mod)
        if h is None or list(mod.children()):
            continue

        def hook(m, inputs, output, name=name, h=h):
            out = output[0] if isinstance(output, tuple) else output
            flops[name] = flops.get(name, 0) + 2 * h.macs(m, inputs, out)

        hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(*example)
    finally:
        for hk in hooks:
            hk.remove()
    return flops


def count_flops(model: nn.Module, example: tuple[torch.Tensor, ...]) -> int:
    """Forward FLOPs of one sample (``example`` has batch 1): 2 × the MACs of every conv, linear and LSTM.

    Element-wise ops, pooling and normalization are not counted (as in the papers' FLOP figures)."""
    return sum(layer_flops(model, example).values())
