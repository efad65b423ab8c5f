"""Statistics against hand-computed values."""

import json
import math

import pandas as pd
import pytest

from edgemask.profiling import stats
from edgemask.profiling.verdict import VerdictRules

SAMPLES = [1.0, 2.0, 3.0, 4.0, 10.0]


def test_percentiles_interpolate_linearly():
    # sorted positions (n-1)·q: p50 -> 2 -> 3; p90 -> 3.6 -> 4 + 0.6·(10-4) = 7.6; p99 -> 3.96 -> 9.76
    assert stats.percentile(SAMPLES, 50) == pytest.approx(3.0)
    assert stats.percentile(SAMPLES, 90) == pytest.approx(7.6)
    assert stats.percentile(SAMPLES, 99) == pytest.approx(9.76)
    assert stats.percentile([10.0, 1.0, 4.0, 3.0, 2.0], 90) == pytest.approx(7.6)  # order does not matter


def test_the_median_devices_reports_is_the_p50_here():
    """`devices check --self-test` reports p50 as the standard library's median (devices imports no profiling):
    the same number as this module's linear-interpolation p50, for odd and even counts."""
    import statistics

    assert statistics.median([3.0, 1.0, 2.0]) == stats.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert statistics.median([4.0, 1.0, 3.0, 2.0]) == stats.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5


def test_mean_std_cv_by_hand():
    # deviations from 4: -3 -2 -1 0 6 -> squares sum 50; sample variance 50/4 = 12.5
    assert stats.mean(SAMPLES) == pytest.approx(4.0)
    assert stats.std(SAMPLES) == pytest.approx(math.sqrt(12.5))
    assert stats.cv(SAMPLES) == pytest.approx(math.sqrt(12.5) / 4.0)
    assert math.isnan(stats.std([5.0]))
    assert math.isnan(stats.percentile([], 50))


def test_energy_per_inference_total_and_above_idle():
    # mean 3 W over 2 s for 100 inferences = 60 mJ each; idle 1 W costs 20 mJ of it
    assert stats.energy_per_inference_mj([2.0, 2.0, 4.0, 4.0], 2.0, 100) == pytest.approx(60.0)
    assert stats.energy_above_idle_mj([2.0, 2.0, 4.0, 4.0], 1.0, 2.0, 100) == pytest.approx(40.0)
    assert math.isnan(stats.energy_per_inference_mj([], 2.0, 100))  # missing, never zero
    assert math.isnan(stats.energy_above_idle_mj([3.0], math.nan, 2.0, 100))


@pytest.mark.parametrize("state, expected", [
    ({"governor": "performance", "temp_c": 50}, False),
    ({"throttled": "0x0"}, False),
    ({"throttled": "0x50005"}, True),  # Raspberry Pi get_throttled bits
    ({"throttling": {"cpu": False, "gpu": True}}, True),
    ({"jetson": {"throttle_alert": 1}}, True),
    ({"throttled": False}, False),
])
def test_throttled(state, expected):
    assert stats.throttled(state) is expected


def _row(artifact, kind, latency, *, rep=0, device="d", power=(3.0, 3.0), window=1.0, idle=1.0, ok=True,
         check=True, state=None, reason=None, flops=(1000, 200), rss=1000):
    run, client = artifact.split("/")
    return dict(artifact=artifact, format="onnx", variant="fp32", device=device, threads=1, repetition=rep,
                run_id=run, client_id=client, kind=kind, algorithm="fedmask", model="cnn", dataset="digits",
                params_dense=100, params_compacted=40, flops_dense=flops[0], flops_compacted=flops[1],
                model_bytes=400 if kind != "dense" else 1000, ok=ok, error=None if ok else "boom",
                latency_ms=list(latency), power_w=list(power), timed_window_s=window, idle_power_w=idle,
                load_ms=5.0, first_inference_ms=6.0, peak_rss_kb=20_000, rss_growth_kb=rss,
                output_max_abs_diff=1e-7, output_check_passed=check, accuracy=0.9,
                power_source="ina" if power else None, energy_missing_reason=reason,
                state_before=json.dumps(state or {}), state_after=json.dumps(state or {}),
                throttled=stats.throttled(state or {}))


def test_summarize_pools_repetitions_and_compares_to_dense():
    df = pd.DataFrame([
        _row("r/dense", "dense", [10.0] * 5, flops=(1000, 1000), rss=4000),
        _row("r/dense", "dense", [10.0] * 5, rep=1, flops=(1000, 1000), rss=4000),
        # two repetitions of [1,2,3,4,10] pooled: still p50 3, p90 of 10 samples: pos 8.1 -> 10
        _row("r/client-000", "compacted", SAMPLES, rss=1000),
        _row("r/client-000", "compacted", SAMPLES, rep=1, rss=1000),
    ])
    s = stats.summarize(df).set_index("artifact")
    c = s.loc["r/client-000"]
    assert c["runs"] == 10 and c["repetitions"] == 2
    assert c["p50_ms"] == pytest.approx(3.0)
    assert c["p90_ms"] == pytest.approx(10.0)
    assert c["speedup"] == pytest.approx(10.0 / 3.0)
    assert c["flop_bound"] == pytest.approx(5.0)
    assert c["speedup_vs_bound"] == pytest.approx(10.0 / 3.0 / 5.0)
    assert c["memory_reduction"] == pytest.approx(0.75)  # RSS growth 1000 vs 4000
    # energy: 3 W × 1 s / 5 runs = 600 mJ for both, so no energy reduction
    assert c["energy_mj"] == pytest.approx(600.0)
    assert c["energy_above_idle_mj"] == pytest.approx(400.0)
    assert c["energy_reduction"] == pytest.approx(0.0)
    assert "high-cv" in c["invalid_rules"]  # CV ≈ 0.84
    assert "high-cv" not in s.loc["r/dense", "invalid_rules"]
    assert s.loc["r/dense", "speedup"] == pytest.approx(1.0)


def test_energy_per_inference_counts_every_inference_of_a_sample():
    """A sample averaging 10 inferences: 3 W × 1 s over 5 samples × 10 inferences = 60 mJ, not 600."""
    row = _row("r/client-000", "compacted", SAMPLES)
    df = pd.DataFrame([_row("r/dense", "dense", [10.0] * 5, flops=(1000, 1000)), {**row, "inferences_per_sample": 10}])
    df.loc[0, "inferences_per_sample"] = 1
    c = stats.summarize(df).set_index("artifact").loc["r/client-000"]
    assert c["energy_mj"] == pytest.approx(60.0) and c["energy_above_idle_mj"] == pytest.approx(40.0)
    assert c["runs"] == 5 and c["inferences"] == 50 and c["inferences_per_sample"] == 10
    assert c["energy_reduction"] == pytest.approx(0.9)  # the dense baseline's 600 mJ over 5 single inferences


def test_summarize_gives_each_setting_its_verdict_and_flags_missing_energy():
    df = pd.DataFrame([
        _row("r/dense", "dense", [5.0, 5.0], flops=(1000, 1000)),
        _row("r/client-000", "compacted", [2.0, 2.0], state={"throttled": "0x50000"}),
        _row("r/client-001", "compacted", [2.0, 2.0], check=False),
        _row("r/client-002", "compacted", [2.0, 2.0], power=(), reason="no power sensor on d"),
        _row("r/client-003", "compacted", [2.0, 2.0], ok=False),
    ])
    s = stats.summarize(df, rules=VerdictRules(min_runs=2)).set_index("artifact")
    assert s.loc["r/client-000", "invalid_rules"] == "throttled"
    assert s.loc["r/client-001", "invalid_rules"] == "output-check-failed"
    assert s.loc["r/client-002", "verdict"] == "VALID"  # energy is a measurement, not a validity rule
    assert s.loc["r/client-002", "flag_energy_missing"]
    assert s.loc["r/client-002", "energy_missing_reason"] == "no power sensor on d"
    assert math.isnan(s.loc["r/client-002", "energy_mj"])
    assert s.loc["r/client-003", "reasons"] == "failed: 1 of 1 repetition(s) failed: boom"
    assert s.loc["r/client-003", "n_failed"] == 1
    assert s.loc["r/dense", "verdict"] == "VALID"
    # comparisons rest on both verdicts
    assert s["comparison_valid"].to_dict() == {"r/client-000": False, "r/client-001": False, "r/client-002": True,
                                               "r/client-003": False, "r/dense": True}
    assert s.loc["r/client-002", "speedup"] == pytest.approx(2.5)
    assert s.loc["r/client-002", "param_ratio"] == pytest.approx(2.5)  # 100 / 40 parameters


def test_cv_threshold_is_a_parameter():
    df = pd.DataFrame([_row("r/dense", "dense", [1.0, 1.08, 0.92], flops=(1, 1))])  # CV = 0.08
    assert stats.summarize(df, cv_threshold=0.1).iloc[0]["invalid_rules"] == "too-few-runs"
    assert stats.summarize(df, cv_threshold=0.05).iloc[0]["invalid_rules"] == "too-few-runs;high-cv"
