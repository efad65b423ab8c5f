"""`edgemask report` times a run trained with [system] by its own rounds (issue #46): the in-loop round_time_s,
dropped updates per board and the time to accuracy read from the run's history, equal to it and, on a hand-built
case, to the hand's figures; a run without [system] reports as before.

The runs are real (digits, trained by the trainer, written with their digests); the campaign is the campaign code
with a benchmark that answers at once (as tests/profiling's other campaigns)."""

from __future__ import annotations

import json
import pickle
import tomllib
from pathlib import Path

import pandas as pd
import pytest

import profiling_fakes as pf
from edgemask.errors import CorruptFileError
from edgemask.profiling.report import in_loop_sections, write_report
from edgemask.profiling.rounds import read_rounds

CLIENTS = ("client-000", "client-001", "client-002", "client-003")
# two boards of two devices each: "fast" rounds take milliseconds, "slow" ones ~hours: with K = 4 and a 1 s deadline
# every round has 2 of 4 in time, so the server waits to the deadline and both slow devices' updates are dropped
BOARDS = {"deadline_s": 1.0, "bandwidth_kbps": 1e9,
          "boards": {"fast": {"share": 0.5, "step_ms": 1.0}, "slow": {"share": 0.5, "step_ms": 1e6}}}


def train(ws: Path, run_id: str, system: dict | None, rounds: int = 3) -> Path:
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.simulation import simulate

    d = {"run": {"seed": 0, "run_id": run_id},
         "data": {"name": "digits", "num_clients": 4, "partition": "pathological", "classes_per_client": 2},
         "model": {"name": "mlp", "args": {"hidden": [16]}}, "algorithm": {"name": "fedavg"},
         "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": 0.05}}
    if system is not None:
        d["system"] = system
    return simulate(TrainConfig.from_dict(d, f"{run_id}.toml")).write(ws / "runs" / run_id)


def measured(ws: Path, run_id: str) -> Path:
    """The run's artifacts as export's manifests state them (stand-in files), measured by the fake fleet on dev-a."""
    from edgemask.profiling.campaign import parse_campaign, run_campaign

    params = json.loads((ws / "runs" / run_id / "summary.json").read_text())["params_dense"]
    pf.write_manifest(ws, run_id, "dense", kind="dense", algorithm="fedavg", model="mlp", formats=(("onnx", "fp32"),),
                      params=(params, params))
    for c in CLIENTS:
        pf.write_manifest(ws, run_id, c, kind="compacted", algorithm="fedavg", model="mlp",
                          formats=(("onnx", "fp32"),), params=(params, params))
    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(f"c-{run_id}", run=run_id, formats=("onnx",),
                                                        devices=("dev-a",), repetitions=1)))
    res = run_campaign(cfg, ws, benchmark=pf.FakeBenchmark(), progress=False, inventory=pf.fleet("dev-a"),
                       connect=pf.FakeConnect())
    assert res.complete
    return cfg.results_dir(ws)


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """Two runs, one trained with [system] (dl) and one without (plain), each measured and reported."""
    ws = tmp_path_factory.mktemp("inloop") / "ws"
    train(ws, "dl", BOARDS)
    train(ws, "plain", None)
    out = {}
    for run in ("dl", "plain"):
        results = measured(ws, run)
        write_report(results, ws)
        out[run] = results
    return ws, out


def history(ws: Path, run: str) -> pd.DataFrame:
    return pd.read_parquet(ws / "runs" / run / "history.parquet")


def test_the_reports_times_are_the_runs_own_rounds_by_hand(reported):
    """Every round waited to the 1 s deadline: 3 rounds are 3 s, 12 updates of which the slow board's 6 dropped;
    the time to the run's best mean accuracy is 1 s per round up to the round that first reached it."""
    ws, _ = reported
    r = read_rounds(ws, "dl")
    h = history(ws, "dl")
    server = h[h["client"] == "server"].pivot_table(index="round", columns="metric", values="value")
    assert r.rounds["round_time_s"].tolist() == [1.0, 1.0, 1.0] == server["round_time_s"].tolist()
    assert r.total_s == 3.0 and r.rounds["cum_time_s"].tolist() == [1.0, 2.0, 3.0]
    assert r.rounds["dropped"].tolist() == [2, 2, 2] == server["devices_dropped"].tolist()
    boards = r.boards.set_index("board")
    assert boards.loc["fast", ["devices", "updates", "dropped"]].tolist() == [2, 6, 0]
    assert boards.loc["slow", ["devices", "updates", "dropped"]].tolist() == [2, 6, 6]
    summary = json.loads((ws / "runs" / "dl" / "summary.json").read_text())["system"]
    assert dict(zip(r.boards["board"], r.boards["dropped"])) == {"fast": 0, **summary["dropped_per_board"]}
    best = server["mean_accuracy"].iloc[:3].max()
    first = int(server.index[server["mean_accuracy"] >= best][0])
    assert r.to_target(best) == {"rounds": first + 1, "time_s": float(first + 1)}


def test_the_report_says_the_times_are_in_loop_and_shows_drops_per_board(reported):
    ws, results = reported
    md = (results["dl"] / "summary.md").read_text()
    assert "## Rounds with deadlines, as trained: each run's own in-loop times ([system]: history.parquet's " \
           "round_time_s" in md and "not derived again from a device trace" in md
    run_row = next(line for line in md.splitlines() if line.startswith("| fedavg | dl |"))
    cells = [c.strip() for c in run_row.strip("|").split("|")]
    # algorithm, run, mix, deadline, over-commit, K, rounds, all rounds, mean round, at the deadline, updates,
    # dropped, dropped share, rounds to target, time to target
    assert cells[1:] == ["dl", "fast 50 % (1 ms a step), slow 50 % (1e+06 ms a step)", "1.000", "0", "4", "3",
                         "3.000", "1.000", "3", "12", "6", "50.0%", *cells[13:]]
    r = read_rounds(ws, "dl")
    assert cells[14] == f"{r.to_target(r.rounds['accuracy'].max())['time_s']:.3f}"
    assert "| dl | fast | 2 | 6 | 0 | 0.0% |" in md and "| dl | slow | 2 | 6 | 6 | 100.0% |" in md
    history_sha = r.inputs["history.parquet"]
    assert f"runs/dl/history.parquet sha256 {history_sha[:12]}…" in md


def test_a_run_without_the_section_reports_as_before(reported):
    ws, results = reported
    assert read_rounds(ws, "plain") is None and in_loop_sections([]) == []
    md = (results["plain"] / "summary.md").read_text()
    assert "Rounds with deadlines" not in md and "in-loop" not in md and "runs/plain/" not in md
    assert not {"round_time_s", "dropped"} & set(history(ws, "plain")["metric"])


def test_a_run_changed_after_training_is_refused(reported, tmp_path):
    import shutil

    ws, _ = reported
    shutil.copytree(ws / "runs" / "dl", tmp_path / "runs" / "dl")
    h = history(tmp_path, "dl")
    h.loc[h["metric"] == "round_time_s", "value"] = 0.5  # a shorter round than trained
    h.to_parquet(tmp_path / "runs" / "dl" / "history.parquet")
    with pytest.raises(CorruptFileError, match=r"history.parquet: sha256 .* is not the .* digests.json records"):
        read_rounds(tmp_path, "dl")


def test_a_trace_runs_offline_updates_are_counted_per_board(tmp_path):
    """A run on a FedScale trace with an availability trace (tests/trainer/test_system_trace.py's): the report's
    offline counts are the history's and summary.json's."""
    cap = {i: {"computation": 1.0, "communication": 800.0} for i in (1, 2, 3, 4)}
    behave = {i: {"active": [0], "inactive": [0.1 if i == 12 else 1e9], "finish_time": 2e9} for i in (10, 11, 12, 13)}
    (tmp_path / "cap").write_bytes(pickle.dumps(cap))
    (tmp_path / "behave").write_bytes(pickle.dumps(behave))
    train(tmp_path, "tr", {"deadline_s": 10.0, "trace": {"capacity": str(tmp_path / "cap"),
                                                         "availability": str(tmp_path / "behave")}}, rounds=2)
    r = read_rounds(tmp_path, "tr")
    summary = json.loads((tmp_path / "runs" / "tr" / "summary.json").read_text())["system"]
    offline = {b: n for b, n in zip(r.boards["board"], r.boards["offline"]) if n}
    assert offline == summary["offline_per_board"] and sum(offline.values()) == 2  # lost in round 0, away in 1
    assert r.rounds["offline"].tolist() == [1, 1] and r.mix_text().startswith("FedScale trace cap (sha256 ")
    (_, _, runs), (_, _, boards) = in_loop_sections([r])
    assert runs["offline"].tolist() == ["2"] and boards["offline"].astype(int).sum() == 2
