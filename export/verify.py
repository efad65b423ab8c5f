"""Verification: the compacted model must compute what the masked model computes.

One rule, stated once (:class:`Tolerance`): on real samples every output element ``y`` of the compacted model (or
of an exported file) lies within ``atol + rtol·|y_ref|`` of its reference ``y_ref`` (the form of
``numpy.testing.assert_allclose``). Float32 sums taken in another order (fewer inputs after compaction, a folded
batch norm, another runtime's kernels) part by a share of the tensor's scale: rtol follows large outputs, atol
covers the elements near zero where large terms cancel. A NaN fails it.
Past it, a :class:`VerificationError` names the first layer (in execution order) whose live outputs part, each
layer held to the same rule against the masked model's output of that layer. Defaults, and the measurements they
come from: docs/contracts.md ("Verification"), ``benchmarks/bench_tolerance.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from edgemask.errors import EdgemaskError
from edgemask.export.compact.compact import CompactionResult
from edgemask.trainer.models.masking import MaskedModel

if TYPE_CHECKING:
    import numpy as np

# From benchmarks/bench_tolerance.py (docs/contracts.md, "Verification"): across the zoo at full width, in every
# format, the worst |Δ| was 5.3e-5 and the worst |Δ| / max |y_ref| of a tensor 2.6e-6; an element near zero (large
# terms that cancel) differs by what its tensor's scale costs, so atol carries it. Headroom ≥ 12× everywhere.
ATOL = 5e-4  # ~10× the worst |Δ| measured (VGG16, .pte/XNNPACK)
RTOL = 1e-4  # ~40× the worst error on a tensor's own scale


class VerificationError(EdgemaskError):
    """A compacted model (or an exported file) does not compute what the masked model computes."""


@dataclass(frozen=True)
class Comparison:
    """One output against its reference under a :class:`Tolerance`.

    ``diff`` and ``limit`` are taken at the element furthest past its limit (or, when all pass, closest to it):
    that element's |Δ| and its ``atol + rtol·|y_ref|``."""

    max_abs_diff: float  # over all elements; NaN where either side has one, inf where the shapes differ
    diff: float
    limit: float

    @property
    def ok(self) -> bool:
        return self.diff <= self.limit  # NaN compares false: it fails


@dataclass(frozen=True)
class Tolerance:
    """|y − y_ref| ≤ atol + rtol·|y_ref|, elementwise: what an output may differ from its reference."""

    atol: float = ATOL
    rtol: float = RTOL

    @classmethod
    def of(cls, limit: "Tolerance | float") -> "Tolerance":
        """``limit`` as a rule: a bare number is an absolute limit (rtol 0), what ``limit`` meant before."""
        return limit if isinstance(limit, Tolerance) else cls(atol=float(limit), rtol=0.0)

    def __str__(self) -> str:
        return f"atol {self.atol:g} + rtol {self.rtol:g}·|y|"

    def compare(self, ref: "torch.Tensor | np.ndarray", got: "torch.Tensor | np.ndarray") -> Comparison:
        ref, got = torch.as_tensor(ref, dtype=torch.float32), torch.as_tensor(got, dtype=torch.float32)
        if ref.shape != got.shape:
            return Comparison(float("inf"), float("inf"), self.atol)
        if not ref.numel():
            return Comparison(0.0, 0.0, self.atol)
        d = (got - ref).abs()  # (same shape as the output)
        lim = self.atol + self.rtol * ref.abs()
        past = torch.nan_to_num(d - lim, nan=float("inf"))  # NaN in either: the worst element
        i = int(past.flatten().argmax())
        return Comparison(float(d.max()), float(d.flatten()[i]), float(lim.flatten()[i]))

    def describe(self, c: Comparison) -> str:
        """'by 0.00184 where the limit there is 0.000501 (atol 0.0005 + rtol 0.0001·|y|)'."""
        return f"by {c.diff:.3g} where the limit there is {c.limit:.3g} ({self})"


TOLERANCE = Tolerance()  # the default rule of every export check


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
                      limit: Tolerance | float = TOLERANCE) -> float:
    """Max abs difference between ``masked`` and ``result.module`` on ``inputs``; raise past the rule ``limit``
    (a :class:`Tolerance`; a bare number: an absolute limit)."""
    tol = Tolerance.of(limit)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    compacted = result.module.eval()
    cmods = dict(compacted.named_modules())
    # masked-side layer whose output the compacted layer reproduces (a folded conv reproduces its batch norm)
    pairs = {n: result.folded.get(n, n) for n in result.kept_units if n in cmods}
    y_ref, ref, order = _record(masked, [f"base.{m}" for m in pairs.values()], inputs)
    y_cmp, got, _ = _record(compacted, list(pairs), inputs)
    out = tol.compare(y_ref, y_cmp)
    if out.ok:
        return out.max_abs_diff
    back = {f"base.{m}": n for n, m in pairs.items()}
    for key in order:
        name = back[key]
        if name not in got:
            continue
        r, c = ref[key], got[name]
        dim = 1 if isinstance(cmods[name], (nn.Conv1d, nn.Conv2d)) else -1
        r = r.index_select(dim, result.kept_units[name])  # y_ref: the masked layer's output at the kept units
        layer = tol.compare(r, c)
        if not layer.ok:
            raise VerificationError(f"compacted model differs from the masked model {tol.describe(layer)} "
                                    f"first at layer {name!r}; output differs {tol.describe(out)}")
    raise VerificationError(f"compacted model's output differs from the masked model {tol.describe(out)}; every "
                            "compared layer agrees, so the difference is after the last one")
