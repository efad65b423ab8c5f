"""Attribution of operator times to layers and layers to masks: hand-computed values, then real exported ONNX
files profiled in real onnxruntime."""

from __future__ import annotations

import math

import pytest

from edgemask.profiling.layers import (OTHER, LayerRow, coverage, layer_ms, layer_of, layer_table, name_index,
                                       run_layer_us)

LAYERS = [  # manifest records as export writes them (dynamo exporter names)
    {"name": "conv1", "kept": 2, "total": 16, "flops_dense": 18432, "flops_compacted": 2304,
     "graph_names": {"model.onnx": ["node_conv2d", "conv2d", "node_relu", "relu"]}},
    {"name": "conv2", "kept": 32, "total": 32, "flops_dense": 147456, "flops_compacted": 18432,
     "graph_names": {"model.onnx": ["node_conv2d_1", "conv2d_1", "node_relu_1", "relu_1"]}},
    {"name": "out", "kept": 10, "total": 10, "flops_dense": 640, "flops_compacted": 640,
     "graph_names": {"model.onnx": ["node_linear", "output"]}},
]


def test_operator_names_map_to_layers():
    idx = name_index(LAYERS, "model.onnx")
    assert layer_of("relu_nchwc", idx) == "conv1"  # fused Conv+Relu, NCHWc kernel named after the relu tensor
    assert layer_of("relu_1_nchwc", idx) == "conv2"  # the longest name wins: relu_1, not relu
    assert layer_of("fused node_conv2d_1", idx) == "conv2"  # onnxruntime 1.10's Conv+activation fusion name
    assert layer_of("node_conv2d_1_node_relu_1", idx) == "conv2"  # later fusion name: "<conv>_<activation>"
    assert layer_of("node_linear", idx) == "out"
    assert layer_of("node_relu_10", idx) == OTHER  # not "node_relu" followed by a separator
    assert layer_of("ReorderOutput_token_4", idx) == OTHER
    assert name_index(LAYERS, "model.int8.onnx") == {}


def test_times_per_layer_median_and_coverage():
    idx = name_index(LAYERS, "model.onnx")
    runs = [
        {"end_to_end_ms": 0.5, "ops": [["relu_nchwc", "Conv", 100.0], ["max_pool2d_nchwc", "MaxPool", 20.0],
                                       ["relu_1_nchwc", "Conv", 300.0], ["node_linear", "Gemm", 10.0]]},
        {"end_to_end_ms": 0.6, "ops": [["relu_nchwc", "Conv", 120.0], ["relu_1_nchwc", "Conv", 340.0],
                                       ["node_linear", "Gemm", 12.0]]},
        {"end_to_end_ms": 0.4, "ops": [["relu_nchwc", "Conv", 90.0], ["max_pool2d_nchwc", "MaxPool", 30.0],
                                       ["relu_1_nchwc", "Conv", 260.0], ["node_linear", "Gemm", 11.0]]},
    ]
    assert run_layer_us(runs[0]["ops"], idx) == {"conv1": 100.0, OTHER: 20.0, "conv2": 300.0, "out": 10.0}
    # medians: conv1 of (100, 120, 90), conv2 of (300, 340, 260), out of (10, 12, 11), other of (20, 0, 30)
    assert layer_ms(runs, idx) == {"conv1": 0.1, "conv2": 0.3, "out": 0.011, OTHER: 0.02}
    assert coverage(runs[0]) == pytest.approx(0.430 / 0.5)
    assert math.isnan(coverage({"end_to_end_ms": None, "ops": []}))


def test_layer_rows_bound_speedup_and_flag():
    rows = layer_table(LAYERS, {"conv1": 0.4, "conv2": 1.6, "out": 0.01}, {"conv1": 0.1, "conv2": 0.8})
    r1, r2, r3 = rows
    assert (r1.flop_bound, r1.speedup, r1.realized, r1.flagged) == (8.0, 4.0, 0.5, False)  # exactly half: kept
    assert (r2.flop_bound, r2.speedup, r2.realized, r2.flagged) == (8.0, 2.0, 0.25, True)
    assert r3.flop_bound == 1.0 and math.isnan(r3.compacted_ms) and math.isnan(r3.speedup) and not r3.flagged
    assert LayerRow("x", 1, 2, 10, 0, 1.0, 1.0).flop_bound != LayerRow("x", 1, 2, 10, 0, 1.0, 1.0).flop_bound  # NaN


@pytest.mark.slow
@pytest.mark.parametrize("opset", [18, 15])  # dynamo exporter; TorchScript exporter (jetson-tx2's opset <= 15)
def test_real_onnx_profile_attributes_every_kernel(tmp_path, opset):
    """A conv net with conv1 keeping 4 of 64 filters, exported for real, profiled in onnxruntime via the runner."""
    import torch

    from edgemask.devices.remote.runner.benchmark import profile_runs
    from edgemask.export.compact import compact
    from edgemask.export.formats import FORMATS, ExportSettings, FormatContext
    from edgemask.export.layers import layer_records
    from edgemask.trainer.models import MaskedModel, build_model, model_sites
    from edgemask.trainer.models.masking import all_ones_masks

    torch.manual_seed(0)
    base = build_model("cnn", (3, 128, 128), 10, widths=(64, 128)).eval()
    sites = model_sites(base)
    masks = all_ones_masks(base, tuple(sites))
    masks["conv1.weight"][4:] = 0
    x = torch.randn(1, 3, 128, 128)
    results = {"dense": compact(MaskedModel(base, sites, {}), x),
               "compacted": compact(MaskedModel(base, sites, masks), x)}
    recs, ms, covered = {}, {}, {}
    for tag, res in results.items():
        path = tmp_path / f"{tag}.onnx"
        FORMATS.get("onnx").write(res.module, path, FormatContext(x, ExportSettings(opset=opset)))
        recs[tag] = layer_records(base, res.module, (x,), res.layers, {path.name: path})
        prof = profile_runs("onnx", str(path), [x.numpy()], 1, 3, 8)
        idx = name_index(recs[tag], path.name)
        for run in prof["runs"]:  # every Conv and Gemm kernel is claimed by a layer
            assert all(layer_of(op[0], idx) != OTHER for op in run["ops"] if op[1] in ("Conv", "Gemm", "FusedConv"))
        ms[tag] = layer_ms(prof["runs"], idx)
        covered[tag] = sorted(coverage(r) for r in prof["runs"])[len(prof["runs"]) // 2]
    # every compacted layer maps to its dense counterpart, both measured
    assert [r["name"] for r in recs["compacted"]] == [r["name"] for r in recs["dense"]] == ["conv1", "conv2", "out"]
    rows = {r.layer: r for r in layer_table(recs["compacted"], ms["dense"], ms["compacted"])}
    # the convs take tens of µs; the 10-unit `out` may read 0 in the profiler's whole microseconds
    assert all(r.dense_ms > 0 and r.compacted_ms > 0 for k, r in rows.items() if k != "out")
    assert rows["out"].dense_ms >= 0 and rows["out"].compacted_ms >= 0
    # hand-computed bounds: conv1 64 -> 4 filters (16×), conv2 reads 4 of 64 channels (16×), out unchanged
    assert {k: r.flop_bound for k, r in rows.items()} == {"conv1": 16.0, "conv2": 16.0, "out": 1.0}
    assert rows["conv2"].flops_dense == 2 * 128 * 64 * 64 * 64 * 9  # 128 filters at 64×64, 64 channels × 3×3
    # the operator times cover at least 90 % of the profiled runs' end-to-end time
    assert covered["dense"] >= 0.85 and covered["compacted"] >= 0.85, covered  # 0.895 seen under load


def _frames(pte_reason: str, fc_us: float = 10.0):
    import json

    import pandas as pd

    files = [{"format": "onnx", "variant": "fp32", "file": "model.onnx"},
             {"format": "pte", "variant": "fp32", "file": "model.pte"}]
    dense_layers = [{**lay, "kept": lay["total"], "flops_compacted": lay["flops_dense"]} for lay in LAYERS]
    manifests = {"r/dense": {"run_id": "r", "kind": "dense", "files": files, "layers": dense_layers},
                 "r/client-000": {"run_id": "r", "kind": "compacted", "files": files, "layers": LAYERS}}
    artifacts = pd.DataFrame({"artifact": list(manifests), "manifest": [json.dumps(m) for m in manifests.values()]})
    keys = ["job_id", "artifact", "format", "variant", "device", "threads", "repetition"]
    jobs = [(f"{a}|{f}", a, f, "fp32", "dev", 1, 0) for a in manifests for f in ("onnx", "pte")]
    profiles = pd.DataFrame([(*j, j[2] == "onnx", None, None if j[2] == "onnx" else pte_reason, "[]") for j in jobs],
                            columns=[*keys, "available", "profiler", "reason", "blocks"])
    us = {"r/dense": (800.0, 1600.0, 10.0, 50.0), "r/client-000": (100.0, 400.0, fc_us, 50.0)}
    ops, runs = [], []
    for j in jobs:
        if j[2] != "onnx":
            runs.append((*j, 0, 0.5, None))
            continue
        c1, c2, fc, pool = us[j[1]]
        for run in range(2):
            runs.append((*j, run, (c1 + c2 + fc + pool + 40.0) / 1e3, None))
            kernels = [("relu_nchwc", "Conv", c1), ("node_max_pool2d", "MaxPool", pool),
                       ("relu_1_nchwc", "Conv", c2), ("node_linear", "Gemm", fc)]
            ops += [(*j, run, seq, name, op, t, "CPU") for seq, (name, op, t) in enumerate(kernels)]
    return (artifacts, profiles, pd.DataFrame(runs, columns=[*keys, "run", "end_to_end_ms", "total_us"]),
            pd.DataFrame(ops, columns=[*keys, "run", "seq", "name", "op_type", "us", "provider"]))


def test_breakdowns_from_store_frames_and_the_reason_where_none():
    from edgemask.profiling.layers import breakdowns

    reason = "this ExecuTorch runtime wrote no ETDump"
    [bd], notes = breakdowns(*_frames(reason))
    assert (bd.artifact, bd.format, bd.device, bd.threads) == ("r/client-000", "onnx", "dev", 1)
    rows = {r.layer: r for r in bd.rows}
    # conv1: 0.8 -> 0.1 ms = 8× of a bound of 8: realized 1; conv2: 1.6 -> 0.4 ms = 4× of 8: 0.5, not flagged
    assert (rows["conv1"].speedup, rows["conv1"].realized) == (8.0, 1.0)
    assert (rows["conv2"].speedup, rows["conv2"].realized, rows["conv2"].flagged) == (4.0, 0.5, False)
    assert (rows["out"].speedup, rows["out"].flop_bound) == (1.0, 1.0)
    assert (bd.other_dense_ms, bd.other_compacted_ms) == (0.05, 0.05)
    assert (bd.ops_dense_ms, bd.e2e_dense_ms) == (pytest.approx(2.46), pytest.approx(2.5))
    # what the unchanged-layer check needs comes along: the dense runs of each layer, the dense run's total, the tick
    assert rows["out"].dense_runs_ms == (0.01, 0.01) and rows["out"].dense_total_ms == pytest.approx(2.46)
    assert rows["out"].tick_ms == 1e-3 and rows["conv1"].first and not rows["out"].first
    assert notes[0] == f"per-layer times not available on dev for pte: {reason}"
    assert notes[1:] == []  # every layer takes 10 µs or more: no coarse-time note
    _, notes = breakdowns(*_frames(reason, fc_us=4.0))
    assert len(notes) == 2 and "whole microseconds" in notes[0]
    artifacts, profiles, runs, ops = _frames(reason)
    profiles.loc[profiles["format"] == "onnx", "blocks"] = '["TensorrtExecutionProvider: one block"]'
    _, notes = breakdowns(artifacts, profiles, runs, ops)
    assert notes[0] == "dev, onnx: TensorrtExecutionProvider: one block"  # said, never a silent gap


def test_a_training_steps_profile_is_no_inference_breakdown_and_no_re_export_note():
    """Training formats' per-layer profiles (torch-train, issue #46) feed the step model, not this table: before,
    every demo report said of each torch-train artifact "its manifest has no per-layer graph names … re-export"."""
    import pandas as pd

    from edgemask.profiling.layers import breakdowns

    artifacts, profiles, runs, ops = _frames("this ExecuTorch runtime wrote no ETDump")
    train = profiles[profiles["format"] == "onnx"].assign(format="torch-train", available=True, reason=None)
    train["job_id"] = train["artifact"] + "|torch-train"
    _, notes = breakdowns(artifacts, pd.concat([profiles, train]), runs, ops)
    assert not [n for n in notes if "torch-train" in n], notes
