"""Compaction: a client's masked model -> a smaller dense ``nn.Module`` computing exactly the same function.

Steps (each on a copy; Torch-Pruning's ``group.prune()`` is not atomic):

1. bake the masks into the weights (:meth:`MaskedModel.baked`): dead units' rows, biases and batch-norm γ, β are 0;
2. split stacked LSTMs into single-layer ones (each layer keeps its own live count);
3. build Torch-Pruning's ``DependencyGraph`` and walk its coupled groups (conv → bn → conv, flatten boundaries,
   residual adds, depthwise convs, LSTM → linear); per group, remove a unit when either

   * **row rule**: it is exactly zero in *every* coupled producer — a residual add keeps the union of live
     channels. Exception: a producer whose output only feeds a depthwise conv may lose a channel the depthwise
     conv has dead (that channel is never read); or
   * **column rule**: it is never read — its column is zero in every coupled consumer's baked weights (FedMask's
     group lasso, Eq. 9, drives mask columns to zero as well as rows), counting only the consumer's rows that
     stay, and it reaches nothing else: every op between producer and consumers is channel-local (activations,
     pooling, batch norm, adds, reshapes), none is the model's output. Its value (bias included) then never
     reaches the output. An LSTM's units never qualify: the ops after it (the RNN op, ``x[:, -1]``) are not
     channel-local, and its recurrence reads every unit back through the unmasked W_o. Removing a consumer's
     rows can leave more columns unread, so the rules run to a fixed point;
4. never remove the network's final outputs; a layer with every unit dead raises (it would cut the network); a
   layer whose every unit is removable but not every one dead keeps its first unread unit (the consumers'
   outputs are then their biases; a zero-width layer would not export) — the rule of
   :func:`edgemask.trainer.models.liveness.removed_units`, which the trainer's FLOP count applies too;
5. fold batch norm into the preceding conv (inference graph; ExecuTorch's XNNPACK lowering wants it).

A unit the masks kill but compaction keeps costs its full share of time on the device, so every such unit comes
with the reason (:attr:`LayerStat.why_kept`): a residual add whose other branch keeps it live, a batch norm after
it that is not gated (no traced "norm right after" the layer: it still emits β − γ·μ/σ), an op that reads it and
maps 0 to non-zero, a layer with no handler, the model's output, or baked weights that are not zero.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import torch
import torch_pruning as tp
from torch import nn

from edgemask.errors import EdgemaskError
from edgemask.export.compact.flops import count_flops, count_params
from edgemask.export.compact.graph import (StackedLSTM, fold_batch_norms, get_module, output_layers, set_module,
                                           split_lstm)
from edgemask.export.compact.handlers import HANDLERS, handler_for
from edgemask.trainer.models.liveness import removed_units
from edgemask.trainer.models.masking import MaskedModel, unit_alive


class AllDeadLayerError(EdgemaskError):
    """Every output unit of a layer is dead: the compacted network would be cut in two."""


@dataclass(frozen=True)
class LayerStat:
    name: str  # module path in the compacted model (stacked LSTMs: "<lstm>.layer<i>")
    kept: int
    total: int
    dead: int = 0  # units the client's masks kill (mask row all zero)
    # dead units compaction keeps, grouped by why: ((reason, (unit index in the dense layer, ...)), ...)
    why_kept: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def dead_kept(self) -> int:
        return sum(len(u) for _, u in self.why_kept)


@dataclass
class CompactionResult:
    module: nn.Module  # the compacted dense model (eval mode, batch norm folded)
    layers: tuple[LayerStat, ...]
    params_dense: int
    params_compacted: int
    flops_dense: int  # per sample
    flops_compacted: int
    kept_units: dict[str, torch.Tensor] = field(default_factory=dict)  # original module path -> kept unit indices
    folded: dict[str, str] = field(default_factory=dict)  # conv path -> the batch norm folded into it

    @property
    def param_ratio(self) -> float:
        return self.params_dense / max(1, self.params_compacted)

    @property
    def flop_ratio(self) -> float:
        return self.flops_dense / max(1, self.flops_compacted)


def _dead_by_mask(masked: MaskedModel) -> dict[str, torch.Tensor]:
    """Module path (after the LSTM split) -> bool per output unit: dead by the client's masks."""
    dead: dict[str, torch.Tensor] = {}
    for site in masked.sites:
        if site.weights[0] not in masked.masks:
            continue
        alive = unit_alive(site, masked.masks)
        if site.kind == "lstm":
            lstm = get_module(masked.base, site.name)
            for i, a in enumerate(alive):
                path = f"{site.name}.layer{i}" if lstm.num_layers > 1 else site.name
                dead[path] = ~a
        else:
            dead[site.name] = ~alive
    return dead


def _upstream_of_depthwise(dg: tp.DependencyGraph, dw_node) -> set[nn.Module]:
    """Producers (and their batch norms / activations) whose output reaches ``dw_node`` only through
    element-wise ops and batch norm, and feeds nothing else."""
    found: set[nn.Module] = set()
    stack = list(dw_node.inputs)
    while stack:
        node = stack.pop()
        if len(node.outputs) != 1:  # also read elsewhere (e.g. a residual): not exempt
            continue
        mod = node.module
        found.add(mod)
        if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Linear, nn.LSTM)):
            continue  # a producer: stop here
        stack.extend(node.inputs)
    return found


# Torch-Pruning op nodes whose op maps a zero channel to a zero channel (autograd node names, without the
# trailing "Backward<N>"). Anything else (sigmoid, exp, x + constant, ...) keeps the units flowing through it.
_ZERO_PRESERVING = re.compile(
    r"(Relu|Hardtanh|Threshold|LeakyRelu|Gelu|Silu|Hardswish|Tanh|MaxPool\w*|AvgPool\w*|AdaptiveAvgPool\w*|Mean|"
    r"View|Reshape\w*|Flatten|Permute|Transpose|T|Select|Slice|Clone|Squeeze|Unsqueeze|Cat|Split\w*|Unbind|"
    r"Mul|Add|Max|MaxPool2DWithIndices|Lstm\w*|MkldnnRnn\w*|Unsafe\w*|Index)Backward\d*")


def _op_name(node) -> str:
    """The autograd node name of a Torch-Pruning op node (e.g. ``ReluBackward0``)."""
    return type(node.grad_fn).__name__ if node.grad_fn is not None else ""


def _zero_preserving(node) -> bool:
    name = _op_name(node)
    if not _ZERO_PRESERVING.fullmatch(name):
        return False
    if name.startswith("Add") and len(node.inputs) < 2:  # x + constant
        return False
    return True


def _is_depthwise(m: nn.Module) -> bool:
    return isinstance(m, (nn.Conv1d, nn.Conv2d)) and m.groups > 1 and m.groups == m.in_channels == m.out_channels


# Ops after which a unit's channel is still the same channel, independent of the others (element-wise, per-channel
# pooling, reshapes Torch-Pruning maps the indices of): the column rule may look through them. Anything else
# (softmax, a sum over channels, slicing, ...) may read a unit by another way than a consumer's column.
_CHANNEL_LOCAL = re.compile(
    r"(Relu|Hardtanh|Threshold|LeakyRelu|Gelu|Silu|Hardswish|Tanh|Sigmoid|Hardsigmoid|Elu|Softplus|MaxPool\w*|"
    r"AvgPool\w*|AdaptiveAvgPool\w*|MaxPool2DWithIndices|View|Reshape\w*|UnsafeView|Flatten|T|Clone|Squeeze|"
    r"Unsqueeze|Cat|Split\w*|Unbind|Mul|Add|Sub|Div|Neg)Backward\d*")


def _channel_local(node) -> bool:
    """Does this op node keep each channel (dim 1) to itself? A mean is channel-local only over dims ≥ 2."""
    name = _op_name(node)
    if name == "MeanBackward1":
        ndim = len(node.grad_fn._saved_self_sym_sizes)
        dims = {d % ndim for d in node.grad_fn._saved_dim}
        return ndim > 2 and 0 not in dims and 1 not in dims
    return bool(_CHANNEL_LOCAL.fullmatch(name))


def _on_root(n_root: int, item, per_unit: torch.Tensor) -> torch.Tensor:
    """Bool per root index: false where any of ``item``'s units mapped onto it is false in ``per_unit``
    (a flatten maps one root channel onto many units)."""
    out = torch.ones(n_root, dtype=torch.bool)
    bad = ~per_unit[torch.as_tensor(item.idxs, dtype=torch.long)]
    out[torch.as_tensor(item.root_idxs, dtype=torch.long)[bad]] = False
    return out


def _why(why: dict[int, list[str]] | None, idx: torch.Tensor, reason: str) -> None:
    if why is not None:
        for i in idx.tolist():
            if reason not in why.setdefault(i, []):
                why[i].append(reason)


def _removable(dg: tp.DependencyGraph, group, names: dict[nn.Module, str], dead: dict[str, torch.Tensor],
               n_root: int, removed: dict[nn.Module, torch.Tensor], why: dict[int, list[str]] | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Bool per root index of ``group``: (removable by either rule, removable by the row rule); see the module
    docstring. ``removed``: output units the current plan removes, per producer (their rows don't read).
    ``why``: if given, filled with root index -> what keeps it by the row rule (one line per cause)."""
    ok = torch.ones(n_root, dtype=torch.bool)
    unread = torch.ones(n_root, dtype=torch.bool)
    readers, only_columns = 0, True  # the column rule needs consumers, and nothing else reading
    exempt: dict[nn.Module, torch.Tensor] = {}
    items = []
    for item in group:
        mod = item.dep.target.module
        root = torch.as_tensor(item.root_idxs, dtype=torch.long)
        h = handler_for(mod) if isinstance(mod, nn.Module) else None
        is_out = dg.is_out_channel_pruning_fn(item.dep.handler) or _is_depthwise(mod) or \
            isinstance(mod, nn.modules.batchnorm._BatchNorm)
        if is_out and not item.dep.target.outputs:  # its output is the model's: read
            only_columns = False
        if not is_out:  # a consumer's input units
            zero_in = None
            if h is not None and mod in names:
                zero_in = h.zero_inputs(mod, ~removed.get(mod, torch.zeros(h.out_units(mod), dtype=torch.bool)))
            if zero_in is None:
                only_columns = False
            else:
                readers += 1
                unread &= _on_root(n_root, item, zero_in)
            continue
        if mod not in names:  # one of Torch-Pruning's op nodes (activation, add, reshape, ...)
            if not _zero_preserving(item.dep.target):
                ok[root] = False
                op = re.sub(r"Backward\d*$", "", _op_name(item.dep.target)) or "an untraced op"
                _why(why, root, f"read by op {op}, which does not map 0 to 0")
            only_columns &= _channel_local(item.dep.target)
            continue
        if h is None:  # a layer we know nothing about: keep every unit it touches
            ok[root] = False
            only_columns = False
            _why(why, root, f"also reaches layer {names[mod]!r} ({type(mod).__name__}), which has no compaction "
                            f"handler (export.compact.register_handler)")
            continue
        zero = h.zero_units(names[mod], mod, dead.get(names[mod]))
        items.append((mod, zero, item))
        if _is_depthwise(mod):
            node = dg.module2node[mod]
            z_root = torch.zeros(n_root, dtype=torch.bool)
            z_root[root] = zero[torch.as_tensor(item.idxs)]
            for up in _upstream_of_depthwise(dg, node):
                exempt[up] = exempt.get(up, torch.ones(n_root, dtype=torch.bool)) & z_root
    zeros: dict[nn.Module, tuple[torch.Tensor, torch.Tensor]] = {}  # module -> (zero, covered) per root index
    for mod, zero, item in items:
        z_root = torch.zeros(n_root, dtype=torch.bool)
        z_root[torch.as_tensor(item.root_idxs, dtype=torch.long)] = zero[torch.as_tensor(item.idxs)]
        if mod in exempt:
            z_root |= exempt[mod]
        # root indices this item does not cover stay as they are
        covered = torch.zeros(n_root, dtype=torch.bool)
        covered[torch.as_tensor(item.root_idxs, dtype=torch.long)] = True
        ok &= z_root | ~covered
        zeros[mod] = z_root, covered
    for mod, (z_root, covered) in (zeros.items() if why is not None else ()):
        live = covered & ~z_root
        name = names[mod]
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            # a leak only where what feeds it is zero (a live input is the producer's reason, said there)
            src = [n.module for n in dg.module2node[mod].inputs]
            if len(src) == 1 and src[0] in zeros:
                live &= zeros[src[0]][0]
            _why(why, live.nonzero().flatten(),
                 f"batch norm {name!r} is not gated (not traced as right after a masked layer): it emits β − γ·μ/σ")
        elif _is_depthwise(mod):  # a live depthwise filter reads the channel (its output is not zero)
            _why(why, live.nonzero().flatten(), f"the depthwise conv {name!r} after it keeps that channel live")
        else:  # the layer itself (weights not baked to zero) or another coupled producer
            _why(why, live.nonzero().flatten(), f"live in {name!r}")
    if readers and only_columns:
        return ok | unread, ok
    return ok, ok


def _plan(dg: tp.DependencyGraph, groups: list, names: dict[nn.Module, str],
          dead: dict[str, torch.Tensor]) -> tuple[list[tuple[nn.Module, object, list[int]]],
                                                  dict[str, dict[int, list[str]]]]:
    """Per group, ``(root, pruning fn, root indices to remove)``, run to a fixed point: a consumer's removed
    rows read nothing, so they can leave more of its input units unread. Removal only grows from pass to pass
    (the unit a layer keeps when all are unread is the same in every pass), so this ends.

    Also returns, per producer layer path, unit index -> what keeps it by the row rule (in the final plan)."""
    removed: dict[nn.Module, torch.Tensor] = {}
    while True:
        plans, now, reasons = [], {}, {}
        for group in groups:
            root = group[0].dep.target.module
            why: dict[int, list[str]] = {}
            ok, by_row = _removable(dg, group, names, dead, len(group[0].idxs), removed, why)
            if by_row.all():
                producers = sorted({names[it.dep.target.module] for it in group
                                    if dg.is_out_channel_pruning_fn(it.dep.handler) and
                                    isinstance(it.dep.target.module, (nn.Conv1d, nn.Conv2d, nn.Linear, nn.LSTM))})
                raise AllDeadLayerError(f"layer {names[root]!r}: every output unit is dead in all coupled layers "
                                        f"({', '.join(producers)}); the compacted network would be cut there. "
                                        f"Retrain with a lower pruning rate for it, or exclude it from masking")
            ok = removed_units(by_row, ok)  # every unit dead or unread, not all dead: the first unread one stays
            if ok.any():
                plans.append((root, group[0].dep.handler, ok.nonzero().flatten().tolist()))
            for item in group:
                mod = item.dep.target.module
                if dg.is_out_channel_pruning_fn(item.dep.handler) and isinstance(mod, nn.Module) and \
                        handler_for(mod) is not None and mod in names:
                    gone = now.setdefault(mod, torch.zeros(handler_for(mod).out_units(mod), dtype=torch.bool))
                    gone[torch.as_tensor(item.idxs, dtype=torch.long)] = ok[torch.as_tensor(item.root_idxs,
                                                                                             dtype=torch.long)]
                    per_unit = reasons.setdefault(names[mod], {})
                    for u, r in zip(item.idxs, item.root_idxs):
                        for line in why.get(int(r), []):
                            if line not in per_unit.setdefault(int(u), []):
                                per_unit[int(u)].append(line)
        if now.keys() == removed.keys() and all(torch.equal(now[m], removed[m]) for m in now):
            return plans, reasons
        removed = now


def _why_kept(name: str, dead: torch.Tensor | None, kept: torch.Tensor, reasons: dict[int, list[str]],
              protected: set[str]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """Dead units of layer ``name`` that stay, grouped by reason (a unit with several causes: "; "-joined).
    "live in <this layer>" means its baked weights are not zero (masks and weights disagree)."""
    if dead is None:
        return ()
    groups: dict[str, list[int]] = {}
    for u in sorted(set(dead.nonzero().flatten().tolist()) & set(kept.tolist())):
        lines = [("its baked weights are not zero (masks and weights disagree)" if r == f"live in {name!r}" else
                  f"residual add: live in {r[len('live in '):]}" if r.startswith("live in ") else r)
                 for r in reasons.get(u, [])]
        if not lines:
            lines = ["the model's output (never removed)" if name in protected else
                     "kept so the layer is not zero-width (every other unit is removed)" if len(kept) == 1 else
                     "coupled with a layer compaction leaves whole (the model's output)"]
        groups.setdefault("; ".join(lines), []).append(u)
    return tuple((r, tuple(us)) for r, us in groups.items())


def compact(masked: MaskedModel, example: tuple[torch.Tensor, ...] | torch.Tensor,
            fold_bn: bool = True) -> CompactionResult:
    """Compact ``masked`` (a client's :class:`MaskedModel`) into a smaller dense model.

    ``example``: model inputs of batch size 1 (used to trace the graph and count FLOPs).
    Raises :class:`AllDeadLayerError` for a layer with every unit dead, and
    :class:`~edgemask.export.compact.handlers.UnsupportedLayerError` for a layer kind compaction cannot handle exactly.
    """
    example = example if isinstance(example, tuple) else (example,)
    example = tuple(x[:1] for x in example)
    dense_ref = masked.base.eval()
    flops_dense = count_flops(dense_ref, example)
    params_dense = count_params(dense_ref)

    model = copy.deepcopy(masked.baked()).eval()  # step 1 (baked() copies; the copy keeps the input untouched)
    for name, mod in list(model.named_modules()):
        h = handler_for(mod)
        if h is not None:
            h.check(name, mod)
    dead = _dead_by_mask(masked)
    for name, mod in list(model.named_modules()):  # step 2
        if isinstance(mod, nn.LSTM) and mod.num_layers > 1:
            set_module(model, name, split_lstm(mod))

    protected = set(output_layers(model, example))
    names = {m: n for n, m in model.named_modules()}
    totals = {n: handler_for(m).out_units(m) for n, m in model.named_modules()
              if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Linear, nn.LSTM))}

    with torch.enable_grad():  # step 3: Torch-Pruning traces through autograd
        dg = tp.DependencyGraph().build_dependency(
            model, example_inputs=list(example) if len(example) > 1 else example[0],
            customized_pruners={t: h.pruner for t, h in HANDLERS.items() if h.pruner is not None},
            verbose=False)
    # conv -> bn pairs to fold later, read off the graph before pruning changes anything
    bn_pairs = []
    for mod, node in dg.module2node.items():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm) and len(node.inputs) == 1:
            src = node.inputs[0]
            if isinstance(src.module, (nn.Conv1d, nn.Conv2d)) and len(src.outputs) == 1:
                bn_pairs.append((names[src.module], names[mod]))

    ignored = [get_module(model, n) for n in protected]
    groups = list(dg.get_all_groups(ignored_layers=ignored,
                                    root_module_types=(nn.Conv1d, nn.Conv2d, nn.Linear, nn.LSTM)))
    plans, reasons = _plan(dg, groups, names, dead)

    kept_units = {n: torch.arange(t) for n, t in totals.items()}
    for root, fn, idxs in plans:
        grp = dg.get_pruning_group(root, fn, idxs)
        for item in grp:
            mod = item.dep.target.module
            if isinstance(mod, nn.Module) and names.get(mod) in kept_units and (
                    dg.is_out_channel_pruning_fn(item.dep.handler) or _is_depthwise(mod)):
                k = kept_units[names[mod]]
                drop = torch.zeros(len(k), dtype=torch.bool)
                drop[torch.as_tensor(item.idxs, dtype=torch.long)] = True
                kept_units[names[mod]] = k[~drop]
        grp.prune(record_history=False)

    folded = dict(fold_batch_norms(model, bn_pairs)) if fold_bn else {}  # step 5
    model.eval()
    layers = tuple(LayerStat(n, len(kept_units[n]), totals[n], int(dead[n].sum()) if n in dead else 0,
                             _why_kept(n, dead.get(n), kept_units[n], reasons.get(n, {}), protected))
                   for n in totals)
    # kept units of a split LSTM, under the original module's name (its output is the last layer's)
    for name, mod in model.named_modules():
        if isinstance(mod, StackedLSTM):
            kept_units[name] = kept_units[f"{name}.layer{mod.num_layers - 1}"]
    return CompactionResult(model, layers, params_dense, count_params(model), flops_dense,
                            count_flops(model, example), kept_units, folded)
