"""Verification: the compacted model must compute what the masked model computes.

On real samples, the max abs difference of the outputs must be within ``limit`` (1e-5 in fp32); otherwise a
:class:`VerificationError` names the first layer (in execution order) whose live outputs part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from edgemask.errors import EdgemaskError
from edgemask.export.compact.compact import CompactionResult
from edgemask.trainer.models.masking import MaskedModel

if TYPE_CHECKING:
    import numpy as np

TOLERANCE = 1e-5


class VerificationError(EdgemaskError):
    """A compacted model (or an exported file) does not compute what the masked model computes."""


def _record(model: nn.Module, names: list[str], inputs: tuple[torch.Tensor, ...]):
    outs: dict[str, torch.Tensor] = {}
    order: list[str] = []
    mods = dict(model.named_modules())
    hooks = []
    for n in names:
        if n in mods:
            def hook(m, i, o, n=n):
                o = o[0] if isinstance(o, tuple) else o
                if n not in outs:
                    order.append(n)
                outs[n] = o.detach()
            hooks.append(mods[n].register_forward_hook(hook))
    try:
        with torch.no_grad():
            y = model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return y, outs, order


def max_abs_diff(a: "torch.Tensor | np.ndarray", b: "torch.Tensor | np.ndarray") -> float:
    a, b = torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max()) if a.numel() else 0.0


def verify_compaction(masked: MaskedModel, result: CompactionResult, inputs: torch.Tensor | tuple,
                      limit: float = TOLERANCE) -> float:
    """Max abs difference between ``masked`` and ``result.module`` on ``inputs``; raise past ``limit``."""
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    compacted = result.module.eval()
    cmods = dict(compacted.named_modules())
    # masked-side layer whose output the compacted layer reproduces (a folded conv reproduces its batch norm)
    pairs = {n: result.folded.get(n, n) for n in result.kept_units if n in cmods}
    y_ref, ref, order = _record(masked, [f"base.{m}" for m in pairs.values()], inputs)
    y_cmp, got, _ = _record(compacted, list(pairs), inputs)
    diff = max_abs_diff(y_ref, y_cmp)  # NaN where either output has one: fails every `<= limit` below
    if diff <= limit:
        return diff
    back = {f"base.{m}": n for n, m in pairs.items()}
    for key in order:
        name = back[key]
        if name not in got:
            continue
        r, c = ref[key], got[name]
        dim = 1 if isinstance(cmods[name], (nn.Conv1d, nn.Conv2d)) else -1
        r = r.index_select(dim, result.kept_units[name])
        d = max_abs_diff(r, c)
        if not d <= limit:
            raise VerificationError(f"compacted model differs from the masked model by {d:.3g} (limit {limit:g}) "
                                    f"first at layer {name!r}; output differs by {diff:.3g}")
    raise VerificationError(f"compacted model's output differs from the masked model by {diff:.3g} "
                            f"(limit {limit:g}); every compared layer agrees, so the difference is after the last one")
