"""Exact cost accounting: bytes on the wire and FLOPs with the current masks.

Bytes: a tensor costs its element size per element (float32: 4, int64 batch-norm counters: 8); a binary mask
1 bit per element, packed (⌈n/8⌉ bytes); Top-k sends values (4 bytes) plus indices (4 bytes, int32).
FLOPs: a multiply-add counts 2. Two counts, labelled (:class:`ForwardFlops`):

* ``element`` — what element sparsity would save: a weight element costs nothing when it is zero after masking,
  when its output unit is dead, or when its input unit is dead (a column of fc2 fed by a dead fc1 unit, a conv
  filter's slice over a dead input channel, LSTM columns of dead hidden units). An optimistic figure: dense
  kernels do not skip scattered zeros.
* ``structured`` — what structured removal saves: only whole units that export's compaction removes cost
  nothing (a dead row / filter / LSTM hidden unit, and the columns it fed); every other weight of a live unit
  over a live input counts, zero or not. This is the figure for the paper's "computation cost" comparison
  (FedMask §3.4: the one-shot pruned masks save computation through the units that die).

Both counts first remove what export's compaction removes beyond dead rows: a unit no consumer reads (every
column over it zero in the rows that stay) is computed by no compacted model, so its row and the columns over it
cost nothing (:func:`output_read`, by the compactor's own rule,
:func:`~edgemask.trainer.models.liveness.removed_units`).

The simulation counts a round's training on the masks its forward passes ran (``Algorithm.train_masks``: FedMask's
binary forward, the union of the round's start and end masks; its soft forward, every element the pruning keeps).
Liveness is structural, found by probe passes (:func:`output_read`, then :func:`input_liveness`); backward ≈
2 × forward (input gradients + weight/mask gradients).
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import NamedTuple

import torch
from torch import nn

from edgemask.trainer.aggregation import stack_rows
from edgemask.trainer.masks import packed_nbytes
from edgemask.trainer.models.liveness import removed_units
from edgemask.trainer.models.masking import MaskSite, any_nonzero, effective_params
from edgemask.trainer.models.stateless import stateless_call
from edgemask.trainer.records import ClientUpdate, LocalResult

FLOAT_BYTES = 4
INDEX_BYTES = 4
FLOPS_MEMORY_BUDGET = 256 << 20  # bytes of stacked masks and probe tensors per chunk (forward_flops_many)
# output_read's probe: input and biases this small keep every value far below a ReLU6's 6 (whose gradient is 0
# above it) through the zoo's residual adds, and far above float32's smallest normal through its depth
READ_PROBE_SCALE = 2.0 ** -14


def tensor_bytes(tensors: dict[str, torch.Tensor] | list[torch.Tensor]) -> int:
    """Dense tensors on the wire: numel × element size (float32: 4 bytes)."""
    ts = tensors.values() if isinstance(tensors, dict) else tensors
    return sum(map(_NBYTES, ts))  # numel × element size, read in C: 100 clients' uploads every round


_NBYTES = attrgetter("nbytes")


def copy_bytes(params: dict[str, torch.Tensor], names: list[str] | None = None,
               buffers: dict[str, torch.Tensor] | None = None) -> int:
    """Bytes of a copy of the parameters ``names`` (default: all), and of ``buffers`` when given: what an algorithm
    holds per client when it keeps them (``Algorithm.client_state_bytes``)."""
    kept = params if names is None else {k: params[k] for k in names}
    return tensor_bytes(kept) + (tensor_bytes(buffers) if buffers else 0)


def state_layout(params: dict[str, torch.Tensor], names: list[str] | None = None,
                 buffers: dict[str, torch.Tensor] | None = None) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """The device-store layout (``{name: (shape, dtype)}``, :mod:`edgemask.trainer.device_store`) of a copy of the
    parameters ``names`` (default: all) and of ``buffers`` when given: a table of what an algorithm keeps of them
    per device. From shapes alone (meta tensors too): its ``record_bytes`` is that state's
    ``Algorithm.client_state_bytes``."""
    kept = params if names is None else {k: params[k] for k in names}
    return {k: (tuple(v.shape), v.dtype) for k, v in {**kept, **(buffers or {})}.items()}


def fedavg_upload(cid: str, result: LocalResult, bytes_down: int) -> ClientUpdate:
    """FedAvg's upload of one result: the trained tensors and the batch-norm running statistics (which travel with
    the weights, so they are costed too); ``bytes_down``: the dense model coming back (``Algorithm.dense_bytes``)."""
    payload = {**result.trained, **result.buffers}
    return ClientUpdate(cid, result.num_samples, payload, bytes_up=tensor_bytes(payload), bytes_down=bytes_down,
                        train_loss=result.loss, samples_seen=result.samples_seen)


def partial_upload(cid: str, result: LocalResult, keys: list[str]) -> ClientUpdate:
    """An upload of only the trained ``keys`` (e.g. the body in FedPer/FedBABU) plus the batch-norm buffers; the
    same tensors come back down."""
    sent = {k: result.trained[k] for k in keys}
    return ClientUpdate(cid, result.num_samples, {**sent, **result.buffers}, bytes_up=tensor_bytes(sent),
                        bytes_down=tensor_bytes(sent), train_loss=result.loss, samples_seen=result.samples_seen)


def mask_bytes(masks: dict[str, torch.Tensor]) -> int:
    return sum(packed_nbytes(m.numel()) for m in masks.values())


def topk_bytes(k: int) -> int:
    return k * (FLOAT_BYTES + INDEX_BYTES)


class Positions(dict):
    """``{site name: applications per sample}``, remembering the example input it was measured on (the probe
    of :func:`forward_flops` runs on its shape)."""

    example: torch.Tensor | None = None


def layer_positions(model: nn.Module, sites: tuple[MaskSite, ...], example: torch.Tensor) -> dict[str, int]:
    """How many times each site's weight is applied per sample: output H·W for a conv, sequence length for
    an LSTM, the product of leading dims for a linear on sequences; found with forward hooks."""
    mods = dict(model.named_modules())
    out = Positions()
    out.example = example[:1].detach().clone()
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
    was_training = model.training
    try:
        with torch.no_grad():
            model.eval()(example[:1])
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)  # simulate() measures before round 0: leaving eval mode trained it in eval mode
    return out


def input_liveness(model: nn.Module, sites: tuple[MaskSite, ...], eff: dict[str, torch.Tensor],
                   example: torch.Tensor) -> dict[str, torch.Tensor]:
    """Bool per input unit of each non-LSTM site (conv: input channels; linear: input features), and for an
    LSTM site the input features of its first layer: is the unit structurally alive?

    A probe forward pass with every non-zero effective parameter replaced by a positive constant (weights
    1/fan-in, biases and batch-norm affine 1, running mean 0 and variance 1) on a positive input: ReLU, pooling,
    residual adds, LSTM gates and heads keep every live value > 0, and a dead unit (zero weights, gated bias and
    batch norm) stays exactly 0 whatever the data. So a unit is dead iff the probe leaves it at 0.
    Runs under ``vmap`` over stacked ``eff`` too (:func:`forward_flops_many`): the liveness is reduced inside.
    """
    probe = {}
    for k, v in eff.items():
        if not v.is_floating_point():
            probe[k] = v
            continue
        fan = v[0].numel() if v.dim() > 1 else 1
        probe[k] = v.ne(0).to(v.dtype) / fan
    for k, v in model.named_buffers():
        if k.endswith("running_mean"):
            probe[k] = torch.zeros_like(v)
        elif k.endswith("running_var"):
            probe[k] = torch.ones_like(v)
        else:
            probe[k] = v
    mods = dict(model.named_modules())
    seen: dict[str, torch.Tensor] = {}
    hooks = [mods[s.name].register_forward_hook(
        lambda mod, inp, outp, s=s: seen.__setitem__(s.name, inp[0].detach())) for s in sites]
    x = torch.zeros_like(example[:1]) if not example.is_floating_point() else torch.ones_like(example[:1])
    was_training = model.training
    try:
        with torch.no_grad():
            stateless_call(model.eval(), probe, (x,))
    finally:
        for h in hooks:
            h.remove()
        model.train(was_training)
    alive = {}
    for s in sites:
        a = seen[s.name]
        if s.kind == "conv":  # (1, C, *spatial)
            alive[s.name] = any_nonzero(a.transpose(0, 1).reshape(a.shape[1], -1), 1)
        else:  # (1, ..., features)
            alive[s.name] = any_nonzero(a.reshape(-1, a.shape[-1]), 0)
    return alive


def output_read(model: nn.Module, sites: tuple[MaskSite, ...], eff: dict[str, torch.Tensor],
                example: torch.Tensor, seeds: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Bool per output unit of each linear and conv site: does the model's output read it, through a column that
    is not zero in a consumer's row that is read itself? (LSTM sites are left out: their units are read back by
    the recurrence, and compaction never removes them as unread.)

    The gradient of the summed output of a probe pass with respect to each unit: every non-zero weight ``1/fan-in``,
    every non-zero bias ``READ_PROBE_SCALE``, batch norm's γ 1, running mean 0 and variance 1, the input
    ``READ_PROBE_SCALE``. Every factor of the chain rule is then ≥ 0 (a live ReLU or ReLU6 passes 1), so a gradient
    is 0 exactly when no path of non-zero weights leads from the unit to the output — which is also the column rule
    run to its fixed point: a consumer row nobody reads passes no gradient back to its columns. ``seeds``: units
    read regardless (the unit compaction keeps in a layer nobody reads), ``(units,)`` bool per site. Runs under
    ``vmap`` over stacked ``eff``."""
    probe = {}
    for k, v in eff.items():
        if not v.is_floating_point():
            probe[k] = v
        elif v.dim() > 1:
            probe[k] = v.ne(0).to(v.dtype) / v[0].numel()
        else:  # a bias, batch norm's β: small; batch norm's γ: 1 (a product of small γ would underflow)
            probe[k] = v.ne(0).to(v.dtype) * (READ_PROBE_SCALE if k.endswith("bias") else 1.0)
    for k, v in model.named_buffers():
        probe[k] = (torch.zeros_like(v) if k.endswith("running_mean") else
                    torch.ones_like(v) if k.endswith("running_var") else v)
    mods = dict(model.named_modules())
    targets = [s for s in sites if s.kind != "lstm"]
    x = torch.zeros_like(example[:1]) if not example.is_floating_point() else \
        torch.full_like(example[:1], READ_PROBE_SCALE)

    def per_unit(s: MaskSite, out: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``v (units,)`` broadcast over ``out``'s unit dimension (conv: dim 1; linear: the last)."""
        return v.reshape(-1, *([1] * (out.dim() - 2))) if s.kind == "conv" else v

    def objective(deltas: dict[str, torch.Tensor]) -> torch.Tensor:
        seeded: list[torch.Tensor] = []

        def hook(mod, inp, out, s):
            out = out + per_unit(s, out, deltas[s.name])
            if seeds is not None and s.name in seeds:  # read by fiat: its own gradient, and its row's inputs'
                seeded.append((out * per_unit(s, out, seeds[s.name].to(out.dtype))).sum())
            return out

        hooks = [mods[s.name].register_forward_hook(lambda mod, inp, out, s=s: hook(mod, inp, out, s))
                 for s in targets]
        try:
            y = stateless_call(model, probe, (x,))
        finally:
            for h in hooks:
                h.remove()
        return y.sum() + sum(seeded)

    deltas = {s.name: torch.zeros(eff[s.weights[0]].shape[0], dtype=eff[s.weights[0]].dtype) for s in targets}
    was_training = model.training
    try:
        model.eval()
        with torch.enable_grad():
            grads = torch.func.grad(objective)(deltas)
    finally:
        model.train(was_training)
    return {name: g.ne(0) for name, g in grads.items()}


def _drop_unread(model: nn.Module, sites: tuple[MaskSite, ...], eff: dict[str, torch.Tensor],
                 example: torch.Tensor, seeds: dict[str, torch.Tensor] | None
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``eff`` with the units compaction removes as unread zeroed (row, gated bias, batch norm's γ and β after it),
    as if removed: the probe of :func:`input_liveness` then sees their columns downstream dead too. Also returns,
    per site, the units kept although nobody reads them (a layer nobody reads keeps its first live unit,
    :func:`~edgemask.trainer.models.liveness.removed_units`) that ``seeds`` did not name: their rows read their
    inputs, so another pass seeded with them is due (:func:`_count`)."""
    read = output_read(model, sites, eff, example, seeds)
    out, pending = dict(eff), {}
    for s in sites:
        if s.name not in read:
            continue
        W = eff[s.weights[0]]
        dead = ~any_nonzero(W.reshape(W.shape[0], -1), 1)
        gone = removed_units(dead, ~read[s.name])
        pending[s.name] = ~gone & ~read[s.name]
        keep = (~gone).to(W.dtype)
        out[s.weights[0]] = W * keep.reshape(-1, *([1] * (W.dim() - 1)))
        for p in (*s.biases, *((f"{s.norm}.weight", f"{s.norm}.bias") if s.norm else ())):
            if p in out:
                out[p] = out[p] * keep
    return out, pending


def site_nnz(site: MaskSite, mod: nn.Module, eff: dict[str, torch.Tensor], alive_in: torch.Tensor) -> int:
    """Weight elements of one site that do work: non-zero, live output unit, live input unit."""
    return int(_site_nnz(site, mod, eff, alive_in))


def _site_nnz(site: MaskSite, mod: nn.Module, eff: dict[str, torch.Tensor], alive_in: torch.Tensor) -> torch.Tensor:
    """:func:`site_nnz` as a 0-d int64 tensor (no conversion to a Python int, so it runs under ``vmap``)."""
    if site.kind == "lstm":
        h = site.hidden
        total, prev = torch.zeros((), dtype=torch.int64), alive_in
        for layer, (ih, hh) in enumerate(zip(site.weights[0::2], site.weights[1::2])):
            # hidden unit j is dead when its g rows are all zero (masking.unit_alive): h_j = o_j·tanh(0) = 0
            g = torch.cat([eff[ih][2 * h: 3 * h], eff[hh][2 * h: 3 * h]], dim=1)
            out_alive = any_nonzero(g, 1)  # (H,)
            rows = out_alive.repeat(4)[:, None]  # (4H, 1): the i, f, g, o rows of dead units do no work
            total = total + (eff[ih].ne(0) & rows & prev[None, :]).sum()
            total = total + (eff[hh].ne(0) & rows & out_alive[None, :]).sum()
            prev = out_alive
        return total
    W = eff[site.weights[0]]
    nz = W.ne(0)
    if site.kind == "conv":  # (N, C/groups, *k): the column of output n, slot j reads channel g·C/groups + j
        groups = getattr(mod, "groups", 1)
        n, cg = W.shape[0], W.shape[1]
        chan = (torch.arange(n)[:, None] // (n // groups)) * cg + torch.arange(cg)[None, :]  # (N, C/groups)
        cols = alive_in[chan]
        return (nz & cols.reshape(n, cg, *([1] * (W.dim() - 2)))).sum()
    return (nz & alive_in[None, :]).sum()  # linear (out, in)


def _site_structured(site: MaskSite, mod: nn.Module, eff: dict[str, torch.Tensor], alive_in: torch.Tensor
                     ) -> torch.Tensor:
    """Weight elements of one site left after removing whole dead units only (0-d int64, runs under ``vmap``):
    every (live output unit, live input unit) pair counts, zero weight or not.

    Linear ``(out, in)``: (rows not zero) × (live inputs). Conv ``(N, C/groups, *k)``: per filter not zero, its
    live input channels × kernel size (compaction's row rule keeps a row that is not zero, even where only dead
    inputs meet its weights). LSTM: per layer, 4 gates × live hidden units ×
    (live inputs + live hidden units), a unit alive as in :func:`_site_nnz` (its g rows not all zero)."""
    if site.kind == "lstm":
        h = site.hidden
        total, prev = torch.zeros((), dtype=torch.int64), alive_in.sum()
        for ih, hh in zip(site.weights[0::2], site.weights[1::2]):
            units = any_nonzero(torch.cat([eff[ih][2 * h: 3 * h], eff[hh][2 * h: 3 * h]], dim=1), 1).sum()
            total = total + 4 * units * (prev + units)
            prev = units
        return total
    W = eff[site.weights[0]]
    nz = W.ne(0)
    if site.kind == "conv":
        groups = getattr(mod, "groups", 1)
        n, cg = W.shape[0], W.shape[1]
        chan = (torch.arange(n)[:, None] // (n // groups)) * cg + torch.arange(cg)[None, :]  # (N, C/groups)
        cols = alive_in[chan]  # (N, C/groups)
        works = nz.reshape(n, -1).any(1)  # (N,): a filter compaction keeps (over dead inputs only: its bias)
        return (works[:, None] & cols).sum() * math.prod(W.shape[2:])
    works = nz.any(1)  # (out,): a row compaction keeps, even one whose inputs are all dead (it emits its bias)
    return works.sum() * alive_in.sum()


def _input_width(site: MaskSite, mod: nn.Module, eff: dict[str, torch.Tensor]) -> int:
    """Input units of a site: a linear's in-features, a conv's input channels, an LSTM's first-layer inputs."""
    W = eff[site.weights[0]]
    return W.shape[1] * getattr(mod, "groups", 1) if site.kind == "conv" else W.shape[1]


class ForwardFlops(NamedTuple):
    """Forward FLOPs of one sample for the masked layers, both labelled counts (see the module docstring)."""

    element: int  # what element sparsity would save: working (non-zero, live) weight elements only
    structured: int  # what structured removal saves: only whole units compaction removes (dead or unread) are free


def _count(model: nn.Module, sites: tuple[MaskSite, ...], params: dict[str, torch.Tensor],
           masks: dict[str, torch.Tensor], positions: dict[str, int], seeds: dict[str, torch.Tensor] | None = None
           ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One pass of :func:`forward_flops_split`: the int64 tensor ``(2,)`` = (element, structured) and the units
    :func:`_drop_unread` says a pass seeded with them must count again (none: the count is final)."""
    eff = effective_params(params, masks, sites) if masks else params
    example = getattr(positions, "example", None)
    pending: dict[str, torch.Tensor] = {}
    if masks and example is not None:  # the dense model: every unit is read
        eff, pending = _drop_unread(model, sites, eff, example, seeds)
    alive = input_liveness(model, sites, eff, example) if example is not None else {}
    mods = dict(model.named_modules())
    element = structured = torch.zeros((), dtype=torch.int64)
    for s in sites:
        mod = mods[s.name]
        if s.name in alive:
            nnz = _site_nnz(s, mod, eff, alive[s.name])
            units = _site_structured(s, mod, eff, alive[s.name])
        else:  # no probe: every input unit counts as alive
            nnz = sum(eff[w].ne(0).sum() for w in s.weights)
            units = _site_structured(s, mod, eff, torch.ones(_input_width(s, mod, eff), dtype=torch.bool))
        element = element + 2 * positions.get(s.name, 1) * nnz
        structured = structured + 2 * positions.get(s.name, 1) * units
    return torch.stack([element, structured]), pending


def _masked_flops(model: nn.Module, sites: tuple[MaskSite, ...], params: dict[str, torch.Tensor],
                  masks: dict[str, torch.Tensor], positions: dict[str, int]) -> torch.Tensor:
    """One unseeded pass of :func:`_count` for ``vmap`` over stacked masks: int64 ``(3,)`` = (element, structured,
    whether a seeded pass is due — then :func:`forward_flops_split` counts that client)."""
    flops, pending = _count(model, sites, params, masks, positions)
    due = sum((p.any().to(torch.int64) for p in pending.values()), torch.zeros((), dtype=torch.int64))
    return torch.cat([flops, due.reshape(1)])


def forward_flops_split(model: nn.Module, sites: tuple[MaskSite, ...], masks: dict[str, torch.Tensor],
                        positions: dict[str, int]) -> ForwardFlops:
    """Forward FLOPs of one sample for the masked layers, element-sparse and structured (:class:`ForwardFlops`).

    Element: 2 × (working weight elements) × positions, a weight element working when it is non-zero after
    masking and both its output and its input unit are alive (:func:`site_nnz`). Structured: 2 × (weights of
    live units over live inputs) × positions (:func:`_site_structured`). Input liveness comes from a probe pass
    on ``positions.example`` (a :class:`Positions` from :func:`layer_positions`); given a plain dict, every input
    unit counts as alive."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    masks = {k: v.detach() for k, v in masks.items()}
    seeds: dict[str, torch.Tensor] = {}
    while True:  # seeds only grow, so this ends (almost always after one pass: a layer nobody reads is rare)
        flops, pending = _count(model, sites, params, masks, positions, seeds)
        due = [name for name, p in pending.items() if bool(p.any())]
        if not due:
            e, s = flops.tolist()
            return ForwardFlops(e, s)
        # the kept unit of the layer nearest the output first: its row may make a layer before it read, which
        # then keeps no unit of its own (export's fixed point reaches the layers in that order too)
        last = max(due, key=[s.name for s in sites].index)
        seeds = {**seeds, last: seeds[last] | pending[last] if last in seeds else pending[last]}


def forward_flops(model: nn.Module, sites: tuple[MaskSite, ...], masks: dict[str, torch.Tensor],
                  positions: dict[str, int]) -> int:
    """The element-sparse count of :func:`forward_flops_split` (zero weights and dead units skipped)."""
    return forward_flops_split(model, sites, masks, positions).element


def forward_flops_many(model: nn.Module, sites: tuple[MaskSite, ...], masks: list[dict[str, torch.Tensor]],
                       positions: dict[str, int], memory_budget: int = FLOPS_MEMORY_BUDGET) -> list[int]:
    """``[forward_flops(model, sites, m, positions) for m in masks]``: the element counts of
    :func:`forward_flops_split_many`."""
    return [f.element for f in forward_flops_split_many(model, sites, masks, positions, memory_budget)]


def forward_flops_split_many(model: nn.Module, sites: tuple[MaskSite, ...], masks: list[dict[str, torch.Tensor]],
                             positions: dict[str, int], memory_budget: int = FLOPS_MEMORY_BUDGET
                             ) -> list[ForwardFlops]:
    """``[forward_flops_split(model, sites, m, positions) for m in masks]``, computed for the clients together:
    their masks stacked, the probe pass and the counts run once under ``vmap`` per group of clients whose masks
    have the same names and shapes, in chunks of at most ``memory_budget`` bytes of stacked masks and effective
    parameters. One by one, a round's accounting for FedMask's MLP clients cost about as much as their
    training."""
    out: list[ForwardFlops | None] = [None] * len(masks)
    params = {k: v.detach() for k, v in model.named_parameters()}
    per_client = sum(v.numel() * v.element_size() for v in params.values())
    count = torch.vmap(lambda m: _masked_flops(model, sites, params, m, positions))
    for spec, idx in _by_layout(masks).items():
        if not spec:  # no masks: the dense model, the same for all
            dense = forward_flops_split(model, sites, {}, positions)
            for i in idx:
                out[i] = dense
            continue
        mask_bytes_ = sum(math.prod(shape) * masks[idx[0]][k].element_size() for k, shape in spec)
        chunk = max(1, memory_budget // (3 * (per_client + mask_bytes_)))  # masks, effective params, probe
        for s in range(0, len(idx), chunk):
            part = idx[s: s + chunk]
            stacked = {k: stack_rows([masks[i][k].detach() for i in part]) for k, _ in spec}  # rows: no copy
            try:
                flops = [ForwardFlops(*f[:2]) if not f[2] else forward_flops_split(model, sites, masks[i], positions)
                         for i, f in zip(part, count(stacked).tolist())]
            except RuntimeError:  # an op without a batching rule (an LSTM): one client after another
                flops = [forward_flops_split(model, sites, masks[i], positions) for i in part]
            for i, f in zip(part, flops):
                out[i] = f
    return out  # type: ignore[return-value]


def _by_layout(masks: list[dict[str, torch.Tensor]]) -> dict[tuple, list[int]]:
    """The clients' indices grouped by the names and shapes of their masks (those that stack together)."""
    groups: dict[tuple, list[int]] = {}
    for i, m in enumerate(masks):
        groups.setdefault(tuple((k, v.shape) for k, v in m.items()), []).append(i)
    return groups


def kept_counts(masks: list[dict[str, torch.Tensor]]) -> list[float]:
    """``sum(float(m.sum()) for m in masks[i].values())`` for every client (the elements its binary masks
    keep), each name's masks summed on the clients' stacked rows in one reduction per group of clients whose
    masks have the same names and shapes (rows of one tensor, as FedMask's are, are not copied)."""
    out: list[float] = [0.0] * len(masks)
    for spec, idx in _by_layout(masks).items():
        sums = [stack_rows([masks[i][k].detach() for i in idx]).reshape(len(idx), -1).sum(1).tolist()
                for k, _ in spec]
        for j, i in enumerate(idx):
            out[i] = sum(col[j] for col in sums)  # name by name, in order: as the one-client sum adds them
    return out


def dense_reference(model: nn.Module, sites: tuple[MaskSite, ...], positions: dict[str, int]) -> dict[str, int]:
    """What FedAvg pays on the same model, per client and round: ``bytes`` up (= down: every parameter and
    buffer in float32) and ``flops_fwd`` per sample (dense) — the denominators of the ratios to FedAvg."""
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    return {"bytes": tensor_bytes(state), "flops_fwd": forward_flops(model, sites, {}, positions)}
