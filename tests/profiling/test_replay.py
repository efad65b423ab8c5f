"""The replay's arithmetic on a two-round history computed by hand (FedScale's cost model)."""

import math

import pandas as pd
import pytest

from edgemask.errors import ConfigError, CorruptFileError
from edgemask.profiling.replay import RunReplay, replay_rounds, replay_table

# round 0: a and b train; round 1: a alone. mean accuracy 0.5 after round 0, 0.8 after round 1.
HISTORY = pd.DataFrame(
    [(0, "a", "samples_seen", 100), (0, "a", "bytes_up", 1000), (0, "a", "bytes_down", 2000),
     (0, "b", "samples_seen", 50), (0, "b", "bytes_up", 500), (0, "b", "bytes_down", 2000),
     (0, "a", "accuracy", 0.4), (0, "b", "accuracy", 0.6), (0, "server", "mean_accuracy", 0.5),
     (1, "a", "samples_seen", 100), (1, "a", "bytes_up", 1000), (1, "a", "bytes_down", 2000),
     (1, "server", "mean_accuracy", 0.8)], columns=["round", "client", "metric", "value"])
COSTS = pd.DataFrame({"client_id": ["a", "b"], "computation_ms": [2.0, 10.0], "train_energy_mj": [4.0, 1.0]})
BANDWIDTH = 8.0  # kbit/s: a byte costs 1 ms


# what run-x's summary says of its model: the manifests of the trace's artifacts state the same (MODEL below)
MODEL = {"model": "mlp", "dataset": "digits", "params_dense": 1754}


def write_run(root, run_id="run-x", history=HISTORY, **summary):
    """runs/<run_id> as `edgemask train` leaves it for a replay: history.parquet and summary.json, then
    digests.json over them (trainer.run_dir.write_digests, the writer train uses)."""
    import json

    from edgemask.trainer.run_dir import write_digests

    run = root / "runs" / run_id
    run.mkdir(parents=True, exist_ok=True)
    history.to_parquet(run / "history.parquet")
    (run / "summary.json").write_text(json.dumps({"algorithm": "fedx", **MODEL, **summary}))
    write_digests(run)
    return run


def manifests(frame, **kw):
    """``frame`` with the manifests' columns results.parquet carries (model, data set, dense parameters)."""
    return frame.assign(model=kw.get("model", MODEL["model"]), dataset=kw.get("dataset", MODEL["dataset"]),
                        params_dense=kw.get("params_dense", MODEL["params_dense"]))


def test_two_rounds_by_hand():
    # round 0, a: compute 3 × 100 × 2 ms = 0.6 s, comm 3000 B × 8 / 1000 / 8 kbit/s = 3.0 s -> 3.6 s
    #          b: compute 3 × 50 × 10 ms = 1.5 s, comm 2500 B -> 2.5 s -> 4.0 s: the round ends with b
    #    energy: a 3 × 100 × 4 mJ = 1.2 J, b 3 × 50 × 1 mJ = 0.15 J -> 1.35 J
    # round 1, a alone: 3.6 s, 1.2 J
    r = replay_rounds(HISTORY, COSTS, BANDWIDTH)
    assert list(r["clients"]) == [2, 1]
    assert list(r["slowest"]) == ["b", "a"]
    assert r["compute_s"].tolist() == pytest.approx([1.5, 0.6])
    assert r["comm_s"].tolist() == pytest.approx([2.5, 3.0])
    assert r["round_s"].tolist() == pytest.approx([4.0, 3.6])
    assert r["energy_j"].tolist() == pytest.approx([1.35, 1.2])
    assert r["cum_time_s"].tolist() == pytest.approx([4.0, 7.6])
    assert r["cum_energy_j"].tolist() == pytest.approx([1.35, 2.55])
    run = RunReplay("run", "fedx", r)
    assert run.to_target(0.8) == pytest.approx({"rounds": 2, "time_s": 7.6, "energy_j": 2.55})
    assert run.to_target(0.5) == pytest.approx({"rounds": 1, "time_s": 4.0, "energy_j": 1.35})
    assert all(math.isnan(v) for v in run.to_target(0.9).values())
    table = replay_table([run], 0.8)
    assert "7.60" in table and "2.55" in table and "80.0 %" in table


def test_a_run_with_deadlines_is_timed_by_its_own_rounds():
    """A run trained with [system] (issue #46) records each round's wall-clock (round_time_s): replay reads those,
    deadlines and drops included, and keeps the trace's derived time beside them; energy is still the trace's."""
    from edgemask.profiling.replay import measured_lines

    timed = pd.concat([HISTORY, pd.DataFrame([(0, "server", "round_time_s", 1.5), (1, "server", "round_time_s", 2.0)],
                                             columns=HISTORY.columns)])
    r = replay_rounds(timed, COSTS, BANDWIDTH)
    assert r["round_s"].tolist() == [1.5, 2.0] and r["cum_time_s"].tolist() == [1.5, 3.5]
    assert r["derived_round_s"].tolist() == pytest.approx([4.0, 3.6])  # the hand-computed rounds above
    assert r["cum_energy_j"].tolist() == pytest.approx([1.35, 2.55])
    assert RunReplay("run", "fedx", r).to_target(0.8)["time_s"] == 3.5
    assert "run run: time is the run's own round_time_s" in measured_lines([RunReplay("run", "fedx", r)])[0]
    with pytest.raises(CorruptFileError, match="round_time_s rows do not cover every round"):
        replay_rounds(timed[~((timed["round"] == 1) & (timed["metric"] == "round_time_s"))], COSTS, BANDWIDTH)


def test_matches_fedscales_own_completion_time():
    """FedScale's ``ClientMetadata.get_completion_time`` (fedscale/cloud/internal/client_metadata.py), restated
    here as the reference: computation = 3 × batch × local steps × ms per sample ÷ 1000, communication = (upload
    + download kbit) ÷ bandwidth. Client a of round 0 trains 100 samples as 20 × 5 steps, sends 8 and fetches
    16 kbit."""
    def get_completion_time(compute_speed, bandwidth, batch_size, local_steps, upload_size, download_size,
                            augmentation_factor=3.0):
        return {"computation": augmentation_factor * batch_size * local_steps * float(compute_speed) / 1000.,
                "communication": (upload_size + download_size) / float(bandwidth)}

    ref = get_completion_time(2.0, BANDWIDTH, 20, 5, 1000 * 8 / 1000, 2000 * 8 / 1000)
    r = replay_rounds(HISTORY[HISTORY["client"].isin(["a", "server"])], COSTS, BANDWIDTH)
    assert r["compute_s"].iloc[0] == pytest.approx(ref["computation"])
    assert r["comm_s"].iloc[0] == pytest.approx(ref["communication"])


def test_missing_energy_is_missing_not_zero():
    costs = COSTS.assign(train_energy_mj=[4.0, float("nan")])
    r = replay_rounds(HISTORY, costs, BANDWIDTH)
    assert math.isnan(r["energy_j"].iloc[0]) and r["energy_j"].iloc[1] == pytest.approx(1.2)


def test_refusals_name_what_is_missing():
    with pytest.raises(ConfigError, match="client\\(s\\) b"):
        replay_rounds(HISTORY, COSTS[COSTS["client_id"] == "a"], BANDWIDTH, run_id="r")
    with pytest.raises(CorruptFileError, match="samples_seen"):
        replay_rounds(HISTORY[HISTORY["metric"] != "samples_seen"], COSTS, BANDWIDTH, run_id="r")
    with pytest.raises(ConfigError, match="bandwidth"):
        replay_rounds(HISTORY, COSTS, 0.0)
    with pytest.raises(ConfigError, match="no server metric 'global_accuracy'; it has mean_accuracy"):
        replay_rounds(HISTORY, COSTS, BANDWIDTH, metric="global_accuracy")


def test_cli_replay_end_to_end_and_refusals(tmp_path, capsys):
    """`edgemask replay` on a run directory and a trace written by the trace writer: the hand-computed figures
    above; a missing trace is one line, exit 2."""
    from edgemask.cli.main import main
    from edgemask.profiling.trace import write_traces

    write_run(tmp_path)
    ledger = pd.DataFrame({"run_id": "run-x", "client_id": ["a", "b"], "algorithm": "fedx", "device": "dev",
                           "format": "onnx", "variant": "fp32", "threads": 1, "artifact": ["run-x/a", "run-x/b"],
                           "p50_ms": [2.0, 10.0], "energy_mj": [4.0, 1.0], "verdict": "VALID"})
    (trace,), _ = write_traces(tmp_path / "results" / "c", ledger, manifests(ledger.assign(kind="compacted")),
                               bandwidth_kbps=BANDWIDTH, train_model="compacted")
    assert main(["replay", "--workspace", str(tmp_path), "--run", "run-x", "--trace", str(trace),
                 "--target", "0.8"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("fedx"))
    assert row.split() == ["fedx", "run-x", "2", "7.60", "2.55", "0.8000", "7.60", "2.55"]
    assert "8 kbit/s per client (the trace's, assumed, not measured)" in out
    assert main(["replay", "--workspace", str(tmp_path), "--run", "run-x", "--trace", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no trace here" in err


# Client a's local round measured on the board (issue #39): 4000 ms for its 100 samples × 2 epochs = 200 samples,
# 8 steps of 50 mJ; b has no measured round and falls back to FedScale's 3× assumption.
MEASURED = COSTS.assign(local_round_ms=[4000.0, float("nan")], round_samples=[200.0, float("nan")],
                        steps_per_round=[8.0, float("nan")], step_energy_mj=[50.0, float("nan")],
                        local_round_source=["torch-train measured", None], train_round_verdict=["VALID", None])


def test_measured_local_round_and_the_3x_fallback_by_hand():
    # measured: round 0, a: 4000 ms × 100/200 = 2.0 s compute + 3.0 s comm = 5.0 s; b (3×): 1.5 + 2.5 = 4.0 s:
    #   the round ends with a at 5.0 s; energy a 50 mJ × 8 steps × 100/200 = 0.2 J, b 3 × 50 × 1 mJ = 0.15 J
    # round 1, a alone: 5.0 s, 0.2 J
    r = replay_rounds(HISTORY, MEASURED, BANDWIDTH)
    assert list(r["slowest"]) == ["a", "a"] and list(r["measured"]) == [1, 1]
    assert r["compute_s"].tolist() == pytest.approx([2.0, 2.0])
    assert r["round_s"].tolist() == pytest.approx([5.0, 5.0])
    assert r["energy_j"].tolist() == pytest.approx([0.35, 0.2])
    assert r["cum_time_s"].tolist() == pytest.approx([5.0, 10.0])
    assert r["cum_energy_j"].tolist() == pytest.approx([0.35, 0.55])
    # the other way: every client on the 3× assumption, the figures of test_two_rounds_by_hand
    f = replay_rounds(HISTORY, MEASURED, BANDWIDTH, measured_rounds=False)
    assert list(f["slowest"]) == ["b", "a"] and list(f["measured"]) == [0, 0]
    assert f["round_s"].tolist() == pytest.approx([4.0, 3.6])
    assert f["cum_time_s"].tolist() == pytest.approx([4.0, 7.6])
    assert f["cum_energy_j"].tolist() == pytest.approx([1.35, 2.55])
    # a measured round without power: that client's energy is missing, not 3× inference energy
    no_power = replay_rounds(HISTORY, MEASURED.assign(step_energy_mj=float("nan")), BANDWIDTH)
    assert math.isnan(no_power["energy_j"].iloc[0]) and math.isnan(no_power["energy_j"].iloc[1])
    # a client with a measured round and no inference cost is costed; one with neither is refused
    r2 = replay_rounds(HISTORY, MEASURED.assign(computation_ms=[float("nan"), 10.0]), BANDWIDTH)
    assert r2["round_s"].tolist() == pytest.approx([5.0, 5.0])
    with pytest.raises(ConfigError, match="client\\(s\\) a"):
        replay_rounds(HISTORY, MEASURED.assign(computation_ms=[float("nan"), 10.0]), BANDWIDTH,
                      measured_rounds=False, run_id="r")


def test_cli_replays_both_ways_and_prints_the_fallback_clients(tmp_path, capsys):
    """A trace written from results with a training row for a (torch-train, 4000 ms a round of 100 × 2 samples):
    `edgemask replay` uses it, names b as fallen back; `--assume-3x` gives the 3× figures and names both."""
    from edgemask.cli.main import main
    from edgemask.profiling.trace import read_trace, write_traces

    write_run(tmp_path)
    ledger = pd.DataFrame({"run_id": "run-x", "client_id": ["a", "b"], "algorithm": "fedx", "device": "dev",
                           "format": "onnx", "variant": "fp32", "threads": 1, "artifact": ["run-x/a", "run-x/b"],
                           "p50_ms": [2.0, 10.0], "energy_mj": [4.0, 1.0], "verdict": "VALID"})
    train = pd.DataFrame({"run_id": "run-x", "client_id": ["a"], "algorithm": "fedx", "device": "dev",
                          "format": "torch-train", "variant": "fp32", "threads": 1, "artifact": ["run-x/a"],
                          "workload": "train", "kind": "compacted", "verdict": "VALID", "artifact_sha256": "ab" * 32,
                          "p50_ms": 500.0, "step_p50_ms": 500.0, "local_round_ms": 4000.0, "steps_per_round": 8,
                          "batch_size": 32, "num_train": 100, "epochs": 2, "step_energy_mj": 50.0,
                          "energy_mj": 50.0})
    results = manifests(pd.concat([ledger.assign(kind="compacted", workload="inference"), train], ignore_index=True))
    (trace,), _ = write_traces(tmp_path / "results" / "c", ledger, results, bandwidth_kbps=BANDWIDTH,
                               train_model="compacted")
    t, meta = read_trace(trace)
    a = t.set_index("client_id").loc["a"]
    assert (a["local_round_ms"], a["round_samples"], a["local_round_source"], a["train_round_artifact"],
            a["train_round_verdict"]) == (4000.0, 200.0, "torch-train measured", "run-x/a", "VALID")
    assert math.isnan(t.set_index("client_id").loc["b", "local_round_ms"])
    assert pd.isna(t.set_index("client_id").loc["b", "local_round_source"]) and meta["train_format"] == "torch-train"

    base = ["replay", "--workspace", str(tmp_path), "--run", "run-x", "--trace", str(trace), "--target", "0.8"]
    assert main(base) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("fedx"))
    assert row.split() == ["fedx", "run-x", "2", "10.00", "0.55", "0.8000", "10.00", "0.55"]
    assert ("run run-x: measured local round for 1 client(s), scaled by the round's samples_seen ÷ the samples it "
            "measured (num_train × epochs): a (torch-train measured, VALID)") in out
    assert ("run run-x: 1 client(s) fell back to the 3× assumption (no measured local round used on this device "
            "and threads): b") in out
    assert main([*base, "--assume-3x"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("fedx"))
    assert row.split() == ["fedx", "run-x", "2", "7.60", "2.55", "0.8000", "7.60", "2.55"]
    assert "2 client(s) fell back to the 3× assumption (no measured local round used on this device and threads): a, b" in out
    assert "measured local round for" not in out


def _run_and_trace(tmp_path, history=HISTORY):
    """runs/run-x (the two-round history) and a trace of its clients a and b written by the trace writer."""
    from edgemask.profiling.trace import write_traces

    write_run(tmp_path, history=history)
    ledger = pd.DataFrame({"run_id": "run-x", "client_id": ["a", "b"], "algorithm": "fedx", "device": "dev",
                           "format": "onnx", "variant": "fp32", "threads": 1, "artifact": ["run-x/a", "run-x/b"],
                           "p50_ms": [2.0, 10.0], "energy_mj": [4.0, 1.0], "verdict": "VALID"})
    (trace,), _ = write_traces(tmp_path / "results" / "c", ledger, manifests(ledger.assign(kind="compacted")),
                               bandwidth_kbps=BANDWIDTH, train_model="compacted")
    return trace


@pytest.mark.parametrize("bad", [95.0, 0.0, -0.5, 1.0001, float("nan"), float("inf")])
def test_the_target_is_a_fraction_or_refused_before_anything_is_read(tmp_path, bad):
    """Issue #44: --target 95 printed "time and energy to 9500.0 %" over a table of —. A target outside (0, 1]
    is one ConfigError naming --target and what to give, before the trace (absent here) is read."""
    from edgemask.profiling.replay import ReplaySettings, replay_report

    with pytest.raises(ConfigError) as e:
        replay_report(tmp_path, ["run-x"], tmp_path / "no-trace", ReplaySettings(target=bad))
    msg = str(e.value)
    assert msg.startswith("--target ") and "fraction (0.95 for 95 %)" in msg and "\n" not in msg


def test_cli_refuses_a_percentage_target_in_one_line(tmp_path, capsys):
    from edgemask.cli.main import main

    trace = _run_and_trace(tmp_path)
    try:  # the option's check refuses it while parsing (argparse exits), else replay does
        code = main(["replay", "--workspace", str(tmp_path), "--run", "run-x", "--trace", str(trace), "--target",
                     "95"])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert code != 0 and out == "" and err.count("\n") == 1 and "--target" in err and "0.95" in err


def test_a_target_no_run_reaches_says_so_with_each_runs_best(tmp_path):
    """0.9999: no round reaches it, the table is — throughout, and a sentence names the target and the run's best
    (0.8 after its second round) instead of leaving the — unexplained; the header does not round it to 100 %."""
    from edgemask.profiling.replay import ReplaySettings, replay_report

    trace = _run_and_trace(tmp_path)
    out = replay_report(tmp_path, ["run-x"], trace, ReplaySettings(target=0.9999))
    assert out.startswith("time and energy to 99.99 % mean_accuracy (given)")
    row = next(line for line in out.splitlines() if line.startswith("fedx"))
    assert row.split()[2:5] == ["—", "—", "—"]
    assert ("no run reached 99.99 % mean_accuracy: every time and energy to it is —; best mean_accuracy reached: "
            "run-x 80.0 % (round 2)") in out
    reached = replay_report(tmp_path, ["run-x"], trace, ReplaySettings(target=0.8))
    assert "reached" not in reached.split("assumptions:")[0]
