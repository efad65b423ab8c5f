"""Compaction: a client's masked model -> a smaller dense ``nn.Module`` computing exactly the same function.

Steps (each on a copy; Torch-Pruning's ``group.prune()`` is not atomic):

1. bake the masks into the weights (:meth:`MaskedModel.baked`): dead units' rows, biases and batch-norm γ, β are 0;
2. split stacked LSTMs into single-layer ones (each layer keeps its own live count);
3. build Torch-Pruning's ``DependencyGraph`` and walk its coupled groups (conv → bn → conv, flatten boundaries,
   residual adds, depthwise convs, LSTM → linear); per group, remove only the units that are exactly zero in
   *every* coupled producer — a residual add keeps the union of live channels. Exception: a producer whose
   output only feeds a depthwise conv may lose a channel the depthwise conv has dead (that channel is never read);
4. never remove the network's final outputs; a layer with every unit dead raises (it would cut the network);
5. fold batch norm into the preceding conv (inference graph; ExecuTorch's XNNPACK lowering wants it).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field

import torch
import torch_pruning as tp
from torch import nn

from edgemask.errors import EdgemaskError
from export.compact.flops import count_flops, count_params
from export.compact.graph import StackedLSTM, fold_batch_norms, get_module, output_layers, set_module, split_lstm
from export.compact.handlers import HANDLERS, ConvHandler, handler_for
from trainer.models.masking import MaskedModel, unit_alive


class AllDeadLayerError(EdgemaskError):
    """Every output unit of a layer is dead: the compacted network would be cut in two."""


@dataclass(frozen=True)
class LayerStat:
    name: str  # module path in the compacted model (stacked LSTMs: "<lstm>.layer<i>")
    kept: int
    total: int


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


def _zero_preserving(node) -> bool:
    name = type(node.grad_fn).__name__ if node.grad_fn is not None else ""
    if not _ZERO_PRESERVING.fullmatch(name):
        return False
    if name.startswith("Add") and len(node.inputs) < 2:  # x + constant
        return False
    return True


def _is_depthwise(m: nn.Module) -> bool:
    return isinstance(m, (nn.Conv1d, nn.Conv2d)) and m.groups > 1 and m.groups == m.in_channels == m.out_channels


def _removable(dg: tp.DependencyGraph, group, names: dict[nn.Module, str], dead: dict[str, torch.Tensor],
               n_root: int) -> torch.Tensor:
    """Bool per root index of ``group``: exactly zero in every coupled producer (see module docstring)."""
    ok = torch.ones(n_root, dtype=torch.bool)
    exempt: dict[nn.Module, torch.Tensor] = {}
    items = []
    for item in group:
        mod = item.dep.target.module
        h = handler_for(mod) if isinstance(mod, nn.Module) else None
        is_out = dg.is_out_channel_pruning_fn(item.dep.handler) or _is_depthwise(mod) or \
            isinstance(mod, nn.modules.batchnorm._BatchNorm)
        if not is_out:
            continue
        if mod not in names:  # one of Torch-Pruning's op nodes (activation, add, reshape, ...)
            if not _zero_preserving(item.dep.target):
                ok[torch.as_tensor(item.root_idxs, dtype=torch.long)] = False
            continue
        if h is None:  # a layer we know nothing about: keep every unit it touches
            ok[torch.as_tensor(item.root_idxs, dtype=torch.long)] = False
            continue
        zero = h.zero_units(names[mod], mod, dead.get(names[mod]))
        items.append((mod, zero, item))
        if _is_depthwise(mod):
            node = dg.module2node[mod]
            z_root = torch.zeros(n_root, dtype=torch.bool)
            z_root[torch.as_tensor(item.root_idxs, dtype=torch.long)] = zero[torch.as_tensor(item.idxs)]
            for up in _upstream_of_depthwise(dg, node):
                exempt[up] = exempt.get(up, torch.ones(n_root, dtype=torch.bool)) & z_root
    for mod, zero, item in items:
        z_root = torch.zeros(n_root, dtype=torch.bool)
        z_root[torch.as_tensor(item.root_idxs, dtype=torch.long)] = zero[torch.as_tensor(item.idxs)]
        if mod in exempt:
            z_root |= exempt[mod]
        # root indices this item does not cover stay as they are
        covered = torch.zeros(n_root, dtype=torch.bool)
        covered[torch.as_tensor(item.root_idxs, dtype=torch.long)] = True
        ok &= z_root | ~covered
    return ok


def compact(masked: MaskedModel, example: tuple[torch.Tensor, ...] | torch.Tensor,
            fold_bn: bool = True) -> CompactionResult:
    """Compact ``masked`` (a client's :class:`MaskedModel`) into a smaller dense model.

    ``example``: model inputs of batch size 1 (used to trace the graph and count FLOPs).
    Raises :class:`AllDeadLayerError` for a layer with every unit dead, and
    :class:`~export.compact.handlers.UnsupportedLayerError` for a layer kind compaction cannot handle exactly.
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
    plans = []
    for group in dg.get_all_groups(ignored_layers=ignored,
                                   root_module_types=(nn.Conv1d, nn.Conv2d, nn.Linear, nn.LSTM)):
        root = group[0].dep.target.module
        n_root = len(group[0].idxs)
        ok = _removable(dg, group, names, dead, n_root)
        if ok.all():
            producers = sorted({names[it.dep.target.module] for it in group
                                if dg.is_out_channel_pruning_fn(it.dep.handler)
                                and isinstance(it.dep.target.module, (nn.Conv1d, nn.Conv2d, nn.Linear, nn.LSTM))})
            raise AllDeadLayerError(f"layer {names[root]!r}: every output unit is dead in all coupled layers "
                                    f"({', '.join(producers)}); the compacted network would be cut there. "
                                    f"Retrain with a lower pruning rate for it, or exclude it from masking")
        if ok.any():
            plans.append((root, group[0].dep.handler, ok.nonzero().flatten().tolist()))

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
    layers = tuple(LayerStat(n, len(kept_units[n]), totals[n]) for n in totals)
    # kept units of a split LSTM, under the original module's name (its output is the last layer's)
    for name, mod in model.named_modules():
        if isinstance(mod, StackedLSTM):
            kept_units[name] = kept_units[f"{name}.layer{mod.num_layers - 1}"]
    return CompactionResult(model, layers, params_dense, count_params(model), flops_dense,
                            count_flops(model, example), kept_units, folded)
