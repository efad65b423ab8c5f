"""Training rows (issue #39): a campaign measures a client's local step like an inference, with its own runner
settings and verdict floors; results.parquet's training columns and ``training_costs`` hold hand-computed numbers."""

from __future__ import annotations

import math
import tomllib

import pandas as pd
import pytest

import profiling_fakes as pf
from edgemask.devices.records import Measurement
from edgemask.errors import ConfigError
from edgemask.profiling.campaign import parse_campaign, plan_campaign, run_campaign
from edgemask.profiling.records import TRAINING_RUNNER
from edgemask.profiling.stats import TRAINING_COLUMNS, summarize
from edgemask.profiling.store import ResultsStore
from edgemask.profiling.training import COST_COLUMNS, local_rounds, round_samples, training_costs
from edgemask.profiling.verdict import MIN_TRAIN_SECONDS, MIN_TRAIN_STEPS, VerdictRules

FORMATS = ("onnx", "torch-train", "pte-train")
# client-000: 100 samples, 2 epochs, batch 32: ⌈100/32⌉·2 = 8 steps a round; client-001: 50 samples, 1 epoch: 2 steps
TRAIN = {"client-000": {"num_train": 100, "epochs": 2, "steps_per_round": 8, "trained_params": 640},
         "client-001": {"num_train": 50, "epochs": 1, "steps_per_round": 2, "trained_params": 320}}


def workspace(root):
    """run-a: the dense baseline (onnx only), client-000 (onnx, torch-train, pte-train), client-001 (onnx,
    torch-train): the plan skips the training jobs of artifacts without that file."""
    pf.write_manifest(root, "run-a", "dense", kind="dense", formats=(("onnx", "fp32"),), params=(1000, 1000),
                      flops=(10_000, 10_000))
    pf.write_manifest(root, "run-a", "client-000", kind="compacted", training=TRAIN["client-000"],
                      formats=(("onnx", "fp32"), ("torch-train", "fp32"), ("pte-train", "fp32")))
    pf.write_manifest(root, "run-a", "client-001", kind="compacted", training=TRAIN["client-001"],
                      formats=(("onnx", "fp32"), ("torch-train", "fp32")))
    return root


def config(**kw):
    return parse_campaign(tomllib.loads(pf.campaign_toml(formats=FORMATS, devices=("dev-a",), **kw)))


def test_training_runner_table_defaults_limits_and_plan(tmp_path):
    cfg = config()
    assert cfg.training_runner == TRAINING_RUNNER
    assert (TRAINING_RUNNER.warmup_runs, TRAINING_RUNNER.warmup_seconds, TRAINING_RUNNER.min_runs,
            TRAINING_RUNNER.min_seconds, TRAINING_RUNNER.sample_min_ms, TRAINING_RUNNER.profile_layers) == (
        3, 0.0, 20, 2.0, 0.0, False)
    assert cfg.runner.min_runs == 5  # [runner] is the inference jobs' own
    assert cfg.settings_for("torch-train") is cfg.training_runner and cfg.settings_for("onnx") is cfg.runner
    cfg = config(training_runner={"min_runs": 30, "warmup_runs": 1})
    assert (cfg.training_runner.min_runs, cfg.training_runner.warmup_runs, cfg.training_runner.min_seconds) == (
        30, 1, 2.0)  # given, given, the table's default (not [runner]'s 1.0)
    with pytest.raises(ConfigError, match=r"\[training_runner\] min_runs: 0 is out of range"):
        config(training_runner={"min_runs": 0})
    with pytest.raises(ConfigError, match=r"\[training_runner\] min_runz: unknown field"):
        config(training_runner={"min_runz": 3})

    ws = workspace(tmp_path / "ws")
    plan = plan_campaign(config(), ws)
    jobs = {(j.artifact, j.format) for j in plan.jobs}
    assert jobs == {("run-a/dense", "onnx"), ("run-a/client-000", "onnx"), ("run-a/client-001", "onnx"),
                    ("run-a/client-000", "torch-train"), ("run-a/client-000", "pte-train"),
                    ("run-a/client-001", "torch-train")}
    reasons = {(s.artifact, s.format): s.reason for s in plan.skipped}
    assert set(reasons) == {("run-a/dense", "torch-train"), ("run-a/dense", "pte-train"),
                            ("run-a/client-001", "pte-train")}
    assert reasons[("run-a/client-001", "pte-train")] == (
        "manifest has no pte-train/fp32 file (has: onnx/fp32, torch-train/fp32); export with --formats pte-train "
        "to write the client's local step")


def test_training_jobs_get_the_training_runner_settings(tmp_path):
    ws = workspace(tmp_path / "ws")
    seen = {}

    def bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
        seen[(artifact_dir.name, fmt)] = settings
        return pf.fake_measurement(spec, artifact_dir, fmt, variant, settings)

    cfg = config(training_runner={"min_runs": 25}, threads=(2,))
    result = run_campaign(cfg, ws, benchmark=bench, progress=False, inventory=pf.fleet("dev-a"),
                          connect=pf.FakeConnect())
    assert result.complete
    train, infer = seen[("client-000", "pte-train")], seen[("client-000", "onnx")]
    assert (train.min_runs, train.min_seconds, train.warmup_runs, train.sample_min_ms, train.threads) == (
        25, 2.0, 3, 0.0, 2)
    assert (infer.min_runs, infer.min_seconds, infer.threads) == (5, 0.01, 2)
    # a resume with other [training_runner] settings would pool incomparable steps: refused like [runner]'s
    from edgemask.errors import EdgemaskError

    with pytest.raises(EdgemaskError, match=r"training runner settings .*\[training_runner\]"):
        run_campaign(config(training_runner={"min_runs": 26}, threads=(2,)), ws, benchmark=bench, progress=False,
                     inventory=pf.fleet("dev-a"), connect=pf.FakeConnect())


def _train(job_ids, latency, rounds, window, power=(), steps=8, diff=2e-7, **kw):
    return Measurement(ok=True, latency_ms=tuple(latency), timed_window_s=window, output_check_passed=True,
                       output_max_abs_diff=diff, power_w=tuple(power), power_source="ina" if power else None,
                       idle_power_w=math.nan, training={"batch_size": 32, "steps_per_round": steps,
                                                        "round_ms": list(rounds), "check_max_abs_diff": diff,
                                                        "train_io_sha256": "ab" * 32},
                       artifact_sha256="cd" * 32, **job_ids, **kw)


def store_with_training(tmp_path, training_runner=None):
    """A campaign's store written by hand: per setting, the samples below (2 repetitions each)."""
    ws = workspace(tmp_path / "ws")
    cfg = config(training_runner=training_runner)
    plan = plan_campaign(cfg, ws)
    results = cfg.results_dir(ws)
    with ResultsStore.open(results / "results.sqlite") as store:
        store.save_campaign(cfg)
        store.save_artifacts(plan.artifacts.values())
        for job in plan.jobs:
            ids = dict(device=job.device, artifact=job.artifact, format=job.format, variant=job.variant,
                       threads=job.threads)
            client, rep = job.artifact.split("/")[1], job.repetition
            if job.format == "onnx":  # 20 samples: too few for an inference (floor 50)
                m = Measurement(ok=True, latency_ms=(1.0,) * 20, timed_window_s=2.0, output_check_passed=True, **ids)
            elif (client, job.format) == ("client-000", "torch-train"):
                # rep 0: 10 steps of 10 ms, 10 of 12 ms; rep 1: 20 of 11 ms -> p50 of the 40 = 11 ms;
                # rounds 90, 100 (rep 0) and 95 (rep 1) -> median 95 ms; 5 W over 2.5 s ÷ 20 steps = 625 mJ a step
                latency = [10.0] * 10 + [12.0] * 10 if rep == 0 else [11.0] * 20
                m = _train(ids, latency, [90.0, 100.0] if rep == 0 else [95.0], 2.5, power=(4.0, 6.0))
            elif (client, job.format) == ("client-000", "pte-train"):
                m = _train(ids, [100.0] * 20, [800.0], 2.5)
            else:  # client-001 torch-train: a window of 0.5 s, under the training floor (2 s)
                m = _train(ids, [5.0] * 20, [12.0], 0.5, steps=2)
            store.record(job, m)
    return ws, results


def test_training_rows_hold_hand_computed_numbers_and_their_own_floors(tmp_path):
    ws, results = store_with_training(tmp_path)
    with ResultsStore.open(results / "results.sqlite") as store:
        df, cfg = store.to_dataframe(), store.campaign_config()
    s = summarize(df, rules=VerdictRules.for_campaign(cfg), training_rules=VerdictRules.for_training(cfg))
    s = s.set_index(["artifact", "format"])
    assert set(TRAINING_COLUMNS) <= set(s.columns)
    t = s.loc[("run-a/client-000", "torch-train")]
    assert t["workload"] == "train" and t["verdict"] == "VALID", t["reasons"]
    assert (t["step_p50_ms"], t["p50_ms"], t["local_round_ms"], t["local_rounds"]) == (11.0, 11.0, 95.0, 3)
    assert (t["batch_size"], t["steps_per_round"], t["num_train"], t["epochs"], t["trained_params"]) == (
        32, 8, 100, 2, 640)
    assert t["local_round_pred_ms"] == 88.0  # 11 ms × 8 steps
    assert t["step_energy_mj"] == pytest.approx(625.0) and t["energy_mj"] == pytest.approx(625.0)
    assert t["local_round_energy_mj"] == pytest.approx(5000.0)
    assert t["check_max_abs_diff"] == 2e-7 and t["train_io_sha256"] == "ab" * 32
    assert t["comparison_valid"] is False or not t["comparison_valid"]
    assert math.isnan(t["speedup"]) and math.isnan(t["flop_bound"])  # a step is compared with no inference
    p = s.loc[("run-a/client-000", "pte-train")]
    assert (p["step_p50_ms"], p["local_round_ms"], p["local_round_pred_ms"]) == (100.0, 800.0, 800.0)
    assert math.isnan(p["step_energy_mj"])  # no power sensor: missing, not 0
    short = s.loc[("run-a/client-001", "torch-train")]
    assert short["verdict"] == "INVALID" and short["invalid_rules"] == "too-short"
    assert short["reasons"] == f"too-short: timed window 0.5 s < {TRAINING_RUNNER.min_seconds:g} s"
    # 20 samples: enough for a step (floor MIN_TRAIN_STEPS 20), too few for an inference (floor 50)
    onnx = s.loc[("run-a/client-000", "onnx")]
    assert onnx["workload"] == "inference" and onnx["invalid_rules"] == "too-few-runs"
    assert math.isnan(onnx["step_p50_ms"]) and math.isnan(onnx["local_round_ms"])
    assert (MIN_TRAIN_STEPS, MIN_TRAIN_SECONDS) == (20, 1.0)
    # inference rows are what they were without the training rows
    alone = summarize(df[df["format"] == "onnx"], rules=VerdictRules.for_campaign(cfg))
    both = s.reset_index()
    both = both[both["format"] == "onnx"][alone.columns].reset_index(drop=True)
    pd.testing.assert_frame_equal(both, alone, check_dtype=False)


def test_training_floor_follows_the_training_runner_table():
    assert VerdictRules.for_training({"training_runner": {"min_runs": 30, "min_seconds": 0.5}}).min_runs == 30
    assert VerdictRules.for_training({"training_runner": {"min_runs": 30, "min_seconds": 0.5}}).min_seconds == 1.0
    assert VerdictRules.for_training({"runner": {"min_runs": 300}}).min_runs == 20  # [runner] is not its floor
    assert VerdictRules.for_training(None).min_seconds == 2.0  # TRAINING_RUNNER's min_seconds


def test_training_costs_one_row_per_client_device_format_threads(tmp_path):
    _, results = store_with_training(tmp_path)
    costs = training_costs(results)
    assert list(costs.columns) == COST_COLUMNS
    assert [(r.client_id, r.format) for r in costs.itertuples()] == [
        ("client-000", "pte-train"), ("client-000", "torch-train"), ("client-001", "torch-train")]
    c = costs.set_index(["client_id", "format"])
    assert c.loc[("client-000", "torch-train"), ["step_p50_ms", "steps_per_round", "batch_size", "local_round_ms",
                                                 "trained_params", "verdict"]].tolist() == [11.0, 8, 32, 95.0,
                                                                                            640, "VALID"]
    assert c.loc[("client-001", "torch-train"), "verdict"] == "INVALID"
    assert c.loc[("client-001", "torch-train"), "local_round_ms"] == 12.0
    assert (c["artifact_sha256"] == "cd" * 32).all() and (c["device"] == "dev-a").all() and (c["threads"] == 1).all()


def test_local_rounds_prefer_the_named_format_and_count_the_round_samples(tmp_path):
    _, results = store_with_training(tmp_path)
    with ResultsStore.open(results / "results.sqlite") as store:
        s = summarize(store.to_dataframe())
    r = local_rounds(s).set_index("artifact")
    assert r.loc["run-a/client-000", "local_round_format"] == "torch-train"  # both measured: torch-train
    assert r.loc["run-a/client-000", "local_round_ms"] == 95.0
    # client-000's round: 100 samples × 2 epochs (its 8 steps of 32 would be 256: the last batch is part full)
    assert r.loc["run-a/client-000", "round_samples"] == 200.0
    assert r.loc["run-a/client-001", "round_samples"] == 50.0
    p = local_rounds(s, "pte-train").set_index("artifact")
    assert p.loc["run-a/client-000", "local_round_format"] == "pte-train"
    assert p.loc["run-a/client-001", "local_round_format"] == "torch-train"  # its only one
    assert "run-a/dense" not in r.index
    with pytest.raises(ConfigError, match="training format 'onnx'"):
        local_rounds(s, "onnx")
    assert round_samples(100, 2, 5, 32) == 160.0  # a round capped at 5 steps (max_steps): 5 × 32
    assert round_samples(math.nan, math.nan, 5, 32) == 160.0


def test_ledger_carries_each_clients_local_round_on_its_board(tmp_path):
    from edgemask.profiling.ledger import RunRecord, ledger_frame
    from edgemask.profiling.tidy import results_frame

    _, results = store_with_training(tmp_path)
    with ResultsStore.open(results / "results.sqlite") as store:
        s = results_frame(summarize(store.to_dataframe()))
    ledger, _ = ledger_frame(s, {"run-a": RunRecord("run-a")})
    assert list(ledger["format"]) == ["onnx", "onnx"]  # a training row is no model a client runs
    led = ledger.set_index("client_id")
    assert led.loc["client-000", ["local_round_ms", "local_round_format", "local_round_verdict"]].tolist() == [
        95.0, "torch-train", "VALID"]
    assert led.loc["client-001", ["local_round_ms", "local_round_verdict"]].tolist() == [12.0, "INVALID"]
    pte = ledger_frame(s, {"run-a": RunRecord("run-a")}, train_format="pte-train")[0].set_index("client_id")
    assert pte.loc["client-000", ["local_round_ms", "local_round_format"]].tolist() == [800.0, "pte-train"]


def test_report_shows_training_apart_from_inference(tmp_path):
    """write_report: results.parquet keeps the training rows (workload train) with their columns; the inference
    tables do not show them; the training table sets each measured round beside the 3× assumption (3 × 200
    samples × the dense onnx p50 1 ms = 600 ms for client-000); clients.parquet and the trace carry the round."""
    from edgemask.profiling.report import write_report
    from edgemask.profiling.trace import read_trace

    ws, results = store_with_training(tmp_path)
    _, md = write_report(results, ws)
    res = pd.read_parquet(results / "results.parquet")
    assert sorted(res.loc[res["workload"] == "train", "format"]) == ["pte-train", "torch-train", "torch-train"]
    assert (res.loc[res["workload"] == "inference", "format"] == "onnx").all()
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "contracts.md").read_text()
    documented = set(re.findall(r"`([a-z0-9_]+)`", text[text.index("## Tidy tables"):]))
    assert not set(res.columns) - documented, sorted(set(res.columns) - documented)
    assert not set(pd.read_parquet(results / "clients.parquet").columns) - documented
    row = res[(res["client_id"] == "client-000") & (res["format"] == "torch-train")].iloc[0]
    assert (row["step_p50_ms"], row["local_round_ms"], row["local_round_pred_ms"], row["verdict"]) == (
        11.0, 95.0, 88.0, "VALID")
    text = md.read_text()
    detail = text.split("## Every artifact and setting")[1].split("\n## ")[0]
    assert "torch-train" not in detail and "pte-train" not in detail and "onnx" in detail
    training = text.split("## Local training on the boards")[1].split("\n## ")[0]
    lines = [line for line in training.splitlines() if line.startswith("| run-a/")]
    assert len(lines) == 3
    c0 = next(line for line in lines if "client-000" in line and "torch-train" in line).split(" | ")
    # step p50, steps, samples, measured round, step × steps, 3×, from, measured ÷ 3×, verdicts
    assert c0[4:] == ["11.000", "8", "200", "95.000", "88.000", "600.000", "run-a/dense onnx/fp32", "0.16×",
                      "VALID", "INVALID |"]
    pte = next(line for line in lines if "pte-train" in line).split(" | ")
    assert pte[7] == "800.000" and pte[11] == "1.33×"
    assert "A training setting (one local step per sample) is VALID with at least 20 timed samples and 2 s" in text
    ledger = pd.read_parquet(results / "clients.parquet").set_index("client_id")
    assert set(ledger["format"]) == {"onnx"}
    assert ledger.loc["client-000", "local_round_ms"] == 95.0 and ledger.loc["client-001", "local_round_ms"] == 12.0
    trace, _ = read_trace(results / "traces" / "dev-a-onnx-fp32-t1")
    t = trace.set_index("client_id")
    assert t.loc["client-000", "local_round_source"] == "torch-train measured"
    assert (t.loc["client-000", "local_round_ms"], t.loc["client-000", "round_samples"]) == (95.0, 200.0)
    assert t.loc["client-000", "computation_ms"] == 1.0  # FedScale's figure stays the inference p50


def test_report_of_a_training_only_campaign(tmp_path):
    """Issue #44: a campaign with formats = ["torch-train"] alone has no inference setting; the report (which
    grouped an empty runtime table: KeyError 'application') is written, with the training table and a line
    saying why the runtime table is empty."""
    from edgemask.profiling.report import write_report

    ws = workspace(tmp_path / "ws")
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(formats=("torch-train",), devices=("dev-a",))))
    plan = plan_campaign(cfg, ws)
    assert {j.format for j in plan.jobs} == {"torch-train"}
    results = cfg.results_dir(ws)
    with ResultsStore.open(results / "results.sqlite") as store:
        store.save_campaign(cfg)
        store.save_artifacts(plan.artifacts.values())
        for job in plan.jobs:
            ids = dict(device=job.device, artifact=job.artifact, format=job.format, variant=job.variant,
                       threads=job.threads)
            store.record(job, _train(ids, [11.0] * 20, [95.0], 2.5))
    html, md = write_report(results, ws)
    assert html.is_file()
    text = md.read_text()
    assert "No inference setting measured: the campaign measured training formats only" in text
    training = text.split("## Local training on the boards")[1].split("\n## ")[0]
    rows = [line for line in training.splitlines() if line.startswith("| run-a/")]
    assert [r.split(" | ")[0] for r in rows] == ["| run-a/client-000", "| run-a/client-001"]
    assert rows[0].split(" | ")[4:8] == ["11.000", "8", "200", "95.000"]
    res = pd.read_parquet(results / "results.parquet")
    assert set(res["workload"]) == {"train"}
