"""A verdict per setting: each rule failed alone gives INVALID with that rule named; signals a board lacks are
"not checked", never failed or passed.

The rows are real-shaped: the remote runner's JSON document (``devices.remote.runner.benchmark``'s keys, its
``device_state()`` with a Raspberry Pi's decoded ``vcgencmd get_throttled``), turned into a Measurement by
``devices.benchmark.measurement_from_runner``, recorded in a real results store and read back.
"""

from __future__ import annotations

import tomllib

import pytest

import profiling_fakes as pf
from edgemask.devices.benchmark import measurement_from_runner
from edgemask.devices.sensors import decode_throttled
from edgemask.profiling.campaign import parse_campaign, plan_jobs, read_manifest
from edgemask.profiling.stats import summarize
from edgemask.profiling.store import ResultsStore
from edgemask.profiling.verdict import INVALID, VALID, VerdictRules, throttled_during

STEADY = [2.0, 2.1, 1.9, 2.0] * 15  # 60 runs, mean 2, sample std sqrt(0.3 / 59): CV 3.6 %


def pi_state(temp_c: float = 48.3, throttled: str = "throttled=0x0") -> dict:
    """``device_state()`` on a Raspberry Pi 4 (sysfs thermal zone, vcgencmd)."""
    return {"governors": {"cpu0": "performance"}, "cpu_khz": {"cpu0": 1500000}, "governor": "performance",
            "temps_c": {"cpu-thermal": temp_c}, "loadavg_1m": 0.12, "throttled": decode_throttled(throttled)}


def runner_doc(**overrides) -> dict:
    """What ``runner.benchmark`` prints for a good run: 60 timed runs over 1.2 s, output check passed."""
    doc = {"ok": True, "latency_ms": STEADY, "load_ms": 12.0, "first_inference_ms": 3.0, "peak_rss_kb": 41000,
           "rss_growth_kb": 900, "output_max_abs_diff": 2e-7, "output_check_passed": True, "accuracy": 0.97,
           "samples_checked": 32, "timed_window_s": 1.2, "runtime_version": "1.20.1", "threads": 1,
           "state_before": pi_state(48.3), "power_source": None, "power_w": [], "power_rate_hz": None,
           "idle_power_w": None, "energy_missing_reason": "no power sensor: no INA3221 rails, no RAPL",
           "state_after": pi_state(49.1)}
    doc.update(overrides)
    return doc


def setting(tmp_path, *docs: dict, rules: VerdictRules = VerdictRules()):
    """Record ``docs`` as the repetitions of one compacted client on device pi (a dense baseline, always good,
    beside it) and return that client's row of ``summarize``."""
    ws = pf.small_workspace(tmp_path / "ws", clients=("client-000",))
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(devices=("pi",), formats=("onnx",),
                                                        repetitions=len(docs))))
    with ResultsStore.open(cfg.results_dir(ws) / "results.sqlite") as store:
        store.save_campaign(cfg)
        store.save_artifacts(read_manifest(ws / "artifacts" / "run-a" / c / "manifest.json")
                             for c in ("dense", "client-000"))
        for job in plan_jobs(cfg, ws):
            doc = runner_doc(latency_ms=[x * 2 for x in STEADY]) if job.artifact.endswith("/dense") \
                else docs[job.repetition]
            ids = dict(device=job.device, artifact=job.artifact, format=job.format, variant=job.variant,
                       threads=job.threads)
            store.record(job, measurement_from_runner(doc, **ids))
        df = store.to_dataframe()
    return summarize(df, rules=rules).set_index("artifact").loc["run-a/client-000"]


def test_a_setting_meeting_every_rule_is_valid(tmp_path):
    row = setting(tmp_path, runner_doc(), runner_doc())
    assert row["verdict"] == VALID and row["valid"] and row["reasons"] == "" and row["not_checked"] == ""
    assert row["comparison_valid"] and row["speedup"] == pytest.approx(2.0)
    assert row["temp_drift_c"] == pytest.approx(0.8)


def test_too_few_runs(tmp_path):
    row = setting(tmp_path, runner_doc(), runner_doc(latency_ms=STEADY[:40]))
    assert row["verdict"] == INVALID and row["invalid_rules"] == "too-few-runs"
    assert row["reasons"] == "too-few-runs: 40 timed samples < 50"
    assert not row["comparison_valid"]  # the speedup rests on this verdict


def test_the_campaigns_own_minimums_raise_the_floor(tmp_path):
    """60 samples over 1.2 s meet the floor (50, 1 s) but not a campaign that asked for 100 samples and 2 s."""
    rules = VerdictRules.for_campaign({"runner": {"min_runs": 100, "min_seconds": 2.0}})
    assert (rules.min_runs, rules.min_seconds) == (100, 2.0)
    assert VerdictRules.for_campaign({"runner": {"min_runs": 5, "min_seconds": 0.01}}) == VerdictRules()
    row = setting(tmp_path, runner_doc(), rules=rules)
    assert row["invalid_rules"] == "too-few-runs;too-short"
    assert row["reasons"] == "too-few-runs: 60 timed samples < 100; too-short: timed window 1.2 s < 2 s"


def test_too_short(tmp_path):
    row = setting(tmp_path, runner_doc(timed_window_s=0.4))
    assert row["invalid_rules"] == "too-short"
    assert row["reasons"] == "too-short: timed window 0.4 s < 1 s"


def test_high_cv(tmp_path):
    # 59 samples of 2 ms and one of 20 ms
    latency = [2.0] * 59 + [20.0]
    mean = sum(latency) / 60  # 2.3
    var = sum((x - mean) ** 2 for x in latency) / 59  # (59 * 0.09 + 17.7²) / 59 = 5.4
    row = setting(tmp_path, runner_doc(latency_ms=latency))
    assert var == pytest.approx(5.4) and row["cv"] == pytest.approx(5.4 ** 0.5 / 2.3)
    assert row["invalid_rules"] == "high-cv" and row["reasons"] == "high-cv: CV 101.0 % > 10 %"


def test_output_check_failed(tmp_path):
    # the runner's answer when the outputs differ: ok false, the difference, no samples
    bad = {"ok": False, "output_max_abs_diff": 0.25,
           "error": "output differs from sample_io by 0.25 > tolerance 1e-05 on 32 samples"}
    row = setting(tmp_path, runner_doc(), bad)
    assert row["invalid_rules"] == "output-check-failed"
    assert row["reasons"] == ("output-check-failed: 1 of 2 repetition(s) differ from the host's outputs "
                              "(max |diff| 0.25)")


def test_failed_run(tmp_path):
    row = setting(tmp_path, runner_doc(), {"ok": False, "error": "runtime for format onnx is not installed"})
    assert row["invalid_rules"] == "failed"
    assert row["reasons"] == "failed: 1 of 2 repetition(s) failed: runtime for format onnx is not installed"


def test_throttled_during_the_window(tmp_path):
    # 0x50005 on the Pi: under-voltage and throttling now (bits 0, 2) and since boot (16, 18)
    row = setting(tmp_path, runner_doc(state_after=pi_state(49.1, "throttled=0x50005")))
    assert row["invalid_rules"] == "throttled"
    assert row["reasons"] == ("throttled: the board reported throttled, throttled_occurred, under_voltage, "
                              "under_voltage_occurred")


def test_throttling_that_ended_before_the_run_is_not_held_against_it():
    # sticky "occurred" bits set since boot, nothing now: the window itself was not throttled
    before, after = pi_state(throttled="throttled=0x50000"), pi_state(throttled="throttled=0x50000")
    assert throttled_during(before, after) == []
    assert throttled_during(before, pi_state(throttled="throttled=0x4")) == ["throttled"]
    assert throttled_during({"temps_c": {}}, {"temps_c": {}}) is None  # no signal at all


def test_temperature_drift(tmp_path):
    row = setting(tmp_path, runner_doc(), runner_doc(state_before=pi_state(52.0), state_after=pi_state(58.5)))
    assert row["invalid_rules"] == "temperature-drift"
    assert row["reasons"] == "temperature-drift: cpu-thermal 52.0 -> 58.5 °C (+6.5 > 5 °C)"
    assert row["temp_drift_c"] == pytest.approx(6.5)


def test_each_failed_rule_is_named_together(tmp_path):
    row = setting(tmp_path, runner_doc(latency_ms=[2.0] * 59 + [20.0], timed_window_s=0.5,
                                       state_before=pi_state(40.0), state_after=pi_state(50.0, "throttled=0x4")))
    assert row["invalid_rules"] == "too-short;high-cv;throttled;temperature-drift"


def test_a_board_without_sensors_is_not_checked_rather_than_failed(tmp_path):
    x86 = {"governors": {}, "cpu_khz": {}, "governor": None, "temps_c": {}, "loadavg_1m": 1.3}
    row = setting(tmp_path, runner_doc(state_before=x86, state_after=x86))
    assert row["verdict"] == VALID
    assert row["not_checked"] == ("throttled: not checked: the board reports no throttling flags; "
                                  "temperature-drift: not checked: the board reports no temperature (no thermal zone)")


def test_thresholds_are_rules_not_constants(tmp_path):
    doc = runner_doc(latency_ms=STEADY[:40], timed_window_s=0.4)
    row = setting(tmp_path, doc, rules=VerdictRules(min_runs=20, min_seconds=0.25, cv_threshold=0.02))
    assert row["invalid_rules"] == "high-cv"  # CV 3.6 % > 2 %; 40 runs and 0.4 s now enough
