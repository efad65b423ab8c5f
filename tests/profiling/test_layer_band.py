"""A per-layer comparison that checks itself: a layer the mask left unchanged must measure alike in the dense and
the compacted profile (UNCHANGED_BAND); hand-built rows, then real onnxruntime profiles at 2 threads."""

from __future__ import annotations

import pytest

from edgemask.profiling.layers import COARSE_MS, UNCHANGED_BAND, LayerBreakdown, LayerRow, layer_table, suspect_reason

LAYERS = [  # conv1 unchanged, conv2 pruned (its FLOPs fall), out unchanged
    {"name": "conv1", "kept": 16, "total": 16, "flops_dense": 1000, "flops_compacted": 1000},
    {"name": "conv2", "kept": 4, "total": 32, "flops_dense": 8000, "flops_compacted": 1000},
    {"name": "out", "kept": 10, "total": 10, "flops_dense": 640, "flops_compacted": 640},
]


def _bd(rows):
    return LayerBreakdown("r/c", "dev", "onnx", "fp32", 2, tuple(rows), 0.0, 0.0, 1.0, 1.0, 1.0, 1.0)


def test_unchanged_layers_within_the_band_leave_the_comparison_trusted():
    rows = layer_table(LAYERS, {"conv1": 1.0, "conv2": 8.0, "out": 0.02}, {"conv1": 0.81, "conv2": 1.0, "out": 0.024})
    # conv1 1.0/0.81 = 1.23× and out 0.83× are inside 0.8-1.25; conv2's 8× is a pruned layer's, not judged
    assert [r.unchanged for r in rows] == [True, False, True] and not any(r.out_of_band for r in rows)
    assert _bd(rows).suspect is None


def test_an_unchanged_layer_outside_the_band_marks_the_comparison_suspect():
    # the case: unchanged conv at 1.75× (the dense profile ran slower than it should)
    rows = layer_table(LAYERS, {"conv1": 1.75, "conv2": 8.0, "out": 0.02}, {"conv1": 1.0, "conv2": 1.0, "out": 0.02})
    assert [r.out_of_band for r in rows] == [True, False, False]
    why = _bd(rows).suspect
    assert why == suspect_reason(rows) and why.startswith("unchanged layers measure outside 0.8-1.25× (conv1 1.75×)")
    assert "kept out of the summary" in why
    # below the band too (1/1.3 = 0.77×); a layer under COARSE_MS is too coarse to judge
    rows = layer_table(LAYERS, {"conv1": 1.0, "conv2": 8.0, "out": COARSE_MS / 2},
                       {"conv1": 1.3, "conv2": 1.0, "out": COARSE_MS})
    assert [r.out_of_band for r in rows] == [True, False, False] and "conv1 0.77×" in suspect_reason(rows)
    assert UNCHANGED_BAND == (0.8, 1.25)
    assert LayerRow("x", 1, 1, 0, 0, 1.0, 2.0).unchanged is False  # no FLOPs recorded: not judged


ROUNDS = 8  # at most; at least 2


@pytest.mark.slow
def test_dense_and_compacted_profiles_at_two_threads_agree_on_unchanged_layers(tmp_path):
    """A conv net whose last conv keeps 4 of 64 filters; the first two convs are unchanged. Dense and compacted
    profiled by the runner at 2 threads, interleaved over rounds (the best of each layer's per-round medians, as
    benchmarks/bench_layers.py does; up to ROUNDS): every unchanged layer measures within the band."""
    import torch
    from torch import nn

    from edgemask.devices.remote.runner.benchmark import profile_runs
    from edgemask.export.compact import compact
    from edgemask.export.formats import FORMATS, ExportSettings, FormatContext
    from edgemask.export.layers import layer_records
    from edgemask.profiling.layers import layer_ms, name_index
    from edgemask.trainer.models import MaskedModel, model_sites
    from edgemask.trainer.models.masking import all_ones_masks

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 32, 3, padding=1), nn.Conv2d(32, 64, 3, padding=1)
            self.conv3, self.out = nn.Conv2d(64, 64, 3, padding=1), nn.Linear(64, 10)

        def forward(self, x):
            x = torch.relu(self.conv3(torch.relu(self.conv2(torch.relu(self.conv1(x))))))
            return self.out(x.mean((2, 3)))

    torch.manual_seed(0)
    base = Net().eval()
    sites = model_sites(base)
    masks = all_ones_masks(base, tuple(s for s in sites if s.name != "out"))
    masks["conv3.weight"][4:] = 0
    x = torch.randn(1, 3, 128, 128)  # conv1 ~0.15 ms at 2 threads: a few us of jitter, a few %
    recs, paths = {}, {}
    for tag, m in (("dense", {}), ("compacted", masks)):
        res = compact(MaskedModel(base, sites, m), x)
        paths[tag] = tmp_path / f"{tag}.onnx"
        FORMATS.get("onnx").write(res.module, paths[tag], FormatContext(x, ExportSettings()))
        recs[tag] = layer_records(base, res.module, (x,), res.layers, {paths[tag].name: paths[tag]})
    best = {"dense": {}, "compacted": {}}
    for done in range(1, ROUNDS + 1):
        for tag in best:
            prof = profile_runs("onnx", str(paths[tag]), [x.numpy()], 2, 5, 15)
            for k, v in layer_ms(prof["runs"], name_index(recs[tag], paths[tag].name)).items():
                best[tag][k] = min(best[tag].get(k, float("inf")), v)
        rows = {r.layer: r for r in layer_table(recs["compacted"], best["dense"], best["compacted"])}
        # the best of each layer's medians settles once both profiles had an undisturbed round: a loaded host (CI,
        # once: conv1 at 1.38x after 3 rounds) needs more rounds; a real difference stays out of band in all of them
        if done >= 2 and suspect_reason(list(rows.values())) is None:
            break
    assert [k for k, r in rows.items() if r.unchanged] == ["conv1", "conv2"]
    for k in ("conv1", "conv2"):
        assert UNCHANGED_BAND[0] <= rows[k].speedup <= UNCHANGED_BAND[1], (k, rows[k])
    assert suspect_reason(list(rows.values())) is None
