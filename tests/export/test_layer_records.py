"""Per-layer attribution records: hand-computed per-layer FLOPs, and the names real ONNX exports carry per layer."""

from __future__ import annotations

import pytest

from edgemask.export.compact import compact
from edgemask.export.formats import FORMATS, ExportSettings, FormatContext
from edgemask.export.layers import _dynamo_paths, _scope_paths, layer_records
from export_helpers import MODEL_CASES, masked_case, sample_input

# SmallCNN on 1×8×8: conv1 1→16 (3×3, pad 1) at 8×8, max pool 2, conv2 16→32 at 4×4, mean, out 32→10.
# conv1 keeps 2 of its 16 filters; conv2 then reads 2 input channels instead of 16.
HAND = {  # layer -> (flops dense, flops compacted), 2 × MACs of one sample
    "conv1": (2 * 16 * 8 * 8 * (1 * 3 * 3), 2 * 2 * 8 * 8 * (1 * 3 * 3)),  # 18432 -> 2304: bound 8
    "conv2": (2 * 32 * 4 * 4 * (16 * 3 * 3), 2 * 32 * 4 * 4 * (2 * 3 * 3)),  # 147456 -> 18432: bound 8
    "out": (2 * 10 * 32, 2 * 10 * 32),  # 640 -> 640: bound 1
}


@pytest.fixture
def pruned_cnn():
    masked = masked_case("cnn", kill=0.0)
    masked.masks["conv1.weight"][2:] = 0  # 14 of 16 filters dead
    x = sample_input("cnn", 4)
    return masked, compact(masked, x[:1]), x[:1]


def _onnx(model, path, example, opset):
    FORMATS.get("onnx").write(model, path, FormatContext(example, ExportSettings(opset=opset)))
    return path


@pytest.mark.parametrize("opset", [18, 15])  # dynamo exporter (namespace metadata) and TorchScript (name scopes)
def test_layer_records_hand_flops_and_onnx_names(pruned_cnn, tmp_path, opset):
    masked, res, x = pruned_cnn
    path = _onnx(res.module, tmp_path / "model.onnx", x, opset)
    recs = {r["name"]: r for r in layer_records(masked.base, res.module, (x,), res.layers, {"model.onnx": path})}
    assert {n: (r["flops_dense"], r["flops_compacted"]) for n, r in recs.items()} == HAND
    assert (recs["conv1"]["kept"], recs["conv1"]["total"]) == (2, 16)
    # the per-layer terms add up to compaction's totals
    assert sum(r["flops_dense"] for r in recs.values()) == res.flops_dense
    assert sum(r["flops_compacted"] for r in recs.values()) == res.flops_compacted
    import onnx

    nodes = {n.name: n for n in onnx.load(str(path)).graph.node}
    for layer, op in (("conv1", "Conv"), ("conv2", "Conv"), ("out", "Gemm")):
        names = recs[layer]["graph_names"]["model.onnx"]
        assert [nodes[n].op_type for n in names if n in nodes][0] == op
    # the ReLU after each conv is that conv's (onnxruntime fuses it), the one after conv1 is not conv2's
    relus = [n for n in nodes.values() if n.op_type == "Relu"]
    assert relus[0].name in recs["conv1"]["graph_names"]["model.onnx"]
    assert relus[1].name in recs["conv2"]["graph_names"]["model.onnx"]
    assert not set(recs["conv1"]["graph_names"]["model.onnx"]) & set(recs["conv2"]["graph_names"]["model.onnx"])


def test_scope_parsers():
    ns = (": __main__.Net/features: torch.nn.modules.container.Sequential/features.0.conv: "
          "torch.nn.modules.conv.Conv2d/conv2d: aten.conv2d.default")
    assert _dynamo_paths(ns) == ["", "features", "features.0.conv", "conv2d"]
    assert _scope_paths("/features/features.0/conv/Conv") == ["features", "features.0", "features.0.conv"]
    assert _scope_paths("/fc/Gemm") == ["fc"]
    assert _scope_paths("/ReduceMean") == []


@pytest.mark.parametrize("name", sorted(MODEL_CASES))
def test_per_layer_flops_add_up_on_every_model(name):
    """Split LSTMs, folded batch norms, depthwise convs, residual adds: the per-layer terms of the dense and the
    compacted net still add up to compaction's totals, and every layer has both."""
    masked = masked_case(name, kill=0.4, seed=1)
    x = sample_input(name, 1)
    res = compact(masked, x)
    recs = layer_records(masked.base, res.module, (x,), res.layers, {})
    assert sum(r["flops_dense"] for r in recs) == res.flops_dense
    assert sum(r["flops_compacted"] for r in recs) == res.flops_compacted
    assert all(r["flops_compacted"] <= r["flops_dense"] for r in recs)


@pytest.mark.slow
def test_etrecord_beside_the_pte_maps_debug_handles(pruned_cnn, tmp_path):
    """The ETRecord export writes is one the Inspector's reader accepts, with a debug-handle map to read ETDump
    events against, and it describes the compacted program (conv1 with its 2 kept filters)."""
    from executorch.devtools.etrecord import parse_etrecord

    from edgemask.export.layers import write_etrecord

    masked, res, x = pruned_cnn
    path = write_etrecord(res.module, x, tmp_path / "model.etrecord")
    rec = parse_etrecord(str(path))
    assert rec._debug_handle_map and rec.edge_dialect_program is not None
    weights = [p for p in rec.exported_program.state_dict.values() if p.dim() == 4]
    assert [tuple(w.shape) for w in weights][:1] == [(2, 1, 3, 3)]
