"""The report builds from a small campaign's store."""

import base64
import re
import tomllib

import pandas as pd
import pytest

from edgemask import profiling
import profiling_fakes as pf
from edgemask.devices.records import Measurement
from edgemask.profiling.campaign import parse_campaign, plan_jobs, read_manifest
from edgemask.profiling.report import summary_table, write_report
from edgemask.profiling.store import ResultsStore
from edgemask.profiling.verdict import VerdictRules

SAMPLES = (1.0, 2.0, 3.0, 4.0, 10.0)


def _campaign(tmp_path, *, energy=True, history=True):
    ws = pf.small_workspace(tmp_path / "ws", clients=("client-000",))
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(devices=("dev-a",), formats=("onnx",), repetitions=1)))
    results = cfg.results_dir(ws)
    with ResultsStore.open(results / "results.sqlite") as store:
        store.save_campaign(cfg)
        store.save_artifacts(read_manifest(ws / "artifacts" / "run-a" / c / "manifest.json")
                             for c in ("dense", "client-000"))
        for job in plan_jobs(cfg, ws):
            dense = job.artifact.endswith("/dense")
            store.record(job, Measurement(
                device=job.device, artifact=job.artifact, format=job.format, variant=job.variant,
                threads=job.threads, ok=True, latency_ms=(10.0,) * 5 if dense else SAMPLES,
                peak_rss_kb=30_000, rss_growth_kb=4000 if dense else 1000, output_check_passed=True,
                power_source="ina3221:VDD_IN" if energy else None,
                power_w=(3.0, 5.0) if energy else (), idle_power_w=2.0,
                energy_missing_reason=None if energy else "no power sensor: no INA3221 rails",
                timed_window_s=0.05 if dense else 0.02))
    if history:
        rows = []
        for rnd in range(3):
            for c in ("client-000", "client-001"):
                rows += [(rnd, c, "accuracy", 0.5 + 0.1 * rnd), (rnd, c, "bytes_up", 1000.0),
                         (rnd, c, "bytes_down", 3000.0)]
            rows.append((rnd, "server", "loss", 1.0))
        (ws / "runs" / "run-a").mkdir(parents=True)
        pd.DataFrame(rows, columns=["round", "client", "metric", "value"]).to_parquet(
            ws / "runs" / "run-a" / "history.parquet")
    return ws, results


def _images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)]


# rules the fixture's 5 samples over 20 ms, CV 0.88, meet: every setting VALID
LENIENT = VerdictRules(min_runs=5, min_seconds=0.01, cv_threshold=1.0)


def test_report_has_the_values_and_embedded_plots(tmp_path):
    ws, results = _campaign(tmp_path)
    html_path, md_path = write_report(results, ws, rules=LENIENT)
    page, md = html_path.read_text(), md_path.read_text()
    assert md.startswith("# Campaign camp\n\n**2 of 2 settings VALID.**")
    # hand-computed: compacted p50 3, p90 7.6, p99 9.76; dense p50 10 -> speedup 3.33×; FLOPs 10000/2000 -> 5×
    for value in ("3.000", "7.600", "9.760", "10.000", "3.33×", "5.00×", "66.7%"):
        assert value in page, value
        assert value in md, value
    # energy: 4 W × 0.02 s / 5 runs = 16 mJ (compacted), 4 W × 0.05 s / 5 = 40 mJ (dense); above 2 W idle: 8
    for value in ("16.000", "40.000", "8.000"):
        assert value in page and value in md, value
    assert "digits / cnn" in page and "FedMask" in page
    imgs = _images(page)
    assert len(imgs) == 4 and all(i.startswith(b"\x89PNG\r\n\x1a\n") for i in imgs)
    assert "http://" not in page.replace("http://www.w3.org", "") and "<script" not in page  # self-contained
    assert sorted(p.name for p in (results / "plots").iterdir()) == [
        "accuracy_vs_communication.png", "energy.png", "latency.png", "speedup.png"]
    assert "(plots/latency.png)" in md
    assert "†" not in md  # no comparison rests on an INVALID setting


def test_invalid_settings_lead_the_summary_and_carry_their_flag(tmp_path):
    ws, results = _campaign(tmp_path)
    _, md_path = write_report(results, ws)  # default rules: 5 runs < 50, 20 ms < 1 s, CV 0.88 > 0.1
    md = md_path.read_text()
    assert md.startswith("# Campaign camp\n\n**0 of 2 settings VALID; INVALID for too-few-runs (2), "
                         "too-short (2), high-cv (1).**")
    runtime = md[md.index("## Runtime per application"):md.index("## Every artifact")]
    assert "| fedmask | compacted | 1 | 0/1 |" in runtime  # measured columns averaged over VALID settings only
    assert "3.000" not in runtime and "3.33×" not in runtime
    detail = md[md.index("## Every artifact"):]
    assert "| 3.33× † |" in detail and "| 75.0% † |" in detail  # speedup, memory saved: shown, flagged
    assert "high-cv: CV 88.4 % > 10 %" in detail
    assert "† rests on an INVALID setting" in md
    text = summary_table(results)
    assert text.splitlines()[0] == "0 of 2 settings VALID; INVALID for too-few-runs (2), too-short (2), high-cv (1)"
    row = next(line for line in text.splitlines() if line.startswith("run-a/client-000"))
    assert row.split()[5:] == ["5", "1", "3.000", "9.760", "88.4%", "3.33×", "†", "5.00×", "2.50×", "INVALID",
                               "too-few-runs;too-short;high-cv"]


def test_report_says_why_energy_and_history_are_missing(tmp_path):
    ws, results = _campaign(tmp_path, energy=False, history=False)
    html_path, md_path = write_report(results, ws)
    page, md = html_path.read_text(), md_path.read_text()
    assert len(_images(page)) == 2  # latency and speedup only
    assert "energy is missing on dev-a for 2 of 2 settings: no power sensor: no INA3221 rails" in page
    assert "no training history for run run-a" in md


def test_accuracy_curve_from_long_history():
    from edgemask.profiling.plots import accuracy_curve

    h = pd.DataFrame([(0, "client-000", "accuracy", 0.4), (0, "client-001", "accuracy", 0.6),
                      (0, "client-000", "bytes_up", 10.0), (0, "client-001", "bytes_down", 30.0),
                      (1, "client-000", "accuracy", 0.8), (1, "client-001", "accuracy", 0.6),
                      (1, "client-000", "bytes_up", 10.0), (1, "server", "accuracy", 0.1)],
                     columns=["round", "client", "metric", "value"])
    c = accuracy_curve(h)
    assert c["accuracy"].tolist() == [0.5, 0.7]  # mean over clients; server row ignored
    assert c["cum_bytes"].tolist() == [40.0, 50.0]  # cumulative up + down


def test_each_accuracy_measure_of_a_run_is_its_own_named_curve(tmp_path):
    """FedMask scores a client on its local mask and on the mask the server returns (issue #26): the report draws
    both, named, from the history's ``accuracy`` and ``accuracy_returned_mask`` rows."""
    from edgemask.profiling.report import _run_curves

    run = tmp_path / "runs" / "run-m"
    run.mkdir(parents=True)
    pd.DataFrame([(0, "client-000", "accuracy", 0.9), (0, "client-001", "accuracy", 0.7),
                  (0, "client-000", "accuracy_returned_mask", 0.5), (0, "client-001", "accuracy_returned_mask", 0.2),
                  (0, "client-000", "bytes_up", 8.0)],
                 columns=["round", "client", "metric", "value"]).to_parquet(run / "history.parquet")
    curves, notes = _run_curves(tmp_path, pd.DataFrame({"run_id": ["run-m"], "algorithm": ["fedmask"]}))
    assert notes == []
    assert sorted(curves) == ["fedmask (run-m), local mask", "fedmask (run-m), returned mask"]
    assert curves["fedmask (run-m), local mask"]["accuracy"].tolist() == pytest.approx([0.8])
    assert curves["fedmask (run-m), returned mask"]["accuracy"].tolist() == pytest.approx([0.35])


def test_public_names_resolve():
    for name in profiling.__all__:
        assert getattr(profiling, name) is not None


def test_fedmasks_dense_baseline_is_named_for_what_it_is(tmp_path):
    """FedMask's dense artifact is its frozen random weights without a mask (near chance): the terminal table and
    summary.md say so beside its name, the compacted clients keep their plain names."""
    ws, results = _campaign(tmp_path)  # the fixture's run is a fedmask run
    _, md_path = write_report(results, ws, rules=LENIENT)
    md, text = md_path.read_text(), summary_table(results, rules=LENIENT)
    for out in (md, text):
        assert "run-a/dense (frozen random weights, no mask)" in out
        assert "run-a/client-000 (" not in out


def test_the_summary_names_settings_measured_again_for_their_cv():
    from edgemask.profiling.report import verdict_lines

    summary = pd.DataFrame({"artifact": ["r/dense", "r/client-000"], "format": ["onnx", "pte"],
                            "device": ["pi", "pi"], "not_checked": ["", ""], "valid": [True, True],
                            "invalid_rules": ["", ""], "comparison_valid": [True, True],
                            "unstable_attempts": [0, 2]})
    lines = verdict_lines(summary, VerdictRules())
    assert lines[-1] == ("Measured again after an attempt with CV above 10 % (campaign remeasure_unstable; the "
                         "dropped attempts are kept in the store): r/client-000 pte pi (2).")
    assert not any("Measured again" in line for line in verdict_lines(summary.iloc[:1], VerdictRules()))
