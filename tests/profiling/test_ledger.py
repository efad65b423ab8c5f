"""clients.parquet: a small FedMask run and a FedAvg run joined by hand, and the Pareto front."""

import json

import numpy as np
import pandas as pd

from edgemask.profiling.ledger import (
    RunRecord,
    client_training,
    ledger_frame,
    pareto_front,
    read_run,
    write_ledger,
)
from edgemask.profiling.trace import read_trace

SETTING = {"device": "dev", "format": "onnx", "variant": "fp32", "threads": 1}


def _result(run, client, kind, algo, p50, valid=True, **kw):
    return {"run_id": run, "client_id": client, "artifact": f"{run}/{client}", "kind": kind, "algorithm": algo,
            "model": "mlp", "dataset": "digits", **SETTING, "p50_ms": p50, "p90_ms": p50 * 1.5,
            "energy_mj": p50 / 2, "peak_rss_kb": 3000.0, "verdict": "VALID" if valid else "INVALID",
            "valid": valid, "accuracy": 1.0, "params_compacted": 100, "model_bytes": 400,
            "artifact_sha256": f"sha-{client}", **kw}


RESULTS = pd.DataFrame([
    _result("run-m", "dense", "dense", "fedmask", 10.0),
    _result("run-m", "client-000", "compacted", "fedmask", 4.0),
    _result("run-m", "client-001", "compacted", "fedmask", 6.0),
    _result("run-m", "client-002", "compacted", "fedmask", 3.0, valid=False),  # would dominate both if VALID
    _result("run-a", "dense", "dense", "fedavg", 10.0),
])
SUMMARY_M = {"clients": {
    "client-000": {"accuracy": 0.80, "accuracies": {"local_mask": 0.85, "returned_mask": 0.80}},
    "client-001": {"accuracy": 0.90, "accuracies": {"local_mask": 0.92, "returned_mask": 0.90}},
    "client-002": {"accuracy": 0.95, "accuracies": {"local_mask": 0.95, "returned_mask": 0.95}},
    "client-003": {"accuracy": 0.70, "accuracies": {"local_mask": 0.70, "returned_mask": 0.70}}}}
SUMMARY_A = {"clients": {"client-000": {"accuracy": 0.60}, "client-001": {"accuracy": 0.65}}}


def _history(clients):
    rows = []
    for c in clients:
        for rnd, up, kept in ((0, 10, 90), (1, 20, 80)):
            rows += [(rnd, c, "bytes_up", up), (rnd, c, "bytes_down", 5), (rnd, c, "samples_seen", 32),
                     (rnd, c, "flops_fwd", 100), (rnd, c, "flops_bwd", 200), (rnd, c, "flops_fwd_structured", 50),
                     (rnd, c, "flops_bwd_structured", 100), (rnd, c, "params_kept", kept)]
    rows.append((1, "server", "mean_accuracy", 0.5))
    return pd.DataFrame(rows, columns=["round", "client", "metric", "value"])


def _runs():
    return {"run-m": RunRecord("run-m", SUMMARY_M, _history(["client-000", "client-001", "client-002"])),
            "run-a": RunRecord("run-a", SUMMARY_A, _history(["client-000", "client-001"]))}


def test_join_by_hand():
    ledger, notes = ledger_frame(RESULTS, _runs())
    # run-m: its three measured clients (not its dense baseline); run-a (no client artifact): both clients on dense
    assert list(zip(ledger["run_id"], ledger["client_id"], ledger["measured_model"])) == [
        ("run-a", "client-000", "dense"), ("run-a", "client-001", "dense"),
        ("run-m", "client-000", "compacted"), ("run-m", "client-001", "compacted"),
        ("run-m", "client-002", "compacted")]
    assert notes == ["run run-m: no measured artifact for client(s) client-003: not in clients.parquet"]
    m0 = ledger.set_index(["run_id", "client_id"]).loc[("run-m", "client-000")]
    # accuracy per mask, named; the device's sample_io accuracy apart
    assert (m0["accuracy"], m0["accuracy_local_mask"], m0["accuracy_returned_mask"]) == (0.80, 0.85, 0.80)
    assert m0["device_accuracy"] == 1.0
    # sums over its two rounds: bytes 10 + 20 up, 5 + 5 down; FLOPs (100 + 200) × 2 and (50 + 100) × 2
    assert (m0["bytes_up"], m0["bytes_down"], m0["samples_seen"], m0["rounds_trained"]) == (30, 10, 64, 2)
    assert (m0["flops_train"], m0["flops_train_structured"]) == (600, 300)
    assert m0["params_kept"] == 80  # the last round's, not the first's nor a sum
    assert (m0["artifact"], m0["p50_ms"], m0["p90_ms"], m0["energy_mj"]) == ("run-m/client-000", 4.0, 6.0, 2.0)
    assert (m0["artifact_sha256"], m0["verdict"], m0["model_bytes"]) == ("sha-client-000", "VALID", 400)
    a1 = ledger.set_index(["run_id", "client_id"]).loc[("run-a", "client-001")]
    assert (a1["accuracy"], a1["artifact"], a1["p50_ms"]) == (0.65, "run-a/dense", 10.0)
    assert np.isnan(a1["accuracy_local_mask"])  # FedAvg reports one accuracy
    # front among VALID settings: m/client-000 (0.80, 4 ms) and m/client-001 (0.90, 6 ms); FedAvg's dominated,
    # the INVALID m/client-002 left out though it would dominate both
    assert set(ledger.loc[ledger["on_front"], "artifact"]) == {"run-m/client-000", "run-m/client-001"}


def test_pareto_front_per_setting():
    df = pd.DataFrame({"device": ["d", "d", "d", "e"], "format": "onnx", "variant": "fp32", "threads": 1,
                       "accuracy": [0.9, 0.9, 0.5, 0.1], "p50_ms": [2.0, 3.0, 1.0, 9.0], "valid": True})
    # row 1 is as accurate as row 0 but slower: dominated; row 2 is the fastest; row 3 is alone on device e
    assert pareto_front(df).tolist() == [True, False, True, True]


def test_files_read_and_written(tmp_path):
    run = tmp_path / "runs" / "run-m"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(SUMMARY_M))
    _history(["client-000"]).to_parquet(run / "history.parquet")
    rec = read_run(tmp_path, "run-m")
    assert rec.summary == SUMMARY_M and client_training(rec.history, "client-000")["bytes_up"] == 30
    missing = read_run(tmp_path, "run-x")
    assert missing.summary is None and len(missing.notes) == 2 and "run-x" in missing.notes[0]
    ledger, _ = ledger_frame(RESULTS, _runs())
    path = write_ledger(tmp_path, ledger)
    pd.testing.assert_frame_equal(pd.read_parquet(path), ledger)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left behind


def test_report_writes_the_ledger_plot_and_traces(tmp_path):
    """`write_report` on a real store (test_report's campaign: run-a's dense baseline and client-000, one device)
    with the run's summary.json: clients.parquet, the Pareto PNG, the front named in summary.md, a trace."""
    from test_report import LENIENT, _campaign

    from edgemask.profiling.report import write_report

    ws, results = _campaign(tmp_path)
    (ws / "runs" / "run-a" / "summary.json").write_text(json.dumps(
        {"clients": {"client-000": {"accuracy": 0.75}, "client-001": {"accuracy": 0.5}}}))
    _, md_path = write_report(results, ws, rules=LENIENT)
    ledger = pd.read_parquet(results / "clients.parquet")
    row = ledger.iloc[0]
    assert len(ledger) == 1 and (row["client_id"], row["accuracy"], row["p50_ms"]) == ("client-000", 0.75, 3.0)
    assert (row["bytes_up"], row["bytes_down"], row["rounds_trained"]) == (3000, 9000, 3)  # 3 rounds × 1000, 3000
    assert bool(row["on_front"])
    assert (results / "plots" / "accuracy_vs_latency.png").read_bytes().startswith(b"\x89PNG")
    md = md_path.read_text()
    assert "run-a/client-000 (75.0%, 3.000)" in md
    assert "no measured artifact for client(s) client-001" in md
    trace, _ = read_trace(results / "traces" / "dev-a-onnx-fp32-t1")
    assert trace[["client_id", "computation_ms", "inference_ms"]].values.tolist() == [["client-000", 10.0, 3.0]]
