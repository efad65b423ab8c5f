"""run_campaign with an injected benchmark: parallel devices, retries, recorded failures, resume."""

import dataclasses
import tomllib

import pytest

import profiling_fakes as pf
from edgemask.devices.records import Measurement
from edgemask.profiling.campaign import backoff_delay, parse_campaign, plan_jobs, run_campaign
from edgemask.profiling.store import ResultsStore


def _setup(tmp_path, **kw):
    ws = pf.small_workspace(tmp_path / "ws", clients=("client-000", "client-001"))
    return ws, parse_campaign(tomllib.loads(pf.campaign_toml(**kw)))


def _run(cfg, ws, bench, connect=None, devices=("dev-a", "dev-b"), **kw):
    return run_campaign(cfg, ws, benchmark=bench, progress=False, inventory=pf.fleet(*devices),
                        connect=connect or pf.FakeConnect(), **kw)


def test_devices_in_parallel_jobs_on_one_device_one_at_a_time(tmp_path):
    ws, cfg = _setup(tmp_path, repetitions=1)
    bench = pf.FakeBenchmark(sleep_s=0.05)
    res = _run(cfg, ws, bench)
    assert res.complete and res.planned == 12 and len(res.recorded) == 12
    assert bench.max_active == {"dev-a": 1, "dev-b": 1}
    assert bench.max_total == 2
    with ResultsStore.open(res.store_path) as store:
        assert store.done_job_ids() == {j.job_id for j in plan_jobs(cfg, ws)}
        # the settings reach the benchmark: threads from the job, runner settings from the config
        for job, m in store.measurements():
            assert m.threads == job.threads and m.device == job.device
    assert res.store_path == ws / "results" / "camp" / "results.sqlite"


def test_device_error_is_retried_over_a_fresh_connection(tmp_path):
    ws, cfg = _setup(tmp_path, devices=("dev-a",), repetitions=1, retries=2)
    only = lambda artifact, fmt: artifact == "run-a/client-001" and fmt == "pte"  # noqa: E731
    bench = pf.FakeBenchmark(fail_first=2, fail_when=only)
    conn = pf.FakeConnect()
    res = _run(cfg, ws, bench, conn, devices=("dev-a",))
    assert res.complete and not res.failed
    assert bench.failures == 2
    assert conn.opened == 3 and conn.closed == 3  # dropped after each fault, closed at the end
    df = ResultsStore.open(res.store_path).to_dataframe().set_index("job_id")
    assert df.loc["run-a/client-001|pte|fp32|dev-a|t1|r0", "attempts"] == 3
    assert df.loc["run-a/client-000|pte|fp32|dev-a|t1|r0", "attempts"] == 1


def test_exhausted_retries_are_recorded_and_the_campaign_goes_on_then_resumes(tmp_path):
    ws, cfg = _setup(tmp_path, repetitions=2, retries=1)
    only = lambda artifact, fmt: artifact == "run-a/client-001" and fmt == "pte"  # noqa: E731
    bench = pf.FakeBenchmark(fail_first=10**6, fail_when=only)
    res = _run(cfg, ws, bench)
    failed_ids = {f.job.job_id for f in res.failed}
    # client-001/pte on 2 devices × 2 repetitions, each tried 1 + 1 times
    assert len(failed_ids) == 4 and all(f.attempts == 2 for f in res.failed)
    assert all("connection reset by peer" in f.reason for f in res.failed)
    assert len(res.recorded) == res.planned - 4 and not res.complete
    with ResultsStore.open(res.store_path) as store:
        fails = store.failures()
        assert set(fails["job_id"]) == failed_ids and (fails["attempts"] == 2).all()
        assert failed_ids.isdisjoint(store.done_job_ids())

    healthy = pf.FakeBenchmark()
    again = _run(cfg, ws, healthy)
    assert set(again.recorded) == failed_ids  # exactly the missing ones
    assert again.already_done == res.planned - 4 and again.complete
    assert len(healthy.calls) == 4
    with ResultsStore.open(res.store_path) as store:
        assert store.failures().empty  # resolved
        assert len(store.failures(unresolved=False)) == 4  # history kept


def test_host_key_error_stops_that_device_only(tmp_path):
    ws, cfg = _setup(tmp_path, repetitions=1, retries=3)
    bench = pf.FakeBenchmark(fail_first=1, exc_type=pf.HostKeyError,
                             fail_when=lambda artifact, fmt: True)
    # only the very first call fails; whichever device makes it stops
    res = _run(cfg, ws, bench)
    [device] = res.aborted
    assert "HostKeyError" in res.aborted[device]
    assert len(res.failed) == 1 and res.failed[0].attempts == 1  # never retried
    assert sum(1 for c in bench.calls if c[0] == device) == 1
    other = "dev-b" if device == "dev-a" else "dev-a"
    assert sum(1 for j in res.recorded if f"|{other}|" in j) == 6
    assert not res.complete


def _refusing(calls):
    def bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
        calls.append(fmt)
        return Measurement(device=spec.name, artifact="x", format=fmt, variant=variant, threads=1, ok=False,
                           error="output check failed: max abs diff 0.3", latency_ms=(7.0,))
    return bench


def test_a_runner_failure_is_stored_counted_failed_and_not_retried_in_the_run(tmp_path):
    # the old code counted these 6 as measured ("6 measured, 0 failed", exit 0) and never ran them again
    ws, cfg = _setup(tmp_path, devices=("dev-a",), repetitions=1, retries=3)
    calls = []
    res = _run(cfg, ws, _refusing(calls), devices=("dev-a",))
    assert len(calls) == 6 and len(res.recorded) == 0 and len(res.failed) == 6 and not res.complete
    assert {f.status for f in res.failed} == {"failed"} and all(f.attempts == 1 for f in res.failed)
    with ResultsStore.open(res.store_path) as store:
        df = store.to_dataframe()
        assert (~df["ok"]).all() and df["error"].str.contains("output check failed").all()
        assert store.done_job_ids() == set()
        assert set(store.job_status().values()) == {"failed"}


def test_failed_jobs_are_rerun_on_resume_and_given_up_after_retries_runs(tmp_path):
    ws, cfg = _setup(tmp_path, devices=("dev-a",), repetitions=1, retries=1)
    calls = []
    first = _run(cfg, ws, _refusing(calls), devices=("dev-a",))
    second = _run(cfg, ws, _refusing(calls), devices=("dev-a",))  # failed once <= retries: run again
    assert len(calls) == 12 and len(second.failed) == 6 and second.already_done == 0
    third = _run(cfg, ws, _refusing(calls), devices=("dev-a",))  # failed in 2 runs > retries = 1: given up
    assert len(calls) == 12 and {f.status for f in third.failed} == {"given up"} and not third.complete
    assert "failed in 2 runs" in third.failed[0].reason
    with ResultsStore.open(first.store_path) as store:
        assert store.failed_runs() == {j: 2 for j in store.job_status()}
        assert len(store.superseded()) == 6  # the first run's rows, kept when the second replaced them
        assert len(store.measurements()) == 6  # one current row per job, never two

    healthy = pf.FakeBenchmark()  # raising retries lets a fixed board try them again
    fixed = _run(dataclasses.replace(cfg, retries=2), ws, healthy, devices=("dev-a",))
    assert fixed.complete and len(fixed.recorded) == 6 and len(healthy.calls) == 6
    with ResultsStore.open(first.store_path) as store:
        rows = store.measurements()
        assert len(rows) == 6 and all(m.ok for _, m in rows)  # the good ones replaced the failed rows
        assert len(store.superseded()) == 12  # every failed sample is still there
        assert len(_run(cfg, ws, healthy, devices=("dev-a",)).recorded) == 0  # measured is final
        assert store.failures().empty  # all resolved


def test_resume_runs_only_missing_jobs(tmp_path):
    ws, cfg = _setup(tmp_path, repetitions=1)
    jobs = plan_jobs(cfg, ws)
    with ResultsStore.open(cfg.results_dir(ws) / "results.sqlite") as store:
        for job in jobs[::3]:
            store.record(job, Measurement(device=job.device, artifact=job.artifact, format=job.format,
                                          variant=job.variant, threads=job.threads, ok=True, latency_ms=(1.0,)))
    bench = pf.FakeBenchmark()
    res = _run(cfg, ws, bench)
    assert res.already_done == len(jobs[::3])
    assert set(res.recorded) == {j.job_id for j in jobs} - {j.job_id for j in jobs[::3]}
    assert len(bench.calls) == len(jobs) - len(jobs[::3])


def test_a_bug_in_the_benchmark_is_not_swallowed(tmp_path):
    ws, cfg = _setup(tmp_path, repetitions=1)

    def bench(*a, **k):
        raise ValueError("bug")

    with pytest.raises(ValueError, match="bug"):
        _run(cfg, ws, bench)


def test_backoff_grows_with_jitter():
    import random

    rng = random.Random(0)
    delays = [backoff_delay(a, 1.0, rng=rng) for a in range(4)]
    for a, d in enumerate(delays):
        assert 0.5 * 2**a <= d < 1.5 * 2**a
    assert backoff_delay(10, 1.0, cap_s=5.0, rng=rng) < 7.5


def test_an_unstable_repetition_is_measured_again_and_its_attempts_kept(tmp_path):
    """remeasure_unstable = 2: a repetition whose own CV exceeds 10 % is measured again (at most twice); the
    dropped attempts stay in the store (superseded, status unstable) and are counted per setting."""
    ws = pf.small_workspace(tmp_path / "ws", clients=("client-000", "client-001"))
    text = pf.campaign_toml(devices=("dev-a",), formats=("onnx",), repetitions=1)
    cfg = parse_campaign(tomllib.loads(text.replace("retries = 2", "retries = 2\nremeasure_unstable = 2")))
    assert cfg.remeasure_unstable == 2
    noisy = (4.0, 4.0, 4.0, 4.0, 8.0)  # mean 4.8, sample std 1.79: CV 37 %
    calls: dict[str, int] = {}

    def bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
        artifact = f"{artifact_dir.parent.name}/{artifact_dir.name}"
        calls[artifact] = calls.get(artifact, 0) + 1
        # client-000: noisy once, then steady; client-001: noisy every time; dense: steady
        bad = (artifact.endswith("client-000") and calls[artifact] == 1) or artifact.endswith("client-001")
        return pf.fake_measurement(spec, artifact_dir, fmt, variant, settings,
                                   **({"latency_ms": noisy} if bad else {}))

    res = _run(cfg, ws, bench, devices=("dev-a",))
    assert res.complete and calls == {"run-a/dense": 1, "run-a/client-000": 2, "run-a/client-001": 3}
    with ResultsStore.open(res.store_path) as store:
        dropped = store.superseded()
        df = store.to_dataframe().set_index("artifact")
    assert sorted(job.artifact for job, _ in dropped) == ["run-a/client-000", "run-a/client-001",
                                                          "run-a/client-001"]
    assert all(m.latency_ms == noisy for _, m in dropped)
    assert df["unstable_attempts"].to_dict() == {"run-a/dense": 0, "run-a/client-000": 1, "run-a/client-001": 2}
    assert df.loc["run-a/client-000", "latency_ms"] != list(noisy)  # the steady attempt is the result
    assert df.loc["run-a/client-001", "latency_ms"] == list(noisy)  # out of attempts: the last one stands
    # without the setting, nothing is measured twice
    ws2, cfg2 = _setup(tmp_path / "plain", devices=("dev-a",), formats=("onnx",), repetitions=1)
    calls.clear()
    assert _run(cfg2, ws2, bench, devices=("dev-a",)).complete and set(calls.values()) == {1}
