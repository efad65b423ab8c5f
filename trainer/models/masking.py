"""Masked-model semantics shared by training and export.

A model is a plain ``nn.Module``; a :class:`MaskSite` names a layer whose weights carry a binary mask.
Given masks, :func:`effective_params` returns the parameters the masked model computes with:

* ``W_eff = W ⊙ m`` (FedMask Eq. 2; Eq. 12 for the LSTM gates),
* an output unit whose mask row is entirely zero is **dead** and outputs exactly zero: its bias, and the affine
  weight and bias of the batch norm that follows it, are gated to zero. Without that gate a pruned filter would
  still emit ``b`` (or batch norm's ``β − γ·μ/σ``), and removing it in export would change the output.
* LSTM (``nn.LSTM``, gate rows ordered i, f, g, o): masks cover the i, f, g rows only — FedMask's partial mask
  (Table 3) keeps W_o real-valued and trained. Hidden unit j is dead when its g rows in ``weight_ih`` and
  ``weight_hh`` are all zero; its g biases are gated, so g_j = tanh(0) = 0, c_j stays 0 and h_j = o_j·tanh(0) = 0.

The trainer's forward (FedMask: the binary mask in the feedforward, §3.3, or soft σ(m^r) masks with
``forward = "soft"``; binary at inference) and export's bake both call this one function, so the model that was
trained is the model that is compacted. The gate of dead units' biases and batch-norm γ/β is this code's, not the
paper's (FedMask masks weights only, Eq. 2): it is what makes the masked model equal to its compaction in export.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Container
from dataclasses import dataclass

import torch
from torch import nn

from edgemask.trainer.models.stateless import stateless_call


@dataclass(frozen=True)
class MaskSite:
    """One masked layer."""

    name: str  # module path, e.g. "fc1" or "features.conv3"
    kind: str  # "linear" | "conv" | "lstm"
    weights: tuple[str, ...]  # masked parameter names
    biases: tuple[str, ...]  # parameters gated by unit liveness (1-D, one entry per output row)
    norm: str | None = None  # module path of the batch norm right after this layer
    hidden: int = 0  # LSTM hidden size (rows 0:3H of each weight are masked)

    def mask_shape(self, weight: torch.Tensor) -> tuple[int, ...]:
        if self.kind == "lstm":
            return (3 * self.hidden, *weight.shape[1:])
        return tuple(weight.shape)


def find_sites(model: nn.Module, norm_after: dict[str, str] | None = None,
               exclude: tuple[str, ...] = ()) -> tuple[MaskSite, ...]:
    """A site for every Linear, Conv1d/2d and LSTM in ``model`` (in definition order), except ``exclude``.

    ``norm_after`` maps a layer's module path to the batch norm that directly follows it.
    """
    norm_after = norm_after or {}
    sites = []
    for name, mod in model.named_modules():
        if name in exclude:
            continue
        if isinstance(mod, nn.Linear):
            kind = "linear"
        elif isinstance(mod, (nn.Conv1d, nn.Conv2d)):
            kind = "conv"
        elif isinstance(mod, nn.LSTM):
            if mod.bidirectional or mod.proj_size:
                raise ValueError(f"{name}: bidirectional / projected LSTMs are not supported")
            pre = f"{name}." if name else ""
            ws = tuple(f"{pre}weight_{k}_l{i}" for i in range(mod.num_layers) for k in ("ih", "hh"))
            bs = tuple(f"{pre}bias_{k}_l{i}" for i in range(mod.num_layers) for k in ("ih", "hh")) if mod.bias else ()
            sites.append(MaskSite(name, "lstm", ws, bs, None, mod.hidden_size))
            continue
        else:
            continue
        pre = f"{name}." if name else ""
        bias = (f"{pre}bias",) if getattr(mod, "bias", None) is not None else ()
        sites.append(MaskSite(name, kind, (f"{pre}weight",), bias, norm_after.get(name)))
    return tuple(sites)


def unit_alive(site: MaskSite, masks: dict[str, torch.Tensor]) -> torch.Tensor | list[torch.Tensor]:
    """Bool per output unit: does any mask element of its row survive? For an LSTM: one tensor per layer."""
    if site.kind == "lstm":
        h = site.hidden
        out = []
        for ih, hh in zip(site.weights[0::2], site.weights[1::2]):
            g_ih = masks[ih][2 * h: 3 * h].reshape(h, -1)
            g_hh = masks[hh][2 * h: 3 * h].reshape(h, -1)
            out.append(any_nonzero(g_ih, 1) | any_nonzero(g_hh, 1))
        return out
    m = masks[site.weights[0]]
    return any_nonzero(m.reshape(m.shape[0], -1), 1)


def dead_layers(sites: tuple[MaskSite, ...], masks: Container[str],
                alive: Callable[[MaskSite], torch.Tensor | list[torch.Tensor]] | None = None) -> list[str]:
    """The masked layers with no live unit, in the model's order; an LSTM layer as ``<site> layer <l>``. A layer
    whose weight is not in ``masks`` is unmasked, never dead. ``alive(site)``: :func:`unit_alive` of the site,
    by default from ``masks`` (a dict of binary masks); a store of packed bits passes its own
    (:meth:`~edgemask.trainer.masks.BitMasks.unit_alive`)."""
    alive = alive or (lambda site: unit_alive(site, masks))
    dead = []
    for site in sites:
        if site.weights[0] not in masks:
            continue
        units = alive(site)
        if isinstance(units, list):  # an LSTM: one tensor per stacked layer
            dead += [f"{site.name} layer {i}" for i, a in enumerate(units) if not bool(a.any())]
        elif not bool(units.any()):
            dead.append(site.name)
    return dead


def any_nonzero(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x.ne(0).any(dim)``: the largest ``|x|`` along ``dim`` is above 0 (NaN counts as non-zero, as in ``ne``).
    On the CPU a float max is vectorized where a boolean ``any`` is not, and the liveness is computed in every
    training step of a masked model."""
    if not x.is_floating_point():
        return x.ne(0).any(dim)
    return x.detach().abs().nan_to_num_(nan=1.0).amax(dim) > 0


def effective_params(params: dict[str, torch.Tensor], masks: dict[str, torch.Tensor],
                     sites: tuple[MaskSite, ...]) -> dict[str, torch.Tensor]:
    """The parameters the masked model computes with (see module docstring). Unmasked ones pass through.

    ``params`` holds at least every parameter named by ``sites`` (and the norms' ``weight``/``bias``);
    ``masks`` maps weight names to masks (soft in [0, 1] while training, binary otherwise). A site missing from
    ``masks`` is unmasked.
    """
    out = dict(params)
    for site in sites:
        if site.weights[0] not in masks:
            continue
        if site.kind == "lstm":
            h = site.hidden
            alive_per_layer = unit_alive(site, masks)
            for layer, alive in enumerate(alive_per_layer):
                for w in site.weights[2 * layer: 2 * layer + 2]:
                    W = params[w]  # (4H, in)
                    out[w] = torch.cat([W[: 3 * h] * masks[w], W[3 * h:]], dim=0)
                gate = torch.ones(4 * h, dtype=params[site.weights[0]].dtype, device=alive.device)
                gate = torch.cat([gate[: 2 * h], alive.to(gate.dtype), gate[3 * h:]])
                for b in site.biases[2 * layer: 2 * layer + 2]:
                    out[b] = params[b] * gate
            continue
        w = site.weights[0]
        out[w] = params[w] * masks[w]
        alive = unit_alive(site, masks).to(params[w].dtype)  # (out_units,)
        for b in site.biases:
            out[b] = params[b] * alive
        if site.norm is not None:
            for p in (f"{site.norm}.weight", f"{site.norm}.bias"):
                if p in params:
                    out[p] = params[p] * alive
    return out


def masked_forward(model: nn.Module, masks: dict[str, torch.Tensor], sites: tuple[MaskSite, ...],
                   *args: torch.Tensor, params: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """Run ``model`` with masked parameters; ``params`` overrides the module's own (e.g. personal ones)."""
    base = dict(model.named_parameters())
    if params:
        base.update(params)
    return stateless_call(model, effective_params(base, masks, sites), args)


def bake(model: nn.Module, masks: dict[str, torch.Tensor], sites: tuple[MaskSite, ...]) -> nn.Module:
    """A copy of ``model`` whose parameters are the effective ones: a plain dense module computing exactly
    what the masked model computes (the starting point of compaction)."""
    baked = copy.deepcopy(model)
    eff = effective_params(dict(baked.named_parameters()), {k: v.detach() for k, v in masks.items()}, sites)
    with torch.no_grad():
        for name, p in baked.named_parameters():
            p.copy_(eff[name])
    return baked.eval()


def all_ones_masks(model: nn.Module, sites: tuple[MaskSite, ...]) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    return {w: torch.ones(s.mask_shape(params[w])) for s in sites for w in s.weights}


class MaskedModel(nn.Module):
    """A model with fixed (binary) masks applied through :func:`effective_params`; for evaluation and export."""

    def __init__(self, base: nn.Module, sites: tuple[MaskSite, ...], masks: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.base = base
        self.sites = sites
        self.masks = {k: v.detach().float() for k, v in masks.items()}

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return masked_forward(self.base, self.masks, self.sites, *args)

    def baked(self) -> nn.Module:
        return bake(self.base, self.masks, self.sites)
