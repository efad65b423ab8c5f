"""A per-layer comparison that checks itself: a layer the mask left unchanged must measure alike in the dense and
the compacted profile, within a band that knows the timer's tick and the layer's own spread (unchanged_band); a
tiny layer is shown, not judged. Hand-computed bands, synthetic profiles in the runner's shape (whole-microsecond
operator times, as onnxruntime and XNNPACK report them), then real onnxruntime profiles at 1 thread."""

from __future__ import annotations

import math

import pytest

from edgemask.profiling.layers import (OTHER, SPREAD_CAP, UNCHANGED_BAND, LayerBreakdown, LayerRow, layer_ms,
                                       layer_runs_ms, layer_table, relative_spread, suspect_reason, time_text,
                                       unchanged_band)

LAYERS = [  # conv1 unchanged, conv2 pruned (its FLOPs fall), out unchanged
    {"name": "conv1", "kept": 16, "total": 16, "flops_dense": 1000, "flops_compacted": 1000},
    {"name": "conv2", "kept": 4, "total": 32, "flops_dense": 8000, "flops_compacted": 1000},
    {"name": "out", "kept": 10, "total": 10, "flops_dense": 640, "flops_compacted": 640},
]


def _bd(rows):
    return LayerBreakdown("r/c", "dev", "onnx", "fp32", 2, tuple(rows), 0.0, 0.0, 1.0, 1.0, 1.0, 1.0)


def test_the_band_widens_by_spread_and_ticks_by_hand():
    # 1 ms, spread 5 %, 1 µs ticks: w = 1.25 · 1.05 · (1 + 2 · 0.001 / 1) = 1.315125
    lo, hi = unchanged_band(1.0, 0.05, 1e-3)
    assert hi == pytest.approx(1.315125) and lo == pytest.approx(1 / 1.315125)
    # a 20 µs layer: 2 ticks are 10 %; spread 0: w = 1.25 · 1.1 = 1.375
    assert unchanged_band(0.02, 0.0, 1e-3)[1] == pytest.approx(1.375)
    # a profile under load spreads by 60 %: the spread term stops at SPREAD_CAP (w = 1.25 · 1.2 · 1.002)
    assert unchanged_band(1.0, 0.6, 1e-3)[1] == pytest.approx(1.25 * (1 + SPREAD_CAP) * 1.002)
    assert SPREAD_CAP == 0.2
    # spread: IQR ÷ median; inclusive quartiles of (1, 2, 3, 4, 5) are 2 and 4: (4 - 2) / 3
    assert relative_spread([1, 2, 3, 4, 5]) == pytest.approx(2 / 3)
    assert relative_spread([7.0]) == 0.0 and relative_spread([0, 0, 0]) == 0.0


def test_unchanged_layers_within_the_band_leave_the_comparison_trusted():
    rows = layer_table(LAYERS, {"conv1": 1.0, "conv2": 8.0, "out": 0.02}, {"conv1": 0.81, "conv2": 1.0, "out": 0.024})
    # conv1 1.0/0.81 = 1.23× inside its band (1.25 · 1.0025 at 0.81 ms); conv2's 8× is a pruned layer's, not judged
    assert [r.unchanged for r in rows] == [True, False, True] and not any(r.out_of_band for r in rows)
    assert _bd(rows).suspect is None and _bd(rows).unjudged is None


def test_an_unchanged_layer_outside_the_band_marks_the_comparison_suspect():
    # unchanged conv at 1.75× (the dense profile ran slower than it should); share unknown, 1 ms: judged
    rows = layer_table(LAYERS, {"conv1": 1.75, "conv2": 8.0, "out": 0.02}, {"conv1": 1.0, "conv2": 1.0, "out": 0.02})
    assert [r.out_of_band for r in rows] == [True, False, False] and rows[0].suspect
    why = _bd(rows).suspect
    assert why == suspect_reason(rows)
    assert why.startswith("unchanged layers measure outside their bands (conv1 1.75× outside 0.80-1.25× "
                          "(first layer: cold cache))")  # 1.25 · 1.002 prints as 1.25
    assert "kept out of the summary" in why
    # below the band too (1/1.3 = 0.77×): no cold cache (the dense is not the slower one)
    rows = layer_table(LAYERS, {"conv1": 1.0, "conv2": 8.0, "out": 0.02}, {"conv1": 1.3, "conv2": 1.0, "out": 0.02})
    assert [r.out_of_band for r in rows] == [True, False, False] and "conv1 0.77× outside" in suspect_reason(rows)
    assert rows[0].cause is None
    assert UNCHANGED_BAND == (0.8, 1.25)
    assert LayerRow("x", 1, 1, 0, 0, 1.0, 2.0).unchanged is False  # no FLOPs recorded: not judged


# -- synthetic profiles: a VGG-like net whose conv1 is tiny, conv2 large, both unchanged; conv3 pruned; out's
# input pruned (its FLOPs fall: not unchanged). Whole microseconds per run, as the profilers report them.
VGG = [
    {"name": "conv1", "kept": 64, "total": 64, "flops_dense": 3_538_944, "flops_compacted": 3_538_944},
    {"name": "conv2", "kept": 64, "total": 64, "flops_dense": 75_497_472, "flops_compacted": 75_497_472},
    {"name": "conv3", "kept": 26, "total": 128, "flops_dense": 37_748_736, "flops_compacted": 7_667_712},
    {"name": "out", "kept": 10, "total": 10, "flops_dense": 10_240, "flops_compacted": 2_080},
]
JITTER = (0, 1, -1, 2, 0, -2, 1, 0, 3, -1)  # µs added run by run: a quiet profile


def _runs(us: dict[str, float], scale=lambda k: 1.0) -> list[dict]:
    """Ten profiled runs in the runner's shape; each layer's µs (+ jitter, × the run's ``scale``) truncated to
    whole microseconds."""
    return [{"end_to_end_ms": 2.0, "ops": [[name, "Conv", float(int(max(t + JITTER[k], 0) * scale(k))), "CPU"]
                                           for name, t in us.items()]} for k in range(len(JITTER))]


def _compare(dense_us, compacted_us, dense_scale=lambda k: 1.0) -> LayerBreakdown:
    idx = {lay["name"]: lay["name"] for lay in VGG} | {OTHER: OTHER}
    dense, compacted = _runs(dense_us, dense_scale), _runs(compacted_us)
    total = sorted(sum(op[2] for op in r["ops"]) for r in dense)[len(dense) // 2] / 1e3
    rows = layer_table(VGG, layer_ms(dense, idx), layer_ms(compacted, idx), layer_runs_ms(dense, idx), total, 1e-3)
    return LayerBreakdown("r/c", "dev", "pte", "fp32", 1, tuple(rows), 0.0, 0.0, total, 2.0, 1.0, 1.0)


# conv3 stands for VGG16's pruned tail (the dense run ~6.2 ms, as measured at 1 thread); out: under a µs compacted
COMPACTED = {"conv1": 35.0, "conv2": 650.0, "conv3": 1100.0, "out": 0.0}
DENSE = {"conv1": 49.0, "conv2": 650.0, "conv3": 5500.0, "out": 2.0}  # conv1 1.4× (the cold cache)


def test_a_tiny_unchanged_layer_at_1_4x_is_shown_not_judged():
    bd = _compare(DENSE, COMPACTED)
    rows = {r.layer: r for r in bd.rows}
    c1 = rows["conv1"]
    assert c1.speedup == pytest.approx(1.4) and c1.out_of_band and c1.tiny and not c1.suspect
    assert c1.share == pytest.approx(49 / 6201)  # 0.8 % of the run: under TINY_SHARE (35 µs: over 10 ticks)
    assert bd.suspect is None
    assert bd.unjudged.startswith("tiny unchanged layers outside their bands, not judged: conv1 1.40× outside")
    assert "(first layer: cold cache)" in bd.unjudged
    assert rows["conv2"].speedup == 1.0 and not rows["conv2"].out_of_band


def test_a_large_unchanged_layer_at_1_4x_makes_the_comparison_suspect():
    bd = _compare({**DENSE, "conv2": 910.0}, COMPACTED)  # 910 / 650 = 1.4×
    c2 = {r.layer: r for r in bd.rows}["conv2"]
    assert c2.speedup == pytest.approx(1.4) and not c2.tiny and c2.suspect and c2.cause is None
    # dense runs 910 + JITTER: inclusive quartiles 909.25 and 911, median 910: spread 1.75 / 910; 2 ticks of 650 µs
    assert c2.spread == pytest.approx(1.75 / 910)
    assert c2.band[1] == pytest.approx(1.25 * (1 + 1.75 / 910) * (1 + 2 / 650))  # 1.256
    assert bd.suspect.startswith("unchanged layers measure outside their bands (conv2 1.40× outside 0.80-1.26×)")


def test_a_dense_profile_at_another_thread_count_is_still_suspect():
    # the dense model profiled at 2 threads against the compacted at 1: its convs take ~0.55 of the time
    two = {k: (t * 0.55 if k != "out" else t) for k, t in DENSE.items()}
    bd = _compare(two, COMPACTED)
    assert "conv2 0.55× outside" in bd.suspect
    # and the other way round (dense at 1 thread, compacted at 2)
    bd = _compare(DENSE, {k: (t * 0.55 if k != "out" else t) for k, t in COMPACTED.items()})
    assert "conv2 1.82× outside" in bd.suspect


def test_a_dense_profile_under_load_is_still_suspect():
    # another process took the CPU: the dense runs take 1.3-2.2× as long, run by run; its own spread grows (~45 %)
    # and widens conv2's band only up to SPREAD_CAP (1.25 · 1.2 = 1.5×), short of the 1.7× median
    load = (1.3, 2.2, 1.5, 1.9, 1.7, 1.4, 2.0, 1.7, 1.8, 1.6)
    bd = _compare(DENSE, COMPACTED, dense_scale=lambda k: load[k])
    c2 = {r.layer: r for r in bd.rows}["conv2"]
    assert c2.spread > SPREAD_CAP and c2.band[1] == pytest.approx(1.25 * 1.2 * (1 + 2 / 650))
    assert bd.suspect is not None and "conv2 1.7" in bd.suspect


def test_a_layer_under_the_timers_tick_prints_under_1_us_never_nan():
    from edgemask.profiling.report import layer_table_frame

    bd = _compare(DENSE, COMPACTED)
    out = {r.layer: r for r in bd.rows}["out"]
    assert out.compacted_ms == 0.0 and math.isnan(out.speedup) and not out.flagged
    assert time_text(out.compacted_ms, out.tick_ms) == "< 1 µs" and out.speedup_text == "> 2.00×"
    frame = layer_table_frame(bd).set_index("layer")
    assert frame.loc["out", "compacted ms"] == "< 1 µs" and frame.loc["out", "dense ms"] == "0.002"
    assert frame.loc["out", "measured speedup"] == "> 2.00×" and frame.loc["out", "speedup ÷ bound"] == "—"
    text = frame.to_string()
    assert "nan" not in text and "0.000" not in text
    # conv1: spread 1.75 / 49, 2 ticks of 35 µs: w = 1.25 · 1.0357 · 1.0571 = 1.369
    assert {r.layer: r for r in bd.rows}["conv1"].band[1] == pytest.approx(1.25 * (1 + 1.75 / 49) * (1 + 2 / 35))
    assert frame.loc["conv1", "flag"].startswith("unchanged, outside 0.73-1.37×: tiny (0.8 % of the run)")
    assert frame.loc["conv1", "flag"].endswith("not judged; first layer: cold cache")
    # both sides under a tick: no ratio at all
    assert LayerRow("fc", 1, 1, 10, 10, 0.0005, 0.0).speedup_text == "—"
    assert LayerRow("fc", 1, 1, 10, 10, 0.002, math.nan).speedup_text == "—"  # not in the compacted profile
    assert time_text(math.nan) == "—" and time_text(0.0123) == "0.012"


ROUNDS = 8  # at most; at least 2


@pytest.mark.slow
def test_dense_and_compacted_profiles_agree_on_unchanged_layers(tmp_path):
    """A conv net whose last conv keeps 4 of 64 filters; the first two convs are unchanged. Dense and compacted
    profiled by the runner at 1 thread, interleaved over rounds (the best of each layer's per-round medians, as
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
    # conv1 ~0.3 ms at 1 thread: a few us of jitter, a few %. One thread, not two: on CI's 2 shared cores a second
    # thread waits for whatever else runs (conv1 read 1.8x after 8 rounds at 2 threads); the 2-thread agreement on
    # an idle machine is measured by benchmarks/bench_layers.py, not timed here
    x = torch.randn(1, 3, 128, 128)
    recs, paths = {}, {}
    for tag, m in (("dense", {}), ("compacted", masks)):
        res = compact(MaskedModel(base, sites, m), x)
        paths[tag] = tmp_path / f"{tag}.onnx"
        FORMATS.get("onnx").write(res.module, paths[tag], FormatContext(x, ExportSettings()))
        recs[tag] = layer_records(base, res.module, (x,), res.layers, {paths[tag].name: paths[tag]})
    best = {"dense": {}, "compacted": {}}
    for done in range(1, ROUNDS + 1):
        for tag in best:
            prof = profile_runs("onnx", str(paths[tag]), [x.numpy()], 1, 5, 15)
            for k, v in layer_ms(prof["runs"], name_index(recs[tag], paths[tag].name)).items():
                best[tag][k] = min(best[tag].get(k, float("inf")), v)
        rows = {r.layer: r for r in layer_table(recs["compacted"], best["dense"], best["compacted"])}
        # the best of each layer's medians settles once both profiles had an undisturbed round: a loaded host (CI,
        # once: conv1 at 1.38x after 3 rounds) needs more rounds; a real difference stays out of band in all of them
        if done >= 2 and suspect_reason(list(rows.values())) is None:
            break
    assert [k for k, r in rows.items() if r.unchanged] == ["conv1", "conv2"]
    for k in ("conv1", "conv2"):
        assert rows[k].band[0] <= rows[k].speedup <= rows[k].band[1], (k, rows[k])
    assert suspect_reason(list(rows.values())) is None
