"""Per-layer attribution records for the manifest: what the host needs to map a device's operator times back to
the pruned layer and to the FLOPs its mask removed (docs/architecture.md, "Per-layer profiling").

Per layer (conv, linear, LSTM module path of the compacted model, which is the dense model's path too):

* units kept / total (from compaction), the units the masks kill, and the dead units compaction keeps with the
  reason (a residual branch keeps them live, an ungated batch norm, an op mapping 0 to non-zero, ...);
* FLOPs of one sample, dense and compacted: 2 × the layer's MACs (:func:`edgemask.export.compact.flops.layer_flops`, the
  terms :func:`~edgemask.export.compact.flops.count_flops` sums, so they add up to the manifest's totals). A layer's
  **FLOP bound** is ``flops_dense / flops_compacted``: the speedup its operator would show if time followed FLOPs;
* ``graph_names``: per exported ONNX file, the node names and output tensor names of the nodes that compute the
  layer, plus the element-wise activations that only consume it (onnxruntime fuses them into the layer's kernel and
  names the fused kernel after such a tensor, e.g. ``relu_nchwc``).

ONNX nodes are assigned to a module path from what the exporter writes: the dynamo exporter's ``namespace``
metadata (``": Net/features: Sequential/features.0.conv: Conv2d/conv2d: aten.conv2d.default"``), or the
TorchScript exporter's name scopes (``/features/features.0/conv/Conv``).

ExecuTorch: :func:`write_etrecord` writes the ETRecord beside the ``.pte`` so the host's Inspector can map ETDump
events (debug handles) to module hierarchies.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Iterable, Sequence

import torch
from torch import nn

from edgemask.export.compact.flops import layer_flops
from edgemask.export.compact.graph import set_module, split_lstm

# ONNX ops onnxruntime fuses into the preceding Conv/Gemm kernel (FusedConv / FusedGemm activations)
FUSABLE_ACTIVATIONS = frozenset({"Relu", "Clip", "LeakyRelu", "HardSigmoid", "Sigmoid", "Tanh"})
ETRECORD = "model.etrecord"


def dense_twin(base: nn.Module) -> nn.Module:
    """A copy of the dense model with stacked LSTMs split into single-layer ones, as compaction does, so its
    layer module paths (``lstm.layer0``, ...) are the compacted model's."""
    twin = copy.deepcopy(base).eval()
    for name, mod in list(twin.named_modules()):
        if isinstance(mod, nn.LSTM) and mod.num_layers > 1:
            set_module(twin, name, split_lstm(mod))
    return twin


def _dynamo_paths(namespace: str) -> list[str]:
    """``": Net/features: Sequential/features.0.conv: Conv2d/conv2d: aten.conv2d.default"`` ->
    ``["", "features", "features.0.conv", "conv2d"]`` (each scope's module path, outermost first)."""
    return [part.split(":", 1)[0].strip() for part in namespace.split("/")]


def _scope_paths(node_name: str) -> list[str]:
    """TorchScript name scopes ``/features/features.0/conv/Conv`` -> ``["features", "features.0",
    "features.0.conv"]``: a scope that does not extend the one above it is an attribute name under it."""
    paths, path = [], ""
    for part in node_name.split("/")[1:-1]:
        path = part if not path or part.startswith(path + ".") else f"{path}.{part}"
        paths.append(path)
    return paths


def onnx_graph_names(path: str | Path, layers: Iterable[str]) -> dict[str, list[str]]:
    """Layer module path -> the names (node names and output tensor names) its ONNX nodes carry in ``path``.

    A node belongs to the deepest layer among its scopes; a fusable activation (:data:`FUSABLE_ACTIVATIONS`)
    whose only input producer is a layer's node, and which is that output's only consumer, belongs to it too.
    Layers with no node (none expected) are left out."""
    import onnx

    wanted = set(layers)
    graph = onnx.load(str(path), load_external_data=False).graph
    owner: dict[int, str] = {}
    for i, node in enumerate(graph.node):
        meta = {p.key: p.value for p in node.metadata_props}
        scopes = _dynamo_paths(meta["namespace"]) if "namespace" in meta else _scope_paths(node.name)
        hits = [s for s in scopes if s in wanted]
        if hits:
            owner[i] = hits[-1]
    producer = {t: i for i, node in enumerate(graph.node) for t in node.output}
    consumers: dict[str, list[int]] = {}
    for i, node in enumerate(graph.node):
        for t in node.input:
            consumers.setdefault(t, []).append(i)
    for i, node in enumerate(graph.node):  # topological order: a chain of activations follows its layer
        if i in owner or node.op_type not in FUSABLE_ACTIVATIONS or not node.input:
            continue
        src = producer.get(node.input[0])
        if src in owner and len(consumers.get(node.input[0], [])) == 1:
            owner[i] = owner[src]
    names: dict[str, list[str]] = {}
    for i, layer in sorted(owner.items()):
        node = graph.node[i]
        names.setdefault(layer, []).extend([node.name, *[t for t in node.output if t]])
    return names


def layer_records(dense: nn.Module, compacted: nn.Module, example: tuple[torch.Tensor, ...],
                  units: Sequence, onnx_files: dict[str, Path]) -> list[dict]:
    """The manifest's ``layers`` entries: ``{"name", "kept", "total", "flops_dense", "flops_compacted",
    "graph_names": {file: [names]}, "dead", "why_kept": [{"reason", "units"}]}`` per layer of ``units``
    (compaction's :class:`LayerStat` records; ``why_kept``: the dead units it keeps, grouped by reason).

    ``dense``: the unmasked model (:func:`dense_twin` is applied here); ``onnx_files``: file name -> path of each
    exported ONNX file."""
    fd = layer_flops(dense_twin(dense), example)
    fc = layer_flops(compacted.eval(), example)
    names = [u.name for u in units]
    graph = {f: onnx_graph_names(p, names) for f, p in onnx_files.items()}
    return [{"name": u.name, "kept": u.kept, "total": u.total, "flops_dense": fd.get(u.name, 0),
             "flops_compacted": fc.get(u.name, 0),
             "graph_names": {f: g.get(u.name, []) for f, g in graph.items()},
             "dead": u.dead, "why_kept": [{"reason": r, "units": list(us)} for r, us in u.why_kept]}
            for u in units]


def kept_dead_notes(layers: Iterable[dict]) -> list[str]:
    """One line per layer whose dead units compaction keeps, from manifest ``layers`` records: what makes a
    1× speedup where the masks promised more, e.g. ``stage1.b: keeps 2 of its 2 dead units (1, 3): residual add:
    live in 'entry'``."""
    lines = []
    for rec in layers:
        for why in rec.get("why_kept", []):
            units = why["units"]
            shown = ", ".join(map(str, units[:8])) + (", ..." if len(units) > 8 else "")
            lines.append(f"{rec['name']}: keeps {len(units)} of its {rec.get('dead', len(units))} dead units "
                         f"({shown}): {why['reason']}")
    return lines


def write_etrecord(model: nn.Module, example: torch.Tensor, path: Path) -> Path:
    """Lower ``model`` as :mod:`export.formats.pte` does, with ``generate_etrecord=True``, and save the ETRecord
    (edge and exported programs, debug-handle map, delegate map) at ``path``. The Inspector reads it beside an
    ETDump to give each event its module hierarchy."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from edgemask.fileio import atomic_path
    from edgemask.export.formats.base import quiet_exporters
    from edgemask.export.runtime import runtime_layout
    from edgemask.export.formats.pte import _explicit_pool_stride

    with quiet_exporters():
        ep = torch.export.export(model.eval(), (runtime_layout(example),))  # the .pte's own layout (formats.pte)
        _explicit_pool_stride(ep)
        et = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()],
                                         generate_etrecord=True).to_executorch()
        with atomic_path(path) as tmp:
            et.get_etrecord().save(str(tmp))
    return path
