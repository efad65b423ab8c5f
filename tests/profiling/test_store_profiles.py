"""Profiled runs in the store and the campaign option that asks for them: every operator sample kept, in its own
tables, written with the job's row (resumable), never mixed into the timed samples."""

import dataclasses
import json
import tomllib

import pytest

import profiling_fakes as pf
from edgemask.devices.records import Measurement, RunnerSettings
from edgemask.errors import ConfigError
from edgemask.profiling.campaign import Job, parse_campaign
from edgemask.profiling.store import ResultsStore

PROFILE = {"available": True, "profiler": "onnxruntime enable_profiling", "blocks": [], "runs": [
    {"end_to_end_ms": 0.5, "total_us": 450.0, "ops": [["relu_nchwc", "Conv", 300.0, "CPUExecutionProvider"],
                                                      ["node_linear", "Gemm", 100.0, "CPUExecutionProvider"]]},
    {"end_to_end_ms": 0.4, "total_us": 380.0, "ops": [["relu_nchwc", "Conv", 250.0, "CPUExecutionProvider"],
                                                      ["node_linear", "Gemm", 90.0, "CPUExecutionProvider"]]},
]}
JOB = Job("run-a/client-000", "onnx", "fp32", "dev-a", 1, 0)


def _m(**kw):
    base = dict(device="dev-a", artifact="run-a/client-000", format="onnx", variant="fp32", threads=1, ok=True,
                latency_ms=(1.0, 2.0), timed_window_s=0.1, profile=PROFILE)
    base.update(kw)
    return Measurement(**base)


def test_every_operator_sample_is_kept_in_its_own_tables(tmp_path):
    path = tmp_path / "r.sqlite"
    with ResultsStore.open(path) as store:
        assert store.record(JOB, _m())
        assert not store.record(JOB, _m(profile={**PROFILE, "runs": PROFILE["runs"][:1]}))  # measured: kept once
    with ResultsStore.open(path) as store:
        ops = store.operator_samples()
        assert ops[["run", "seq", "name", "op_type", "us"]].values.tolist() == [
            [0, 0, "relu_nchwc", "Conv", 300.0], [0, 1, "node_linear", "Gemm", 100.0],
            [1, 0, "relu_nchwc", "Conv", 250.0], [1, 1, "node_linear", "Gemm", 90.0]]
        assert set(ops["job_id"]) == {JOB.job_id} and set(ops["device"]) == {"dev-a"}
        assert store.profiled_runs()[["run", "end_to_end_ms", "total_us"]].values.tolist() == [
            [0, 0.5, 450.0], [1, 0.4, 380.0]]
        prof = store.profiles()
        assert prof[["available", "profiler", "blocks"]].values.tolist() == [
            [True, "onnxruntime enable_profiling", "[]"]]
        [(_, back)] = store.measurements()
        assert back.latency_ms == (1.0, 2.0) and "runs" not in back.profile  # the samples live in the tables
        assert "profile" not in store.to_dataframe().columns


def test_a_failed_job_rerun_replaces_its_profile_and_not_available_is_kept(tmp_path):
    with ResultsStore.open(tmp_path / "r.sqlite") as store:
        store.record(JOB, _m(ok=False, error="output differs"))
        why = {"available": False, "reason": "no ETDump: built without the event tracer", "blocks": [],
               "runs": [{"end_to_end_ms": 0.3, "ops": []}]}
        assert store.record(JOB, _m(profile=why))
        assert store.operator_samples().empty
        assert store.profiled_runs()["end_to_end_ms"].tolist() == [0.3]
        assert store.profiles()[["available", "reason"]].values.tolist() == [
            [False, "no ETDump: built without the event tracer"]]


def test_profile_layers_option_and_runner_arguments():
    text = pf.campaign_toml().replace("[runner]", "[runner]\nprofile_layers = true\nprofile_runs = 7")
    cfg = parse_campaign(tomllib.loads(text))
    assert cfg.runner.profile_layers is True and cfg.runner.profile_runs == 7 and cfg.runner.profile_warmup == 5
    args = cfg.runner.to_args()
    assert args[-4:] == ["--profile-runs", "7", "--profile-warmup", "5"]
    assert "--profile-runs" not in RunnerSettings().to_args()  # off by default: the runner's command unchanged
    with pytest.raises(ConfigError, match=r"\[runner\] profile_layers: must be true or false, not 1; write true or f"):
        parse_campaign(tomllib.loads(pf.campaign_toml().replace("[runner]", "[runner]\nprofile_layers = 1")))


def test_a_campaign_started_before_the_option_resumes(tmp_path):
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml()))
    with ResultsStore.open(tmp_path / "r.sqlite") as store:
        old = cfg.to_dict()
        for k in ("profile_layers", "profile_warmup", "profile_runs"):
            del old["runner"][k]  # the config as an older edgemask saved it
        store._write("INSERT OR REPLACE INTO meta VALUES ('campaign', ?)", [(json.dumps(old),)])
        store.save_campaign(cfg)  # same settings, new fields at their defaults: no refusal
        with pytest.raises(Exception, match="runner settings"):
            store.save_campaign(dataclasses.replace(cfg, runner=RunnerSettings(profile_layers=True)))
