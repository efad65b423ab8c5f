"""Issue 27 item 2: every stored repetition names the model file it measured (its sha256), and two files are never
pooled into one setting: not by the store, not by the statistics, not by the report or the tidy tables."""

from __future__ import annotations

import sqlite3

import pandas as pd
import pytest

from edgemask.devices.records import Measurement
from edgemask.profiling.records import Job
from edgemask.profiling.stats import summarize
from edgemask.profiling.store import DigestChanged, ResultsStore
from edgemask.profiling.tidy import samples_frame

A, B = "a410bd" + "0" * 58, "278aac" + "1" * 58  # the two files of the probe


def _m(latency: tuple[float, ...], digest: str | None) -> Measurement:
    return Measurement(device="local", artifact="run-a/client-004", format="onnx", variant="fp32", threads=1,
                       ok=True, latency_ms=latency, output_check_passed=True, timed_window_s=1.0,
                       artifact_sha256=digest)


def _job(rep: int) -> Job:
    return Job("run-a/client-004", "onnx", "fp32", "local", 1, rep)


def test_the_digest_is_a_store_column_and_a_dataframe_column(tmp_path):
    path = tmp_path / "results.sqlite"
    with ResultsStore.open(path) as store:
        assert store.record(_job(0), _m((1.0, 2.0), A))
        df = store.to_dataframe()
        assert store.setting_digests() == {("run-a/client-004", "onnx", "fp32", "local", 1): {A: 1}}
    assert df["artifact_sha256"].tolist() == [A]
    con = sqlite3.connect(path)
    assert con.execute("SELECT artifact_sha256 FROM measurements").fetchall() == [(A,)]


def test_a_repetition_of_another_file_is_refused_by_the_store(tmp_path):
    with ResultsStore.open(tmp_path / "results.sqlite") as store:
        assert store.record(_job(0), _m((1.0, 1.1), A))
        with pytest.raises(DigestChanged, match=r"measured from model file sha256 a410bd0{6}… \(1 repetition"
                                                r"\(s\)\), this repetition from 278aac1{6}…"):
            store.record(_job(1), _m((2.0, 2.1), B))
        assert [j.repetition for j, _ in store.measurements()] == [0]  # nothing written
        assert store.record(_job(1), _m((1.05,), A))  # the same file is fine


def _two_file_frame(tmp_path) -> pd.DataFrame:
    """The probe's store: r0 measured file A, r1 file B (written past the store's guard, as an older edgemask
    did, by changing the column afterwards)."""
    path = tmp_path / "results.sqlite"
    with ResultsStore.open(path) as store:
        store.record(_job(0), _m((1.0, 1.0, 1.0), A))
        store.record(_job(1), _m((2.0, 2.0, 2.0), A))
    con = sqlite3.connect(path)
    con.execute("UPDATE measurements SET artifact_sha256 = ? WHERE repetition = 1", (B,))
    con.commit()
    con.close()
    with ResultsStore.open(path) as store:
        return store.to_dataframe()


def test_statistics_never_pool_two_files(tmp_path):
    df = _two_file_frame(tmp_path)
    s = summarize(df).set_index("artifact_sha256")
    # pooled, the old code said reps 2, p50 1.5 ms
    assert len(s) == 2
    assert s.loc[A, "repetitions"] == 1 and s.loc[A, "p50_ms"] == 1.0
    assert s.loc[B, "repetitions"] == 1 and s.loc[B, "p50_ms"] == 2.0
    samples = samples_frame(df)
    lat = samples[samples["metric"] == "latency_ms"]
    assert lat.groupby("artifact_sha256")["value"].sum().to_dict() == {A: 3.0, B: 6.0}


def test_a_row_without_digest_is_an_unknown_file_of_its_own(tmp_path):
    path = tmp_path / "results.sqlite"
    with ResultsStore.open(path) as store:
        store.record(_job(0), _m((1.0,), None))  # as written before digests were kept
        store.record(_job(1), _m((3.0,), A))
        s = summarize(store.to_dataframe())
    assert sorted(s["repetitions"]) == [1, 1] and sorted(s["p50_ms"]) == [1.0, 3.0]


def test_the_report_says_a_setting_was_measured_from_two_files(tmp_path):
    from edgemask.profiling.report import write_report

    results = tmp_path / "results" / "c"
    results.mkdir(parents=True)
    _two_file_frame(results)
    html, md = write_report(results, tmp_path)
    text = md.read_text()
    assert ("run-a/client-004 onnx/fp32 on local with 1 thread(s) was measured from 2 different model files "
            "(sha256 278aac111111… (1 rep.), a410bd000000… (1 rep.)): one row per file, never pooled") in text
    table = pd.read_parquet(results / "results.parquet")
    assert sorted(table["artifact_sha256"]) == [B, A] and table["repetitions"].tolist() == [1, 1]


def test_a_schema_2_store_gains_the_column_with_unknown_digests(tmp_path):
    path = tmp_path / "results.sqlite"
    with ResultsStore.open(path) as store:
        store.record(_job(0), _m((1.0,), A))
    con = sqlite3.connect(path)  # back to what schema 2 looked like
    for table in ("measurements", "superseded", "failures"):
        con.execute(f"ALTER TABLE {table} DROP COLUMN artifact_sha256")
    con.execute("UPDATE meta SET value = '2' WHERE key = 'schema'")
    con.commit()
    con.close()
    with ResultsStore.open(path) as store:
        assert store.to_dataframe()["artifact_sha256"].tolist() == [None]
        assert store.setting_digests() == {}
        assert store.record(_job(1), _m((1.0,), B))  # an unknown file never conflicts with a known one
    con = sqlite3.connect(path)
    assert con.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("3",)


# -- the probe, as a user runs it: `edgemask profile`, Ctrl-C, re-export, resume ------------------------------

@pytest.mark.slow
def test_a_resume_after_a_re_export_is_refused_in_one_line(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tests" / "devices"))
    from artifacts import make_artifact
    from processes import runner_pids, wait_until

    import profiling_fakes as pf
    from edgemask.fileio import sha256_file

    ws = tmp_path / "ws"
    art = make_artifact(ws / "artifacts" / "run-test" / "client-007")
    first_sha = sha256_file(art / "model.onnx")
    toml = tmp_path / "campaign.toml"
    toml.write_text(pf.real_campaign_toml("reexport", seconds=3.0))
    db = ws / "results" / "reexport" / "results.sqlite"
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1")
    argv = [sys.executable, "-m", "edgemask.cli", "profile", "--workspace", str(ws), "--campaign", str(toml)]

    def measured() -> list[tuple]:
        if not db.is_file():
            return []
        con = sqlite3.connect(db)
        try:
            return con.execute("SELECT job_id FROM measurements WHERE status = 'measured'").fetchall()
        except sqlite3.OperationalError:  # the schema is being written
            return []
        finally:
            con.close()

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root,
                            start_new_session=True)
    try:
        blobs = ws / "devices" / "local" / "blobs"
        wait_until(lambda: (measured() and runner_pids(blobs)) or proc.poll() is not None, 180,
                   "r0 measured and r1's runner timing")
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C during r1 (its timed window lasts 3 s)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (out, err)
    assert measured() == [("run-test/client-007|onnx|fp32|local|t1|r0",)]

    make_artifact(art, seed=1)  # exported again: another model under the same name
    second_sha = sha256_file(art / "model.onnx")
    assert second_sha != first_sha

    again = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=root, timeout=300)
    # the old code measured r1 from the new file and pooled both into one setting (reps 2)
    assert again.returncode == 2, (again.stdout, again.stderr)
    [line] = [ln for ln in again.stderr.splitlines() if ln.strip()]
    assert (f"run-test/client-007 onnx/fp32 on local with 1 thread(s) was measured from model file sha256 "
            f"{first_sha[:12]}… (1 repetition(s)), but {art / 'model.onnx'} is now {second_sha[:12]}…") in line
    assert "Traceback" not in again.stderr
    con = sqlite3.connect(db)
    assert con.execute("SELECT job_id, artifact_sha256 FROM measurements").fetchall() == [
        ("run-test/client-007|onnx|fp32|local|t1|r0", first_sha)]
    con.close()


# -- the campaign's checks, with an injected benchmark that reports the manifest's digest ------------------------
def _campaign(tmp_path, repetitions: int):
    import tomllib

    import profiling_fakes as pf
    from edgemask.profiling.campaign import parse_campaign

    ws = tmp_path / "ws"
    if not ws.exists():
        pf.small_workspace(ws, clients=("client-000",))
    toml = pf.campaign_toml(devices=("dev-a",), formats=("onnx",), repetitions=repetitions)
    return ws, parse_campaign(tomllib.loads(toml.replace('clients = "all"\ndense = true', 'clients = "all"\n'
                                                                                            'dense = false')))


def _bench(digest_of):
    import profiling_fakes as pf

    def bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
        return pf.fake_measurement(spec, artifact_dir, fmt, variant, settings,
                                   artifact_sha256=digest_of(artifact_dir, fmt, variant))
    return bench


def _manifest_digest(artifact_dir, fmt, variant):
    from edgemask.manifest import load_manifest

    return load_manifest(artifact_dir).file_for(fmt, variant, where=artifact_dir).sha256


def _run(ws, cfg, bench):
    import profiling_fakes as pf
    from edgemask.profiling.campaign import run_campaign

    return run_campaign(cfg, ws, benchmark=bench, progress=False, inventory=pf.fleet("dev-a"),
                        connect=pf.FakeConnect())


def _reexport(ws) -> tuple[str, str]:
    """Export client-000's files again with other bytes, manifest true to them: the ONNX's (old, new) sha256."""
    import hashlib
    import json

    art = ws / "artifacts" / "run-a" / "client-000"
    doc = json.loads((art / "manifest.json").read_text())
    old = new = ""
    for f in doc["files"]:
        data = (art / f["file"]).read_bytes() + b"exported again"
        (art / f["file"]).write_bytes(data)
        if f["format"] == "onnx":
            old, new = f["sha256"], hashlib.sha256(data).hexdigest()
        f["sha256"], f["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (art / "manifest.json").write_text(json.dumps(doc))
    return old, new


def test_a_resume_with_another_file_is_refused_before_anything_is_measured(tmp_path):
    from edgemask.errors import EdgemaskError

    ws, cfg = _campaign(tmp_path, repetitions=1)
    assert _run(ws, cfg, _bench(_manifest_digest)).complete
    was, now = _reexport(ws)
    ws, cfg2 = _campaign(tmp_path, repetitions=2)  # one more repetition, of the changed file
    calls = []
    with pytest.raises(EdgemaskError, match=rf"run-a/client-000 onnx/fp32 on dev-a with 1 thread\(s\) was measured "
                                            rf"from model file sha256 {was[:12]}… \(1 repetition\(s\)\), but "
                                            rf".*model\.fp32\.onnx is now {now[:12]}… \(exported again since\?\)"):
        _run(ws, cfg2, _bench(lambda *a: calls.append(a) or now))
    assert calls == []
    # a finished setting pools nothing new: its campaign run again is not refused
    assert _run(ws, cfg, _bench(_manifest_digest)).already_done == 1


def test_a_file_changed_during_the_campaign_fails_that_job_instead_of_pooling_it(tmp_path):
    ws, cfg = _campaign(tmp_path, repetitions=2)
    digests = iter([A, B])  # r0 measured file A, then the file changed before r1 was deployed
    res = _run(ws, cfg, _bench(lambda *a: next(digests)))
    assert len(res.recorded) == 1 and [f.job.repetition for f in res.failed] == [1]
    assert "the artifact changed during the campaign" in res.failed[0].reason
    with ResultsStore.open(res.store_path) as store:
        assert store.setting_digests() == {("run-a/client-000", "onnx", "fp32", "dev-a", 1): {A: 1}}
        [(digest,)] = store._read("SELECT artifact_sha256 FROM failures")
    assert digest == B  # the refused repetition is kept in the history, with its file
