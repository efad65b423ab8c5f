"""Provenance of derived numbers (issue #44): budgets, replay, the report and the predictor record the digests of
what they compute from and refuse, in one line naming both sides and writing nothing, inputs that do not belong
together — a run re-trained under the same id, a config or a trace of another model, non-finite numbers.

The runs are real (trained by the trainer, written with their digests); the budgets' artifacts are exported by
export (the clients' local steps); the measurements are a campaign's, run by the campaign code with a benchmark that
answers at once (as tests/profiling's other campaigns do), each step's time a line in what it trains."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pandas as pd
import pytest

import profiling_fakes as pf
from edgemask.devices.records import Measurement
from edgemask.errors import ConfigError, CorruptFileError, EdgemaskError
from edgemask.fileio import sha256_file
from edgemask.tomlio import dumps_toml

RUN = "pfm"
BIG, SMALL = [16, 16, 16], [16, 16]  # two models of one architecture name: 1,754 and 1,482 parameters


def config(hidden=BIG, seed=0, run_id=RUN) -> dict:
    return {"run": {"seed": seed, "run_id": run_id},
            "data": {"name": "digits", "num_clients": 4, "partition": "pathological", "classes_per_client": 2},
            "model": {"name": "mlp", "args": {"hidden": list(hidden)}},
            "algorithm": {"name": "perfedmask", "args": {"nu": 0.5, "budget": 0.5, "finetune_epochs": 1}},
            "training": {"rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.05}}


def train(ws: Path, hidden=BIG, seed=0) -> Path:
    """runs/pfm as `edgemask train` writes it (replacing the one there)."""
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.simulation import simulate

    return simulate(TrainConfig.from_dict(config(hidden, seed))).write(ws / "runs" / RUN)


def write_config(path: Path, hidden=BIG) -> Path:
    path.write_text(dumps_toml(config(hidden)))
    return path


def step_bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
    """A board that answers at once: 20 steps of 2 ms + 0.01 ms per trained parameter (dev-b: 3× that), 2.5 s
    window, one whole round; the training file's real digest."""
    from edgemask.manifest import load_manifest

    m = load_manifest(artifact_dir)
    step = (2.0 + 0.01 * m.training["trained_params"]) * (3.0 if spec.name == "dev-b" else 1.0)
    return Measurement(
        device=spec.name, artifact=f"{artifact_dir.parent.name}/{artifact_dir.name}", format=fmt, variant=variant,
        threads=settings.threads, ok=True, latency_ms=(step,) * 20, timed_window_s=2.5, output_check_passed=True,
        output_max_abs_diff=1e-7, artifact_sha256=m.file_for(fmt, variant).sha256,
        training={"batch_size": 16, "steps_per_round": m.training["steps_per_round"], "round_ms": [step * 4],
                  "check_max_abs_diff": 1e-7, "train_io_sha256": m.training["sha256"]})


def campaign(ws: Path, name="camp", devices=("dev-a", "dev-b"), bench=step_bench, formats=("torch-train",)):
    from edgemask.profiling.campaign import parse_campaign, run_campaign

    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(name, run=RUN, formats=formats, devices=devices,
                                                        repetitions=1)))
    res = run_campaign(cfg, ws, benchmark=bench, progress=False, inventory=pf.fleet(*devices),
                       connect=pf.FakeConnect())
    assert res.complete
    return cfg.results_dir(ws)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A workspace: run pfm (BIG) trained, its clients' local steps exported (torch-train) and measured on dev-a
    and dev-b; the config it was trained from beside."""
    from edgemask.export import export_run

    ws = tmp_path_factory.mktemp("prov") / "ws"
    run = train(ws)
    export_run(run, ws / "artifacts", formats=("torch-train",), progress=False)
    results = campaign(ws)
    write_config(ws / "pfm.toml")
    write_config(ws / "pfm-small.toml", SMALL)
    return ws, results


def copy(measured, tmp_path) -> tuple[Path, Path]:
    ws, results = measured
    shutil.copytree(ws, tmp_path / "ws")
    return tmp_path / "ws", tmp_path / "ws" / "results" / results.name


def budgets(ws, results, cfg="pfm.toml", **kw):
    from edgemask.cli.budgets import write_budgets

    return write_budgets(ws / cfg, results, {"dev-a": 0.5, "dev-b": 0.5}, kw.pop("deadline", 1.0),
                         ws / "out.toml", **kw)


def one_line_naming(e, *parts):
    msg = str(e.value)
    assert "\n" not in msg, msg
    for p in parts:
        assert p in msg, (p, msg)
    return msg


# -- the campaign records the run -------------------------------------------------------------------------------
def test_the_campaign_records_the_runs_digests(measured):
    from edgemask.profiling.store import ResultsStore

    ws, results = measured
    with ResultsStore.open(results / "results.sqlite") as store:
        runs = store.runs()
    digests = json.loads((ws / "runs" / RUN / "digests.json").read_text())["sha256"]
    assert runs == {RUN: {"digests.json": sha256_file(ws / "runs" / RUN / "digests.json"),
                          "model.safetensors": digests["model.safetensors"],
                          "config.toml": digests["config.toml"]}}


def test_a_resume_after_the_run_was_retrained_is_refused(measured, tmp_path):
    """Jobs left of a run whose files changed since the campaign recorded it: refused naming both digests."""
    ws, results = copy(measured, tmp_path)
    campaign(ws, "half", devices=("dev-a",))
    old = json.loads((ws / "runs" / RUN / "digests.json").read_text())["sha256"]["model.safetensors"]
    train(ws, seed=1)
    new = json.loads((ws / "runs" / RUN / "digests.json").read_text())["sha256"]["model.safetensors"]
    with pytest.raises(EdgemaskError) as e:
        campaign(ws, "half", devices=("dev-a", "dev-b"))
    one_line_naming(e, "recorded when the campaign started", f"runs/{RUN}", "not the same run")
    assert old[:12] in str(e.value) or new[:12] in str(e.value)


# -- budgets ------------------------------------------------------------------------------------------------------
def test_budgets_record_the_digests_they_rest_on(measured, tmp_path):
    ws, results = copy(measured, tmp_path)
    budgets(ws, results)
    src = tomllib.loads((ws / "out.toml").read_text())["algorithm"]["args"]["budget_source"]
    inputs = src["inputs"]
    digests = json.loads((ws / "runs" / RUN / "digests.json").read_text())["sha256"]
    assert inputs["config"] == {"path": str(ws / "pfm.toml"), "sha256": sha256_file(ws / "pfm.toml")}
    assert inputs["results_sqlite"] == sha256_file(results / "results.sqlite") == src["results_sha256"]
    run = inputs["measured_run"]
    assert (run["run_id"], run["model"], run["dataset"], run["params"], run["run_dir"]) == (
        RUN, "mlp", "digits", 1754, "found")
    assert run["sha256"] == {"digests.json": sha256_file(ws / "runs" / RUN / "digests.json"),
                             "model.safetensors": digests["model.safetensors"], "config.toml": digests["config.toml"]}
    manifest = json.loads((ws / "artifacts" / RUN / "client-000" / "manifest.json").read_text())
    train_file = next(f["sha256"] for f in manifest["files"] if f["format"] == "torch-train")
    assert inputs["rows"][f"{RUN}/client-000 torch-train on dev-a"] == train_file


def test_budgets_refuse_a_config_of_another_model(measured, tmp_path):
    """The config says mlp 16-16 (1,482 parameters); the measured run pfm is mlp 16-16-16 (1,754)."""
    ws, results = copy(measured, tmp_path)
    with pytest.raises(ConfigError) as e:
        budgets(ws, results, "pfm-small.toml")
    one_line_naming(e, f"--config {ws / 'pfm-small.toml'}", "1,482 parameters", f"--results {results}",
                    "1,754 parameters", "parameter count")
    assert not (ws / "out.toml").exists()


def test_budgets_refuse_a_run_retrained_under_the_same_id(measured, tmp_path):
    """runs/pfm trained again (same model, another seed) after the campaign: the store's record of the run and
    the run directory part on the weights' digest."""
    ws, results = copy(measured, tmp_path)
    recorded = json.loads((ws / "runs" / RUN / "digests.json").read_text())["sha256"]["model.safetensors"]
    train(ws, seed=1)
    now = json.loads((ws / "runs" / RUN / "digests.json").read_text())["sha256"]["model.safetensors"]
    assert now != recorded
    with pytest.raises(ConfigError) as e:
        budgets(ws, results)
    one_line_naming(e, f"runs/{RUN}", f"--results {results}", recorded[:12], now[:12], "re-trained")
    assert not (ws / "out.toml").exists()


def test_budgets_refuse_a_run_of_another_model_under_the_same_id(measured, tmp_path):
    """runs/pfm trained again with mlp 16-16: its config (the new model) is refused against the measured rows,
    and the old config against the run directory now there."""
    ws, results = copy(measured, tmp_path)
    train(ws, hidden=SMALL)
    with pytest.raises(ConfigError) as e:
        budgets(ws, results, "pfm-small.toml")
    one_line_naming(e, "1,482 parameters", "1,754 parameters", "--config", "--results")
    with pytest.raises(ConfigError) as e:
        budgets(ws, results)
    one_line_naming(e, f"runs/{RUN}: run {RUN}, model mlp on digits, 1,482 parameters", "1,754 parameters")
    assert not (ws / "out.toml").exists()


def test_budgets_refuse_a_config_whose_model_table_differs(measured, tmp_path):
    """mlp 5-22-39 has pfm's 1,754 parameters too: the name and the count agree with the measured rows, the
    [model] table parts from the run's config.toml, and that is refused naming both."""
    ws, results = copy(measured, tmp_path)
    write_config(ws / "same-size.toml", [5, 22, 39])
    with pytest.raises(ConfigError) as e:
        budgets(ws, results, "same-size.toml")
    one_line_naming(e, f"--config {ws / 'same-size.toml'}: [model] mlp (hidden=[5, 22, 39])",
                    f"{ws / 'runs' / RUN / 'config.toml'}: [model] mlp (hidden=[16, 16, 16])")
    assert not (ws / "out.toml").exists()


def test_budgets_refuse_a_run_the_results_never_measured(measured, tmp_path):
    ws, results = copy(measured, tmp_path)
    with pytest.raises(ConfigError) as e:
        budgets(ws, results, measured_run="other-run")
    one_line_naming(e, "no artifact of run other-run", f"runs measured: {RUN}", f"describes run {RUN}")
    assert not (ws / "out.toml").exists()


@pytest.mark.parametrize("deadline", [float("nan"), float("inf"), -1.0, 0.0])
def test_budgets_refuse_a_deadline_that_is_no_finite_positive_number(measured, tmp_path, deadline):
    ws, results = copy(measured, tmp_path)
    with pytest.raises(ConfigError) as e:
        budgets(ws, results, deadline=deadline)
    one_line_naming(e, "--deadline")
    assert not (ws / "out.toml").exists()


def test_budgets_refuse_a_non_finite_step_in_the_results(measured, tmp_path):
    """A board whose steps were stored as inf (a JSON "Infinity"): named with the store, the field and the row."""
    ws, _ = copy(measured, tmp_path)

    def inf_bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
        m = step_bench(conn, spec, artifact_dir, fmt, variant, settings, timeout)
        if artifact_dir.name == "client-001" and spec.name == "dev-a":
            import dataclasses

            m = dataclasses.replace(m, latency_ms=(float("inf"),) * 20)
        return m

    results = campaign(ws, "inf", bench=inf_bench)
    with pytest.raises(CorruptFileError) as e:
        budgets(ws, results, allow_invalid=True)
    one_line_naming(e, str(results / "results.sqlite"), f"job {RUN}/client-001|torch-train|fp32|dev-a|t1|r0",
                    "field latency_ms holds inf (sample 0)")
    assert not (ws / "out.toml").exists()
    # the fitted rows' own numbers: a step p50 that is no finite number is refused naming the field and row
    from edgemask.profiling.provenance import finite_column

    rows = pd.DataFrame({"artifact": [f"{RUN}/client-001"], "device": ["dev-a"], "step_p50_ms": [float("nan")]})
    with pytest.raises(CorruptFileError) as e:
        finite_column(rows, "step_p50_ms", "results.sqlite", lambda r: f"{r['artifact']} on {r['device']}",
                      positive=True, missing_ok=False)
    one_line_naming(e, "field step_p50_ms is nan", f"{RUN}/client-001 on dev-a")


# -- report, traces and replay ------------------------------------------------------------------------------------
CLIENTS = ("client-000", "client-001", "client-002", "client-003")


def manifests(ws: Path, params=1754, **kw) -> None:
    """Run pfm's artifacts as export's manifests state them (stand-in model files, pf.write_manifest): the run's
    model, data set and dense parameters unless told otherwise."""
    pf.write_manifest(ws, RUN, "dense", kind="dense", algorithm="perfedmask", model="mlp", formats=(("onnx", "fp32"),),
                      params=(params, params), **kw)
    for c in CLIENTS:
        pf.write_manifest(ws, RUN, c, kind="compacted", algorithm="perfedmask", model="mlp",
                          formats=(("onnx", "fp32"),), params=(params, 900), **kw)


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """run pfm trained, its artifacts measured (onnx on dev-a), the report written: traces under results/."""
    from edgemask.profiling.report import write_report

    ws = tmp_path_factory.mktemp("rep") / "ws"
    train(ws)
    manifests(ws)
    results = campaign(ws, "onnx-camp", devices=("dev-a",), bench=pf.FakeBenchmark(), formats=("onnx",))
    write_report(results, ws)
    return ws, results


def replay_out(ws, trace, **kw):
    from edgemask.profiling.replay import ReplaySettings, replay_report

    return replay_report(ws, [RUN], trace, ReplaySettings(**kw))


def trace_of(results: Path) -> Path:
    return results / "traces" / "dev-a-onnx-fp32-t1"


def test_report_and_trace_record_what_they_are_derived_from(reported):
    ws, results = reported
    digests = json.loads((ws / "runs" / RUN / "digests.json").read_text())["sha256"]
    meta = json.loads((trace_of(results) / "trace.json").read_text())
    assert meta["runs"][RUN] == {"run_id": RUN, "model": "mlp", "dataset": "digits", "params": 1754, "sha256": {
        "digests.json": sha256_file(ws / "runs" / RUN / "digests.json"),
        "model.safetensors": digests["model.safetensors"], "config.toml": digests["config.toml"]}}
    assert set(meta["inputs"]) == {"results.sqlite"}
    md = (results / "summary.md").read_text()
    assert (f"Derived from results.sqlite sha256 {meta['inputs']['results.sqlite'][:12]}…; run {RUN}, model mlp on "
            f"digits, 1,754 parameters, model.safetensors {digests['model.safetensors'][:12]}…") in md


def test_replay_checks_the_run_against_the_trace_and_names_its_inputs(reported):
    ws, results = reported
    out = replay_out(ws, trace_of(results))
    line = next(x for x in out.splitlines() if "inputs (sha256)" in x)
    history = sha256_file(ws / "runs" / RUN / "history.parquet")
    assert f"run {RUN}: " in line and f"history.parquet {history[:12]}…" in line
    assert "checked against the trace's record" in line


def test_replay_refuses_a_run_retrained_since_the_trace(reported, tmp_path):
    ws, results = copy(reported, tmp_path)
    train(ws, seed=1)
    with pytest.raises(ConfigError) as e:
        replay_out(ws, trace_of(results))
    one_line_naming(e, f"runs/{RUN}: run {RUN}", str(trace_of(results) / "trace.json"), "model.safetensors sha256",
                    "not the same run")


def test_replay_refuses_a_trace_of_another_model(reported, tmp_path):
    """runs/pfm re-trained as mlp 16-16 (1,482 parameters); the trace's costs are of 1,754-parameter pfm."""
    ws, results = copy(reported, tmp_path)
    train(ws, hidden=SMALL)
    with pytest.raises(ConfigError) as e:
        replay_out(ws, trace_of(results))
    one_line_naming(e, "1,482 parameters", "1,754 parameters", "parameter count", "trace.json")


def test_replay_refuses_a_trace_that_cannot_say_whose_costs_it_holds(reported, tmp_path):
    """A trace.json written before issue #44 (no runs record) or one that states nothing of the run."""
    ws, results = copy(reported, tmp_path)
    path = trace_of(results) / "trace.json"
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "runs"}))
    with pytest.raises(ConfigError) as e:
        replay_out(ws, trace_of(results))
    one_line_naming(e, str(path), f"records no provenance of run {RUN}", "rerun `edgemask report`")
    path.write_text(json.dumps({**meta, "runs": {RUN: {"run_id": RUN}}}))
    with pytest.raises(ConfigError) as e:
        replay_out(ws, trace_of(results))
    one_line_naming(e, str(path), "neither the model nor the digests")


def test_a_trace_with_non_finite_numbers_is_refused_naming_file_and_field(tmp_path):
    from edgemask.profiling.trace import read_trace, write_traces

    ledger = pd.DataFrame({"run_id": RUN, "client_id": ["a", "b"], "algorithm": "x", "device": "dev",
                           "format": "onnx", "variant": "fp32", "threads": 1, "artifact": [f"{RUN}/a", f"{RUN}/b"],
                           "p50_ms": [2.0, float("inf")], "energy_mj": [4.0, 1.0], "verdict": "VALID"})
    (d,), _ = write_traces(tmp_path, ledger, ledger.assign(kind="compacted"), train_model="compacted")
    with pytest.raises(CorruptFileError) as e:
        read_trace(d)
    one_line_naming(e, str(d / "trace.parquet"), "field computation_ms is inf", f"{RUN}/b")
    (d2,), _ = write_traces(tmp_path / "neg", ledger.assign(p50_ms=[2.0, 3.0], energy_mj=[4.0, -1.0]),
                            ledger.assign(kind="compacted", p50_ms=[2.0, 3.0], energy_mj=[4.0, -1.0]),
                            train_model="compacted")
    with pytest.raises(CorruptFileError) as e:
        read_trace(d2)
    one_line_naming(e, "field train_energy_mj is -1.0", f"{RUN}/b", "non-negative")


def test_a_measured_round_said_but_missing_is_refused(tmp_path):
    from edgemask.profiling.trace import TRACE_PARQUET, check_numbers

    t = pd.DataFrame({"run_id": [RUN], "client_id": ["a"], "computation_ms": [2.0],
                      "local_round_source": ["torch-train measured"], "local_round_ms": [float("nan")],
                      "round_samples": [200.0]})
    with pytest.raises(CorruptFileError) as e:
        check_numbers(t, {"bandwidth_kbps": 10_000.0}, tmp_path / TRACE_PARQUET)
    one_line_naming(e, "field local_round_ms is nan", f"{RUN}/a")
    with pytest.raises(CorruptFileError) as e:
        check_numbers(t.assign(local_round_ms=1.0), {"bandwidth_kbps": float("inf")}, tmp_path / TRACE_PARQUET)
    one_line_naming(e, "trace.json", "bandwidth_kbps")


def test_another_runs_measured_round_falls_back_explicitly(tmp_path):
    """A trace row whose measured round came from another run's artifact is not used for this run: the client
    falls back to the 3× assumption, and the output says which and why; another run's inference cost is refused."""
    from edgemask.profiling.replay import own_rows

    costs = pd.DataFrame({"client_id": ["a", "b"], "computation_ms": [2.0, 3.0],
                          "train_artifact": [f"{RUN}/dense"] * 2, "local_round_ms": [40.0, 50.0],
                          "round_samples": [10.0, 10.0], "local_round_source": ["torch-train measured"] * 2,
                          "train_round_artifact": [f"{RUN}/a", "other-run/b"]})
    kept, foreign = own_rows(costs, RUN, tmp_path / "trace.parquet")
    assert foreign == {"b": "other-run/b"}
    assert kept.set_index("client_id")["local_round_ms"].tolist()[0] == 40.0
    assert pd.isna(kept.set_index("client_id").loc["b", "local_round_ms"])
    with pytest.raises(CorruptFileError) as e:
        own_rows(costs.assign(train_artifact=["other-run/dense"] * 2), RUN, tmp_path / "trace.parquet")
    one_line_naming(e, "trace.parquet", "field train_artifact is 'other-run/dense'", "another run's model")


def test_replay_refuses_a_non_finite_history_value(reported, tmp_path):
    from edgemask.trainer.run_dir import write_digests

    ws, results = copy(reported, tmp_path)
    run = ws / "runs" / RUN
    h = pd.read_parquet(run / "history.parquet")
    i = h.index[h["metric"] == "samples_seen"][0]
    h.loc[i, "value"] = float("inf")
    h.to_parquet(run / "history.parquet")
    (run / "digests.json").unlink()
    write_digests(run)  # a history written so (not a changed file): its digest is right, its number is not
    with pytest.raises(ConfigError):  # the run's digests.json now differs from the trace's record of it
        replay_out(ws, trace_of(results))
    from edgemask.profiling.replay import check_history

    with pytest.raises(CorruptFileError) as e:
        check_history(h, run / "history.parquet", "mean_accuracy")
    one_line_naming(e, str(run / "history.parquet"), "field value is inf", "metric samples_seen")


def test_report_refuses_a_run_directory_of_another_model(reported, tmp_path):
    """runs/pfm re-trained with mlp 16-16 after the campaign: the ledger and the traces would join its summary to
    the 1,754-parameter model's measurements. Refused naming both; nothing written."""
    from edgemask.profiling.report import write_report

    ws, results = copy(reported, tmp_path)
    for p in results.iterdir():  # what the report wrote: gone, so that nothing written shows
        if p.name not in ("results.sqlite", "campaign.lock"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    train(ws, hidden=SMALL)
    with pytest.raises(ConfigError) as e:
        write_report(results, ws)
    one_line_naming(e, f"runs/{RUN}: run {RUN}, model mlp on digits, 1,482 parameters",
                    str(results / "results.sqlite"), "1,754 parameters")
    assert sorted(p.name for p in results.iterdir() if not p.name.startswith("results.sqlite")) == [
        "campaign.lock"]


def test_report_refuses_a_run_whose_artifacts_state_two_models(tmp_path):
    """One run id whose client-001 manifest states another dense model than its dense baseline: its comparisons
    would set a baseline of one model against the other. Refused naming both artifacts; nothing written."""
    from edgemask.profiling.report import write_report

    ws = tmp_path / "ws"
    manifests(ws)
    pf.write_manifest(ws, RUN, "client-001", kind="compacted", algorithm="perfedmask", model="mlp",
                      formats=(("onnx", "fp32"),), params=(1482, 900))
    results = campaign(ws, "two", devices=("dev-a",), bench=pf.FakeBenchmark(), formats=("onnx",))
    with pytest.raises(ConfigError) as e:
        write_report(results, ws)
    one_line_naming(e, f"artifact {RUN}/client-000's manifest", f"artifact {RUN}/client-001's manifest",
                    "1,754 parameters", "1,482 parameters")
    assert sorted(p.name for p in results.iterdir() if not p.name.startswith("results.sqlite")) == [
        "campaign.lock"]


def test_report_refuses_a_stored_sample_that_is_no_finite_number(tmp_path):
    """A measurement whose latency samples hold NaN or inf (no runner writes one): one line naming the store, the
    job and the field; nothing written."""
    import dataclasses

    from edgemask.profiling.report import write_report

    ws = tmp_path / "ws"
    manifests(ws)

    def nan_bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
        m = pf.fake_measurement(spec, artifact_dir, fmt, variant, settings)
        return dataclasses.replace(m, latency_ms=(4.0, float("nan"), 4.1)) if artifact_dir.name == "client-002" else m

    results = campaign(ws, "nan", devices=("dev-a",), bench=nan_bench, formats=("onnx",))
    with pytest.raises(CorruptFileError) as e:
        write_report(results, ws)
    one_line_naming(e, str(results / "results.sqlite"), f"job {RUN}/client-002|onnx|fp32|dev-a|t1|r0",
                    "field latency_ms holds nan (sample 1)")
    assert sorted(p.name for p in results.iterdir() if not p.name.startswith("results.sqlite")) == [
        "campaign.lock"]


def test_report_names_artifacts_exported_again_since_measured(reported, tmp_path):
    from edgemask.profiling.report import write_report

    ws, results = copy(reported, tmp_path)
    measured_sha = json.loads((ws / "artifacts" / RUN / "client-002" / "manifest.json").read_text())["files"][0][
        "sha256"]
    pf.write_manifest(ws, RUN, "client-002", kind="compacted", algorithm="perfedmask", model="mlp",
                      formats=(("onnx", "fp32"),), params=(1754, 900), nbytes=5000)
    now = json.loads((ws / "artifacts" / RUN / "client-002" / "manifest.json").read_text())["files"][0]["sha256"]
    _, md = write_report(results, ws)
    assert (f"artifacts/{RUN}/client-002: its onnx/fp32 file is now sha256 {now[:12]}…, not the "
            f"{measured_sha[:12]}… the campaign measured") in md.read_text()


# -- the predictor ------------------------------------------------------------------------------------------------
def test_the_predictor_refuses_a_fit_on_clients_of_two_models():
    from edgemask.profiling.predict import ClientLayers, fit, model_of

    def man(dense, total):
        return {"model": "cnn", "dataset": "digits", "params": {"dense": dense},
                "layers": [{"name": "conv1", "kept": 8, "total": total}]}

    a, b = model_of(man(1000, 16)), model_of(man(1200, 20))
    assert a == "cnn on digits, 1,000 parameters, layers conv1/16"
    one = [ClientLayers(f"r/c{i}", {"conv1": k}, {"conv1": 10 * k}, {"conv1": 0.1 * k}, 1.0 + 0.1 * k, a)
           for i, k in enumerate((4, 8, 12))]
    other = ClientLayers("s/c9", {"conv1": 6}, {"conv1": 60}, {"conv1": 0.6}, 1.6, b)
    with pytest.raises(ConfigError) as e:
        fit([*one, other])
    one_line_naming(e, f"r/c0 ({a})", f"s/c9 ({b})", "two models")
    model = fit(one)
    assert model.model == a
    assert model.predict(ClientLayers("r/c5", {"conv1": 6}, {"conv1": 60}, model=a)) == pytest.approx(1.6)
    with pytest.raises(ConfigError) as e:
        model.predict(ClientLayers("s/c5", {"conv1": 6}, {"conv1": 60}, model=b))
    one_line_naming(e, f"s/c5 ({b})", f"r/c0, r/c1, r/c2 ({a})")


def test_cli_budgets_refusal_is_one_line_and_writes_nothing(measured, tmp_path, capsys):
    from edgemask.cli.main import main

    ws, results = copy(measured, tmp_path)
    code = main(["budgets", "--workspace", str(ws), "--config", str(ws / "pfm-small.toml"), "--results",
                 str(results), "--mix", "dev-a=0.5,dev-b=0.5", "--deadline", "1", "--out", str(ws / "out.toml")])
    out, err = capsys.readouterr()
    assert code != 0 and err.count("\n") == 1 and "1,482 parameters" in err and "1,754 parameters" in err
    assert not (ws / "out.toml").exists()
    assert main(["budgets", "--workspace", str(ws), "--config", str(ws / "pfm.toml"), "--results", str(results),
                 "--mix", "dev-a=0.5,dev-b=0.5", "--deadline", "1", "--out", str(ws / "out.toml")]) == 0
    assert (ws / "out.toml").is_file()
