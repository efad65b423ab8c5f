"""The report at 400 clients (issue #37): the per-layer summary is a table with one row per trusted comparison, a
panel holding more than ``AGGREGATE_ABOVE`` settings or clients draws the aggregated form (and one at the
threshold still draws one labelled item each), measured and predicted clients stay apart, and the whole report
of a 400-client sampled campaign lists its measured and predicted counts."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PolyCollection

from edgemask.profiling import plots
from edgemask.profiling.layers import LayerBreakdown, LayerRow
from edgemask.profiling.plots import AGGREGATE_ABOVE
from edgemask.profiling.report import layer_sections

N_MANY = AGGREGATE_ABOVE + 1


def _breakdown(i: int, *, suspect: bool = False) -> LayerBreakdown:
    # conv1 unchanged (1 ms both), conv2 8× fewer FLOPs: 4 ms -> 1 ms; a suspect one reads conv1 at 2 ms compacted
    rows = (LayerRow("conv1", 16, 16, 1000, 1000, 1.0, 2.0 if suspect else 1.0, (1.0,) * 5, 5.0),
            LayerRow("conv2", 4, 32, 8000, 1000, 4.0, 1.0, (4.0,) * 5, 5.0))
    return LayerBreakdown(f"run-a/client-{i:03d}", "dev-a", "onnx", "fp32", 1, rows, 0.0, 0.0,
                          5.0, 5.5, 3.0 if suspect else 2.0, 2.5)


def test_the_per_layer_summary_is_a_table_of_the_trusted_comparisons():
    bds = [_breakdown(i, suspect=i in (3, 7)) for i in range(30)]
    sections = layer_sections(bds)
    [(level, heading, table)] = [s for s in sections if s[1].startswith("Summary")]
    assert level == 3 and heading.startswith("Summary: 28 comparison(s), 2 suspect left out")
    assert "; " not in heading and "client-000" not in heading  # no comparison strung into the heading
    assert list(table["artifact"]) == [f"run-a/client-{i:03d}" for i in range(30) if i not in (3, 7)]
    row = table.iloc[0]
    # by hand: operators 5 ms dense, 2 ms compacted -> 2.50×; FLOP bound (1000 + 8000) / (1000 + 1000) = 4.50×;
    # 2.5 / 4.5 = 0.56 of it; conv2 realizes (4 / 1) / 8 = 0.5, not under half: no layer flagged
    assert (row["dense ms"], row["compacted ms"], row["operators faster"], row["FLOP bound"],
            row["faster ÷ bound"], row["layers ⚑"]) == ("5.000", "2.000", "2.50×", "4.50×", "0.56", "0")
    # every comparison keeps its own per-layer table, the suspect ones named
    assert sum(1 for _, h, t in sections if t is not None and " — dev-a, onnx/fp32" in h) == 30
    assert sum("SUSPECT" in h for _, h, _ in sections) == 2


def _settings(n: int, fmt: str = "onnx") -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"artifact": "run-a/dense", "run_id": "run-a", "client_id": "dense", "kind": "dense"}]
    rows += [{"artifact": f"run-a/client-{i:03d}", "run_id": "run-a", "client_id": f"client-{i:03d}",
              "kind": "compacted"} for i in range(n)]
    df = pd.DataFrame(rows).assign(format=fmt, variant="fp32", device="dev-a", threads=1, ok=True)
    df["latency_ms"] = [tuple(rng.uniform(1, 2, 50) * (10 if k == "dense" else 1 + i / n))
                        for i, k in enumerate(df["kind"])]
    return df


def test_latency_boxes_below_the_threshold_and_ranked_bands_above():
    few = plots.latency_distributions(_settings(AGGREGATE_ABOVE - 1))  # with the dense one: AGGREGATE_ABOVE
    ax = few.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["dense", "client-000"]
    many = plots.latency_distributions(_settings(N_MANY))
    ax = many.axes[0]
    assert not ax.get_xticklabels() and "ranked" in ax.get_xlabel()
    assert f"({N_MANY + 1} settings;" in ax.get_title()
    # the medians, ranked: one dot per setting, in increasing order
    medians = next(c for c in ax.collections if len(c.get_offsets()) == N_MANY + 1).get_offsets()[:, 1]
    assert np.all(np.diff(medians) >= 0)


def _summary(n: int) -> pd.DataFrame:
    flops = np.linspace(1000, 9000, n).astype(int)
    return pd.DataFrame({
        "artifact": [f"run-a/client-{i:03d}" for i in range(n)], "run_id": "run-a",
        "client_id": [f"client-{i:03d}" for i in range(n)], "kind": "compacted", "device": "dev-a",
        "format": "onnx", "variant": "fp32", "threads": 1, "flops_compacted": flops,
        "flop_bound": 10_000 / flops, "param_ratio": 10_000 / flops, "speedup": (10_000 / flops) ** 0.5,
        "comparison_valid": True, "valid": True, "p50_ms": 0.01 + flops / 1e5})


def test_speedup_per_client_draws_the_bounds_as_lines_when_many():
    ax = plots.speedup_per_client(_summary(AGGREGATE_ABOVE)).axes[0]
    assert len(ax.get_xticklabels()) == AGGREGATE_ABOVE  # one named tick per client
    ax = plots.speedup_per_client(_summary(N_MANY)).axes[0]
    assert not ax.get_xticklabels()
    bound = next(line for line in ax.get_lines() if line.get_label() == "FLOP bound")
    assert len(bound.get_ydata()) == N_MANY and np.all(np.diff(bound.get_ydata()) >= 0)  # sorted by it


def _hexbins(ax) -> list:
    return [c for c in ax.collections if isinstance(c, PolyCollection)]


def test_predicted_clients_become_a_density_under_the_measured_ones():
    measured = _summary(6)
    pred = _summary(N_MANY).assign(artifact=lambda d: d["artifact"] + "p", predicted=True, valid=False,
                                   comparison_valid=False)
    ax = plots.measured_and_predicted(measured, pred).axes[0]
    assert _hexbins(ax) and f"(6 measured, {N_MANY} predicted)" in ax.get_title()
    hexbin = _hexbins(ax)[0]
    assert hexbin.get_array().sum() == N_MANY  # every predicted client counted in a cell, none lost
    dots = [c for c in ax.collections if c not in _hexbins(ax) and len(c.get_offsets())]
    assert sum(len(c.get_offsets()) for c in dots) == 6  # the measured ones alone are points
    assert all(c.get_zorder() > hexbin.get_zorder() for c in dots)  # drawn over the density
    few = plots.measured_and_predicted(measured, pred.iloc[:AGGREGATE_ABOVE]).axes[0]
    assert not _hexbins(few) and f"(6 measured, {AGGREGATE_ABOVE} predicted)" in few.get_title()


def test_accuracy_latency_names_only_the_front_when_many():
    def ledger(n):
        s = _summary(n)
        return s.assign(accuracy=np.linspace(0.5, 0.9, n), algorithm="fedmask",
                        on_front=[i % 5 == 0 for i in range(n)])
    ax = plots.accuracy_vs_latency(ledger(AGGREGATE_ABOVE)).axes[0]
    assert len(ax.texts) == AGGREGATE_ABOVE
    ax = plots.accuracy_vs_latency(ledger(N_MANY)).axes[0]
    assert sorted(t.get_text() for t in ax.texts) == [f"{i:03d}" for i in range(0, N_MANY, 5)]


@pytest.mark.slow
def test_a_400_client_sampled_report_counts_measured_and_predicted(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_report import build

    from edgemask.profiling.report import write_report

    results = build(tmp_path, clients=400, sample=40, formats=("onnx",), devices=1, samples=60)
    _, md_path = write_report(results, tmp_path / "ws")
    md = md_path.read_text()
    df = pd.read_parquet(results / "results.parquet")
    assert int((~df["predicted"]).sum()) == 41 and int(df["predicted"].sum()) == 360  # 40 clients + dense
    assert "41 measured, 360 predicted" in md  # the predictor fits on the dense baseline too
    summary = md.split("### Summary: ", 1)[1].split("\n### ", 1)[0]
    assert summary.startswith("40 comparison(s)")
    table = [line for line in summary.splitlines() if line.startswith("| bench-report/")]
    measured = df.loc[~df["predicted"] & (df["kind"] == "compacted"), "artifact"]
    assert sorted(r.split("|")[1].strip() for r in table) == sorted(measured)
    assert (results / "plots" / "predicted.png").is_file()
