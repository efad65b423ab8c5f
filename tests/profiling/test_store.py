"""The results store: round trip, uniqueness, exports."""

import json
import math
import sqlite3

import pytest

import profiling_fakes as pf
from edgemask.devices.records import Measurement, RunnerSettings
from edgemask.errors import EdgemaskError
from edgemask.profiling.campaign import Job, read_manifest
from edgemask.profiling.store import ResultsStore


def _measurement(**kw):
    base = dict(device="dev-a", artifact="run-a/client-000", format="onnx", variant="fp32", threads=2, ok=True,
                latency_ms=(1.25, 2.5, 3.75), load_ms=7.0, first_inference_ms=9.0, peak_rss_kb=1234,
                rss_growth_kb=321, output_max_abs_diff=2e-7, output_check_passed=True, accuracy=0.875,
                power_source="hwmon:ina219", power_w=(2.5, 3.5), power_rate_hz=50.0, idle_power_w=1.5,
                timed_window_s=0.5, state_before={"governor": "ondemand", "throttled": "0x0"},
                state_after={"governor": "ondemand", "throttled": "0x50000"}, runtime_version="1.31.1")
    base.update(kw)
    return Measurement(**base)


JOB = Job("run-a/client-000", "onnx", "fp32", "dev-a", 2, 0)


def test_round_trip_keeps_raw_samples_and_state(tmp_path):
    path = tmp_path / "results" / "c" / "results.sqlite"
    m = _measurement()
    with ResultsStore.open(path) as store:
        assert store.record(JOB, m, attempts=3)
    with ResultsStore.open(path) as store:  # reopened: the data is on disk
        [(job, back)] = store.measurements()
        assert job == JOB and back == m
        df = store.to_dataframe()
    row = df.iloc[0]
    assert row["job_id"] == JOB.job_id and row["attempts"] == 3 and row["repetition"] == 0
    assert row["latency_ms"] == [1.25, 2.5, 3.75] and row["power_w"] == [2.5, 3.5]
    assert row["power_source"] == "hwmon:ina219"
    assert json.loads(row["state_after"]) == {"governor": "ondemand", "throttled": "0x50000"}
    assert bool(row["throttled"]) is True  # seen in state_after only


def test_nan_fields_survive(tmp_path):
    m = _measurement(power_w=(), power_source=None, idle_power_w=math.nan, energy_missing_reason="no sensor")
    with ResultsStore.open(tmp_path / "r.sqlite") as store:
        store.record(JOB, m)
        [(_, back)] = store.measurements()
    assert math.isnan(back.idle_power_w) and back.energy_missing_reason == "no sensor" and back.power_w == ()


def test_a_job_is_recorded_once(tmp_path):
    with ResultsStore.open(tmp_path / "r.sqlite") as store:
        assert store.record(JOB, _measurement()) is True
        assert store.record(JOB, _measurement(latency_ms=(99.0,))) is False
        assert store.done_job_ids() == {JOB.job_id}
        [(_, back)] = store.measurements()
        assert back.latency_ms == (1.25, 2.5, 3.75)  # the first one stays
    db = sqlite3.connect(tmp_path / "r.sqlite")
    with pytest.raises(sqlite3.IntegrityError):  # the schema itself refuses a second row
        db.execute("INSERT INTO measurements SELECT * FROM measurements")


def test_wal_mode(tmp_path):
    ResultsStore.open(tmp_path / "r.sqlite").close()
    db = sqlite3.connect(tmp_path / "r.sqlite")
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_manifest_numbers_joined_into_the_dataframe(tmp_path):
    d = pf.write_manifest(tmp_path, "run-a", "client-000", kind="compacted", params=(1000, 400),
                          flops=(10_000, 2_000), nbytes=4096)
    info = read_manifest(d / "manifest.json")
    with ResultsStore.open(tmp_path / "r.sqlite") as store:
        store.save_artifacts([info])
        store.record(JOB, _measurement())
        df = store.to_dataframe()
    row = df.iloc[0]
    assert (row["run_id"], row["client_id"], row["kind"], row["algorithm"], row["model"]) == (
        "run-a", "client-000", "compacted", "fedmask", "cnn")
    assert (row["params_dense"], row["params_compacted"], row["flops_dense"], row["flops_compacted"]) == (
        1000, 400, 10_000, 2_000)
    assert row["model_bytes"] == 4096
    assert list(row["latency_ms"]) == [1.25, 2.5, 3.75]


def test_resume_with_other_runner_settings_is_refused(tmp_path):
    import dataclasses
    import tomllib

    from edgemask.profiling.campaign import parse_campaign

    cfg = parse_campaign(tomllib.loads(pf.campaign_toml()))
    with ResultsStore.open(tmp_path / "r.sqlite") as store:
        store.save_campaign(cfg)
        store.save_campaign(dataclasses.replace(cfg, repetitions=5))  # more repetitions: fine
        assert store.campaign_config()["repetitions"] == 5
        with pytest.raises(EdgemaskError, match="runner settings"):
            store.save_campaign(dataclasses.replace(cfg, runner=RunnerSettings(min_runs=7)))


def test_not_a_database(tmp_path):
    from edgemask.errors import CorruptFileError

    bad = tmp_path / "r.sqlite"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(CorruptFileError, match=str(bad)):
        ResultsStore.open(bad)


_SCHEMA_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE measurements (
    job_id TEXT NOT NULL UNIQUE, artifact TEXT NOT NULL, format TEXT NOT NULL, variant TEXT NOT NULL,
    device TEXT NOT NULL, threads INTEGER NOT NULL, repetition INTEGER NOT NULL,
    ok INTEGER NOT NULL, attempts INTEGER NOT NULL, recorded_at TEXT NOT NULL, measurement TEXT NOT NULL);
CREATE TABLE failures (
    id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, artifact TEXT NOT NULL, format TEXT NOT NULL,
    variant TEXT NOT NULL, device TEXT NOT NULL, threads INTEGER NOT NULL, repetition INTEGER NOT NULL,
    reason TEXT NOT NULL, attempts INTEGER NOT NULL, recorded_at TEXT NOT NULL);
INSERT INTO meta VALUES ('schema', '1');
"""


def test_a_schema_1_store_is_migrated_and_its_failed_rows_are_no_longer_done(tmp_path):
    # what the old code wrote for a Ctrl-C: ok = 0 "runner exited with rc=-2", and it took that job as done
    path = tmp_path / "r.sqlite"
    db = sqlite3.connect(path)
    db.executescript(_SCHEMA_1)
    cut = Job("run-a/client-001", "onnx", "fp32", "dev-a", 2, 0)
    for job, m in ((JOB, _measurement()), (cut, _measurement(ok=False, error="runner exited with rc=-2"))):
        db.execute("INSERT INTO measurements VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                   (job.job_id, job.artifact, job.format, job.variant, job.device, job.threads, job.repetition,
                    int(m.ok), 1, "2026-11-22T10:00:00Z", json.dumps(m.to_dict())))
    db.commit()
    db.close()
    with ResultsStore.open(path) as store:
        assert store.done_job_ids() == {JOB.job_id}
        assert store.job_status() == {JOB.job_id: "measured"}
        assert [j for j, _ in store.measurements()] == [JOB, cut]  # nothing lost
        assert store.record(cut, _measurement(latency_ms=(5.0,))) is True  # the resume measures it
        assert store.done_job_ids() == {JOB.job_id, cut.job_id}
        [(_, old)] = store.superseded()
        assert old.error == "runner exited with rc=-2"
    assert sqlite3.connect(path).execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0] == "3"


def test_a_newer_schema_is_refused_with_one_line(tmp_path):
    from edgemask.errors import CorruptFileError

    path = tmp_path / "r.sqlite"
    ResultsStore.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = '9' WHERE key = 'schema'")
    db.commit()
    db.close()
    with pytest.raises(CorruptFileError, match=r"store schema 9, this edgemask reads 3") as e:
        ResultsStore.open(path)
    assert "\n" not in str(e.value)


def test_interrupted_and_failed_are_told_apart_and_only_failed_runs_count(tmp_path):
    other = Job("run-a/client-001", "onnx", "fp32", "dev-a", 2, 0)
    with ResultsStore.open(tmp_path / "r.sqlite") as store:
        store.record_failure(JOB, "RunInterrupted: local: python was interrupted", 1, status="interrupted")
        store.record_failure(other, "DeviceError: link dropped", 3)
        store.record_failure(other, "DeviceError: link dropped", 3)
        assert store.job_status() == {JOB.job_id: "interrupted", other.job_id: "failed"}
        assert store.failed_runs() == {other.job_id: 2}
        assert store.done_job_ids() == set()
        assert store.record(JOB, _measurement()) is True
        assert store.job_status()[JOB.job_id] == "measured"
        assert list(store.failures()["job_id"]) == [other.job_id] * 2
