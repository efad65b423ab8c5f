"""A FedScale device trace as a run's device mix (``[system.trace]``, trainer/system.py, issue #46): each device's
round is FedScale's completion time of its trace client, and with an availability trace a device offline at the
round's start does not train and one offline when its upload would arrive is lost — by hand on a small trace written
in FedScale's format."""

from __future__ import annotations

import hashlib
import json
import pickle
import tomllib
from pathlib import Path

import pytest

from edgemask.cli.main import main
from edgemask.errors import ConfigError
from edgemask.mix import assign_trace_clients
from edgemask.tomlio import dumps_toml
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.simulation import simulate

REPO = Path(__file__).resolve().parents[2]
DEVICES = ["client-000", "client-001", "client-002", "client-003"]
# FedScale's client_device_capacity: ms per sample (one inference) and kbit/s; client 2 is a slow phone
CAPACITY = {1: {"computation": 1.0, "communication": 800.0}, 2: {"computation": 1000.0, "communication": 800.0},
            3: {"computation": 1.0, "communication": 800.0}, 4: {"computation": 1.0, "communication": 800.0}}
# FedScale's client_behave_trace: 10 always there, 11 comes online at 5 s, 12 leaves at 0.1 s, 13 always there
BEHAVE = {10: {"duration": 100, "inactive": [1e9], "finish_time": 2e9, "active": [0], "model": "a"},
          11: {"duration": 100, "inactive": [1e9], "finish_time": 2e9, "active": [5], "model": "b"},
          12: {"duration": 100, "inactive": [0.1], "finish_time": 1e6, "active": [0], "model": "c"},
          13: {"duration": 100, "inactive": [1e9], "finish_time": 2e9, "active": [0], "model": "d"}}


def write(path: Path, data: dict) -> Path:
    path.write_bytes(pickle.dumps(data, protocol=4))
    return path


def config_dict(system: dict | None, rounds: int = 2) -> dict:
    d = tomllib.loads((REPO / "configs" / "digits-fedavg.toml").read_text())
    d["training"].update(rounds=rounds, local_epochs=1)
    d["data"]["num_clients"] = 4
    if system is not None:
        d["system"] = system
    return d


def config(system: dict | None, rounds: int = 2) -> TrainConfig:
    return TrainConfig.from_dict(config_dict(system, rounds), "t.toml")


def traced(tmp_path: Path, capacity: dict = CAPACITY, behave: dict | None = BEHAVE, **kw) -> dict:
    trace = {"capacity": str(write(tmp_path / "client_device_capacity", capacity))}
    if behave is not None:
        trace["availability"] = str(write(tmp_path / "client_behave_trace", behave))
    return {"deadline_s": 10.0, **kw, "trace": trace}


def history(result) -> dict[tuple[int, str, str], float]:
    return {(r["round"], r["client"], r["metric"]): r["value"] for r in result.history}


def test_the_seeds_draw_is_the_trace_clients_this_test_reads_by_hand():
    """Seed 0 gives the devices these trace clients (edgemask.mix.assign_trace_clients): the cases below follow."""
    assert assign_trace_clients(DEVICES, list(CAPACITY), 0, 0, "f") == {
        "client-000": 4, "client-001": 2, "client-002": 1, "client-003": 3}
    assert assign_trace_clients(DEVICES, list(BEHAVE), 0, 1, "f") == {
        "client-000": 12, "client-001": 13, "client-002": 11, "client-003": 10}


def test_a_trace_decides_who_trains_who_is_lost_and_the_rounds_times(tmp_path):
    """Four devices, K = 4, deadline 10 s. Each trained device's round is 3 × samples × ms/sample ÷ 1000 plus its
    bytes at its kbit/s: client-003 (capacity 3, always there) trains its 270 samples in 3 × 270 × 1 ms = 0.81 s
    and moves 2 × 68,904 B (the 64-128-64-10 MLP's 17,226 floats) at 800 kbit/s in 1.37808 s.

    round 0, clock 0: client-002 (availability 11) is offline: it does not train. client-000 (12) trains, but its
    2.19 s round ends after its 0.1 s online: lost. client-001 (capacity 2, 1000 ms a sample) misses the deadline.
    One of K arrived: the round waits to the deadline, 10 s.
    round 1, clock 10 s: client-002 is online now (from 5 s), client-000 is not (it left at 0.1 s): three train,
    client-001 is late again: 10 s."""
    res = simulate(config(traced(tmp_path)))
    h = history(res)
    assert h[(0, "client-003", "samples_seen")] == 270 and h[(0, "client-003", "bytes_up")] == 68_904
    assert h[(0, "client-003", "compute_s")] == pytest.approx(0.81)
    assert h[(0, "client-003", "comm_s")] == pytest.approx(1.37808)
    assert h[(0, "client-003", "local_round_s")] == pytest.approx(2.18808)
    for (rnd, cid, metric), v in h.items():  # every trained device: FedScale's completion time from its own rows
        if metric == "local_round_s":
            cap = CAPACITY[res.summary["system"]["trace"]["device_clients"][cid]["capacity"]]
            want = (3 * h[(rnd, cid, "samples_seen")] * cap["computation"] / 1000
                    + (h[(rnd, cid, "bytes_up")] + h[(rnd, cid, "bytes_down")]) * 8 / (cap["communication"] * 1000))
            assert v == pytest.approx(want, rel=1e-12), (rnd, cid)
    # offline at the round's start: no training rows at all, only dropped and offline
    assert (0, "client-002", "samples_seen") not in h and (1, "client-000", "samples_seen") not in h
    assert (1, "client-002", "samples_seen") in h
    dropped = {(r, c): h[(r, c, "dropped")] for r in (0, 1) for c in DEVICES}
    offline = {(r, c): h[(r, c, "offline")] for r in (0, 1) for c in DEVICES if (r, c, "offline") in h}
    assert dropped == {(0, "client-000"): 1, (0, "client-001"): 1, (0, "client-002"): 1, (0, "client-003"): 0,
                       (1, "client-000"): 1, (1, "client-001"): 1, (1, "client-002"): 0, (1, "client-003"): 0}
    assert offline == {(0, "client-000"): 1, (0, "client-001"): 0, (0, "client-002"): 1, (0, "client-003"): 0,
                       (1, "client-000"): 1, (1, "client-001"): 0, (1, "client-002"): 0, (1, "client-003"): 0}
    assert [h[(r, "server", "round_time_s")] for r in (0, 1)] == [10.0, 10.0]
    assert [h[(r, "server", "devices_dropped")] for r in (0, 1)] == [3, 2]
    assert [h[(r, "server", "devices_offline")] for r in (0, 1)] == [2, 1]
    assert [h[(r, "server", "devices_selected")] for r in (0, 1)] == [4, 4]
    s = res.summary["system"]
    assert s["dropped_per_board"] == {"fedscale-2": 2, "fedscale-4": 2, "fedscale-1": 1}
    assert s["offline_per_board"] == {"fedscale-4": 2, "fedscale-1": 1}
    assert s["device_boards"] == {"client-000": "fedscale-4", "client-001": "fedscale-2", "client-002": "fedscale-1",
                                  "client-003": "fedscale-3"}
    t = s["trace"]  # every stored number traces to the bytes it came from
    assert t["capacity_sha256"] == hashlib.sha256((tmp_path / "client_device_capacity").read_bytes()).hexdigest()
    assert t["availability_sha256"] == hashlib.sha256((tmp_path / "client_behave_trace").read_bytes()).hexdigest()
    assert (t["capacity_clients"], t["availability_clients"], t["augmentation"]) == (4, 4, 3.0)


def test_without_an_availability_trace_everyone_trains_and_the_round_ends_with_the_kth(tmp_path):
    """Capacity only, K = ⌊4 · 0.5⌋ = 2 with over-commitment 1 (all four selected): the two fastest are kept and the
    round ends with the second of them; no offline rows."""
    d = config_dict(traced(tmp_path, behave=None, over_commit=1.0), rounds=1)
    d["training"]["participation"] = 0.5
    res = simulate(TrainConfig.from_dict(d, "t.toml"))
    h = history(res)
    rounds = {c: h[(0, c, "local_round_s")] for c in DEVICES}
    kept = sorted(DEVICES, key=lambda c: (rounds[c], c))[:2]
    assert sorted(c for c in DEVICES if h[(0, c, "dropped")] == 0) == sorted(kept)
    assert h[(0, "server", "round_time_s")] == sorted(rounds.values())[1]
    assert not any(m in ("offline", "devices_offline") for (_, _, m) in h)
    assert "offline_per_board" not in res.summary["system"]


def test_the_same_trace_as_json_trains_the_same_run(tmp_path):
    pickled = simulate(config(traced(tmp_path)))
    js = {"capacity": str(tmp_path / "cap.json"), "availability": str(tmp_path / "behave.json")}
    (tmp_path / "cap.json").write_text(json.dumps(CAPACITY))
    (tmp_path / "behave.json").write_text(json.dumps(BEHAVE))
    again = simulate(config({"deadline_s": 10.0, "trace": js}))
    assert again.history == pickled.history


def test_the_trace_section_round_trips_through_the_written_config(tmp_path):
    cfg = config(traced(tmp_path, over_commit=0.25))
    assert "bandwidth_kbps" not in cfg.to_dict()["system"] and "boards" not in cfg.to_dict()["system"]
    again = TrainConfig.from_dict(tomllib.loads(cfg.to_toml()), "config.toml")
    assert again.system == cfg.system and again.system.trace.augmentation == 3.0


@pytest.mark.parametrize("system, words", [
    ({"deadline_s": 1.0, "trace": {}}, "[system.trace] capacity: missing"),
    ({"deadline_s": 1.0, "trace": {"capacity": ""}}, "[system.trace] capacity: is empty"),
    ({"deadline_s": 1.0, "trace": {"capacity": "c", "augmentation": 0}}, "[system.trace] augmentation: 0 is out of"),
    ({"deadline_s": 1.0, "trace": {"capacity": "c", "availabilty": "b"}}, "did you mean 'availability'?"),
    ({"deadline_s": 1.0, "trace": "c"}, "[system] trace: must be a table"),
    ({"deadline_s": 1.0, "trace": {"capacity": "c"}, "boards": {"a": {"share": 1.0, "step_ms": 1.0}}},
     "[system] boards: a device trace ([system.trace]) is the device mix; give boards or a trace, not both"),
    ({"deadline_s": 1.0, "bandwidth_kbps": 100.0, "trace": {"capacity": "c"}},
     "[system] bandwidth_kbps: the device trace gives each device its own"),
])
def test_a_bad_trace_section_is_one_line(system, words):
    with pytest.raises(ConfigError) as e:
        config(system)
    assert words in str(e.value) and str(e.value).startswith("t.toml: ")


def train_cli(tmp_path: Path, system: dict, capsys) -> tuple[int, str]:
    cfg = tmp_path / "t.toml"
    cfg.write_text(dumps_toml(config_dict(system, rounds=1)))
    code = main(["train", "--workspace", str(tmp_path / "ws"), "--config", str(cfg)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("trace, words", [
    (lambda p: {"capacity": str(p / "nope")}, "nope: no such file ([system.trace] capacity)"),
    (lambda p: {"capacity": str(write(p / "c", {1: {"computation": 1.0}}))}, "c: client 1: field communication "
                                                                             "missing"),
    (lambda p: {"capacity": str(write(p / "c", {k: CAPACITY[k] for k in (1, 2)}))},
     "c ([system.trace] capacity): 2 client(s), fewer than the run's 4 devices"),
    (lambda p: {"capacity": str(write(p / "c", CAPACITY)),
                "availability": str(write(p / "b", {k: BEHAVE[k] for k in (10, 11, 12)}))},
     "b ([system.trace] availability): 3 client(s), fewer than the run's 4 devices"),
    (lambda p: {"capacity": str(write(p / "c", CAPACITY)), "availability": str(write(p / "b", {10: [1, 2]}))},
     "b: client 10: its entry is [1, 2]"),
])
def test_train_refuses_a_bad_trace_in_one_line_and_writes_no_run(tmp_path, capsys, trace, words):
    code, err = train_cli(tmp_path, {"deadline_s": 1.0, "trace": trace(tmp_path)}, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("edgemask train: error: "), err
    assert words in err and "Traceback" not in err
    assert not (tmp_path / "ws" / "runs" / "digits-fedavg" / "summary.json").exists()
