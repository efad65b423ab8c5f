"""Device traces: FedScale's client_device_capacity reads back as FedScale reads it; edgemask's trace is
checked against its digest."""

import os
import pickle

import pandas as pd
import pytest
from test_ledger import RESULTS, _runs

from edgemask.errors import ConfigError, CorruptFileError
from edgemask.profiling.ledger import ledger_frame
from edgemask.profiling.trace import FEDSCALE_FILE, read_trace, write_traces


def _fedscale_load_client_profile(file_path):
    """FedScale's ``Aggregator.load_client_profile`` (fedscale/cloud/aggregation/aggregator.py), as it reads the
    file: ``pickle.load`` of the whole dict."""
    global_client_profile = {}
    if os.path.exists(file_path):
        with open(file_path, "rb") as fin:
            global_client_profile = pickle.load(fin)
    return global_client_profile


def _fedscale_register(client_profiles, n_clients):
    """FedScale's ``client_register_handler``: its k-th client (k from 1) gets the profile keyed
    ``k % len(profiles)``, the default 1.0 / 1.0 when absent; ``ClientMetadata`` reads ``speed['computation']``
    and ``speed['communication']``."""
    out = {}
    for num_of_clients in range(n_clients):
        mapped_id = (num_of_clients + 1) % len(client_profiles) if len(client_profiles) > 0 else 1
        speed = client_profiles.get(mapped_id, {"computation": 1.0, "communication": 1.0})
        out[num_of_clients + 1] = (speed["computation"], speed["communication"])
    return out


def _traces(tmp_path, **kw):
    ledger, _ = ledger_frame(RESULTS, _runs())
    dirs, notes = write_traces(tmp_path, ledger, RESULTS, **kw)
    return dirs, notes


def test_fedscale_reads_the_measured_costs(tmp_path):
    (d,), notes = _traces(tmp_path, bandwidth_kbps=5000.0)
    assert d == tmp_path / "traces" / "dev-onnx-fp32-t1" and notes == []
    profiles = _fedscale_load_client_profile(d / "fedscale" / "run-m" / FEDSCALE_FILE)
    # the model FedMask trains is its dense network: run-m/dense's p50 10 ms, for each of its 3 measured clients
    assert profiles == {1: {"computation": 10.0, "communication": 5000.0},
                        2: {"computation": 10.0, "communication": 5000.0},
                        3: {"computation": 10.0, "communication": 5000.0}}
    assert all(type(k) is int and type(v["computation"]) is float for k, v in profiles.items())
    assert _fedscale_register(profiles, 2) == {1: (10.0, 5000.0), 2: (10.0, 5000.0)}
    trace, meta = read_trace(d)
    m = trace[trace["run_id"] == "run-m"].set_index("client_id")
    # own trace: both costs, energy per sample of each, where they came from
    assert m.loc["client-000", ["computation_ms", "inference_ms", "train_energy_mj", "inference_energy_mj"]
                 ].tolist() == [10.0, 4.0, 5.0, 2.0]
    assert m.loc["client-000", "train_artifact"] == "run-m/dense"
    assert m.loc["client-002", "inference_verdict"] == "INVALID"
    assert m["fedscale_id"].tolist() == [1, 2, 3]
    assert (meta["device"], meta["format"], meta["bandwidth_kbps"], meta["train_model"]) == ("dev", "onnx", 5000.0,
                                                                                             "dense")
    assert "ms per sample" in meta["fedscale"]["computation"]


def test_compacted_train_model_takes_the_clients_own_latency(tmp_path):
    (d,), _ = _traces(tmp_path, train_model="compacted")
    profiles = _fedscale_load_client_profile(d / "fedscale" / "run-m" / FEDSCALE_FILE)
    assert [profiles[i]["computation"] for i in (1, 2, 3)] == [4.0, 6.0, 3.0]
    with pytest.raises(ConfigError, match="train model"):
        _traces(tmp_path, train_model="sparse")


def test_a_changed_trace_is_refused(tmp_path):
    (d,), _ = _traces(tmp_path)
    t = pd.read_parquet(d / "trace.parquet")
    t.loc[0, "computation_ms"] = 0.001
    t.to_parquet(d / "trace.parquet")
    with pytest.raises(CorruptFileError, match="trace.parquet: sha256"):
        read_trace(d)
    (d / "trace.json").write_text("{")
    with pytest.raises(CorruptFileError, match="trace.json: unreadable"):
        read_trace(d)
    with pytest.raises(CorruptFileError, match="no trace here"):
        read_trace(tmp_path)
