"""``edgemask report`` writes tidy tables beside the store that ``pandas.read_parquet`` alone reads back."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import profiling_fakes as pf
from edgemask.devices.records import Measurement
from edgemask.profiling.campaign import parse_campaign, plan_jobs, read_manifest
from edgemask.profiling.report import write_report
from edgemask.profiling.store import ResultsStore

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts.md"
ID_COLUMNS = ["run_id", "client_id", "algorithm", "kind", "model", "dataset", "format", "variant", "device",
              "threads", "artifact"]


def _campaign(tmp_path):
    """Two clients and the dense baseline, two formats, two devices, two repetitions: 24 jobs with samples of
    their own (different counts, float values no formula rebuilds), power on dev-a only, one failed job."""
    ws = pf.small_workspace(tmp_path / "ws")
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(repetitions=2)))
    results = cfg.results_dir(ws)
    rng = np.random.default_rng(7)
    with ResultsStore.open(results / "results.sqlite") as store:
        store.save_campaign(cfg)
        store.save_artifacts(read_manifest(ws / "artifacts" / "run-a" / c / "manifest.json")
                             for c in ("dense", "client-000", "client-001"))
        for i, job in enumerate(plan_jobs(cfg, ws)):
            ids = dict(device=job.device, artifact=job.artifact, format=job.format, variant=job.variant,
                       threads=job.threads)
            if i == 5:
                store.record(job, Measurement(ok=False, error="runner exited with rc=137 and no result", **ids))
                continue
            power = tuple(rng.uniform(2, 5, int(rng.integers(3, 9)))) if job.device == "dev-a" else ()
            store.record(job, Measurement(
                ok=True, latency_ms=tuple(rng.lognormal(0, 0.1, int(rng.integers(50, 80)))), timed_window_s=1.1,
                inferences_per_sample=1 + i % 3,
                output_check_passed=True, power_w=power, power_source="ina3221:VDD_IN" if power else None,
                idle_power_w=2.0, energy_missing_reason=None if power else "no power sensor", **ids))
    return ws, results


@pytest.mark.slow
def test_samples_parquet_round_trips_every_sample_in_the_store(tmp_path):
    ws, results = _campaign(tmp_path)
    write_report(results, ws)
    samples = pd.read_parquet(results / "samples.parquet")
    with ResultsStore.open(results / "results.sqlite") as store:
        measured = store.measurements()
    expected = [(job.job_id, metric, i, value)
                for job, m in measured for metric, values in (("latency_ms", m.latency_ms), ("power_w", m.power_w))
                for i, value in enumerate(values)]
    assert len(samples) == len(expected) > 1000
    got = sorted(samples[["job_id", "metric", "sample", "value"]].itertuples(index=False, name=None))
    assert got == sorted(expected)  # every value bit for bit
    # each row names its artifact and setting
    by_job = {job.job_id: job for job, _ in measured}
    for row in samples.drop_duplicates("job_id").itertuples():
        job = by_job[row.job_id]
        assert (row.artifact, row.format, row.variant, row.device, row.threads, row.repetition) == (
            job.artifact, job.format, job.variant, job.device, job.threads, job.repetition)
        assert row.inferences_per_sample == dict(measured)[job].inferences_per_sample
        assert (row.run_id, row.client_id) == tuple(job.artifact.split("/"))
        assert row.algorithm == "fedmask" and row.kind == ("dense" if row.client_id == "dense" else "compacted")
    assert samples.columns[:len(ID_COLUMNS)].tolist() == ID_COLUMNS


@pytest.mark.slow
def test_results_parquet_has_one_row_per_setting_with_its_verdict(tmp_path):
    ws, results = _campaign(tmp_path)
    write_report(results, ws, csv=True)
    table = pd.read_parquet(results / "results.parquet")
    assert len(table) == 3 * 2 * 2  # artifacts × formats × devices; repetitions pooled
    assert table.columns[:len(ID_COLUMNS)].tolist() == ID_COLUMNS
    assert not table.duplicated(["artifact", "format", "variant", "device", "threads"]).any()
    failed = table[table["n_failed"] == 1]
    assert len(failed) == 1 and failed["verdict"].iloc[0] == "INVALID"
    assert failed["reasons"].iloc[0].startswith(
        "failed: 1 of 2 repetition(s) failed: runner exited with rc=137 and no result")
    # lognormal(0, 0.1) has CV about 10 %: some settings pass, some do not; the table says which and why
    for row in table.itertuples():
        assert row.valid == (row.verdict == "VALID") == (row.reasons == "")
        assert ("high-cv" in row.invalid_rules) == (row.cv > 0.1)
    # pooled statistics: the runs of both repetitions
    with ResultsStore.open(results / "results.sqlite") as store:
        df = store.to_dataframe()
    one = table.iloc[0]
    g = df[(df["artifact"] == one["artifact"]) & (df["format"] == one["format"]) & (df["device"] == one["device"])]
    pooled = np.concatenate([np.asarray(x) for x in g["latency_ms"]])
    assert one["runs"] == len(pooled) and one["p50_ms"] == np.percentile(pooled, 50)
    # CSV on request: the same rows
    assert len(pd.read_csv(results / "results.csv")) == len(table)
    assert len(pd.read_csv(results / "samples.csv")) == len(pd.read_parquet(results / "samples.parquet"))


@pytest.mark.slow
def test_every_column_is_documented(tmp_path):
    ws, results = _campaign(tmp_path)
    write_report(results, ws)
    text = CONTRACTS.read_text()
    tidy = text[text.index("## Tidy tables"):]
    documented = set(re.findall(r"`([a-z0-9_]+)`", tidy))
    for name in ("results.parquet", "samples.parquet"):
        missing = set(pd.read_parquet(results / name).columns) - documented
        assert not missing, f"{name}: columns not in docs/contracts.md: {sorted(missing)}"
