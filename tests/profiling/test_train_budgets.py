"""`edgemask budgets --cost-model layers` (issue #46): PerFedMask's budgets on the per-layer model of a step, fitted
on a campaign's profiled training rows and read back from its store (profiling.train_predict.store_clients).

The run is real (a PerFedMask MLP 64-16-16-16-10 on digits, trained by the trainer), its clients' local steps exported
by export; the measurements are a campaign's, run by the campaign code with a board that answers at once with a step
built from per-layer costs by hand (each layer 1 ms forward, + 2 ms when it trains, + 1.5 ms when the gradient flows
through it; the update 0.2 ms + 1 µs per trained parameter; 0.5 ms besides), as the runner names its op entries.
So the model's prediction for any layers P^mask gives a device is known by hand."""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest

import profiling_fakes as pf
from edgemask.devices.records import Measurement
from edgemask.errors import ConfigError
from edgemask.tomlio import dumps_toml

RUN = "pfm"
LAYERS = ("fc1", "fc2", "fc3", "out")  # forward order; out is the head (frozen: FedBABU)
FWD, WGRAD, IGRAD, FIXED, U0, U1 = 1.0, 2.0, 1.5, 0.5, 0.2, 0.001
SLOW = {"dev-a": 1.0, "dev-b": 3.0}


def config() -> dict:
    return {"run": {"seed": 0, "run_id": RUN},
            "data": {"name": "digits", "num_clients": 4, "partition": "pathological", "classes_per_client": 2},
            "model": {"name": "mlp", "args": {"hidden": [16, 16, 16]}},
            "algorithm": {"name": "perfedmask", "args": {"nu": 0.5, "budget": 0.5, "finetune_epochs": 1}},
            "training": {"rounds": 1, "local_epochs": 1, "batch_size": 16, "lr": 0.05}}


def true_step(trained_layers: set[str], params: int, board: str) -> float:
    """The hand-made step, ms: per layer 1 + 2 (trained) + 1.5 (a trained layer below it), update, fixed."""
    total, below = 0.0, False
    for layer in LAYERS:
        w = layer in trained_layers
        total += FWD + WGRAD * w + IGRAD * below
        below = below or w
    return (FIXED + total + U0 + U1 * params) * SLOW[board]


def step_bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
    """A board that answers at once with the hand-made step and its profile, named as the runner names entries."""
    from edgemask.manifest import load_manifest

    m = load_manifest(artifact_dir)
    t = m.training
    key = {**{n: f"t{i}" for i, n in enumerate(t["trained"])}, **{n: f"f{i}" for i, n in enumerate(t["frozen"])}}
    trained = {n.rsplit(".", 1)[0] for n in t["trained"]}
    k = SLOW[spec.name] * 1e3  # ms -> us on this board
    ops, below = [["Optimizer.zero_grad#SGD.zero_grad[]", "Optimizer.zero_grad#SGD.zero_grad", 0.0, "update"]], False
    back = []
    for i, layer in enumerate(LAYERS):
        keys = ",".join(sorted(key[f"{layer}.{p}"] for p in ("weight", "bias")))
        node = f"linear_{i}[{keys}]"
        ops.append([node, "aten::linear", FWD * k, "forward"])
        w = layer in trained
        if w or below:
            back.append([node, "AddmmBackward0", (WGRAD * w + IGRAD * below) * k, "backward"])
        below = below or w
    ops += back[::-1] + [["Optimizer.step#SGD.step[]", "Optimizer.step#SGD.step",
                          (U0 + U1 * t["trained_params"]) * k, "update"]]
    step = true_step(trained, t["trained_params"], spec.name)
    profile = {"available": True, "profiler": "torch.profiler (hand-made)", "blocks": [],
               "runs": [{"end_to_end_ms": step, "total_us": step * 1e3, "ops": ops}] * 3}
    return Measurement(
        device=spec.name, artifact=f"{artifact_dir.parent.name}/{artifact_dir.name}", format=fmt, variant=variant,
        threads=settings.threads, ok=True, latency_ms=(step,) * 20, timed_window_s=2.5, output_check_passed=True,
        output_max_abs_diff=1e-7, artifact_sha256=m.file_for(fmt, variant).sha256, profile=profile,
        training={"batch_size": 16, "steps_per_round": t["steps_per_round"],
                  "round_ms": [step * t["steps_per_round"]], "check_max_abs_diff": 1e-7,
                  "train_io_sha256": t["sha256"]})


def bare_bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
    """The same board without profiled steps (a campaign without profile_layers)."""
    from dataclasses import replace

    return replace(step_bench(conn, spec, artifact_dir, fmt, variant, settings, timeout), profile={})


def campaign(ws: Path, bench, name: str) -> Path:
    from edgemask.profiling.campaign import parse_campaign, run_campaign

    cfg = parse_campaign(tomllib.loads(pf.campaign_toml(name, run=RUN, formats=("torch-train",),
                                                        devices=("dev-a", "dev-b"), repetitions=1)))
    res = run_campaign(cfg, ws, benchmark=bench, progress=False, inventory=pf.fleet("dev-a", "dev-b"),
                       connect=pf.FakeConnect())
    assert res.complete
    return cfg.results_dir(ws)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    from edgemask.export import export_run
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.simulation import simulate

    ws = tmp_path_factory.mktemp("layers") / "ws"
    run = simulate(TrainConfig.from_dict(config())).write(ws / "runs" / RUN)
    export_run(run, ws / "artifacts", formats=("torch-train",), progress=False)
    (ws / "pfm.toml").write_text(dumps_toml(config()))
    return ws, campaign(ws, step_bench, "profiled"), campaign(ws, bare_bench, "bare")


def test_the_store_gives_every_client_its_profiled_step(measured):
    from edgemask.profiling.train_predict import fit, store_clients

    ws, results, _ = measured
    per_board = store_clients(results, RUN)
    assert sorted(per_board) == ["dev-a", "dev-b"]
    for board, clients in per_board.items():
        assert all(c.measured for c in clients) and len(clients) == 5  # 4 clients (all train) and the dense one
        for c in clients:
            assert c.structure.order == LAYERS
            trained = {n.rsplit(".", 1)[0] for n in c.trained}
            assert c.step_ms == pytest.approx(true_step(trained, c.trained_params, board))
        model = fit(clients)
        assert model.fixed_ms == pytest.approx(FIXED * SLOW[board])
        assert model.round_factor == pytest.approx(1.0)


def test_budgets_on_the_layer_model_predict_each_devices_round_on_its_layers(measured, tmp_path):
    from edgemask.cli.budgets import write_budgets

    ws, results, _ = measured
    out = tmp_path / "out.toml"
    deadline = 0.25  # dev-a: fc1 + fc2 (0.247 s); dev-b, 3x slower: nothing P^mask gives at its budget fits
    devices = write_budgets(ws / "pfm.toml", results, {"dev-a": 0.5, "dev-b": 0.5}, deadline, out,
                            cost_model="layers")
    written = tomllib.loads(out.read_text())
    source = written["algorithm"]["args"]["budget_source"]
    assert source["model"].startswith("per layer") and set(source["boards"]) == {"dev-a", "dev-b"}
    assert source["boards"]["dev-a"]["fixed_ms"] == pytest.approx(FIXED)
    sizes = {"fc1": 64 * 16 + 16, "fc2": 16 * 16 + 16, "fc3": 16 * 16 + 16}
    for cid, d in devices.items():
        trained = set(d["layers"])
        params = sum(sizes[g] for g in trained)
        assert params <= d["fraction"] * sum(sizes.values()) + 1e-6  # P^mask's layers fit the budget
        want = d["steps_per_round"] * true_step(trained, params, d["board"]) / 1e3 if trained else 0.0
        assert d["predicted_round_s"] == pytest.approx(want), (cid, d)  # the hand-made round of ITS layers
        assert d["meets_deadline"] and d["predicted_round_s"] <= deadline
    assert written["algorithm"]["args"]["budgets"] == [devices[c]["fraction"] for c in sorted(devices)]
    # the slow board affords less: its devices' budgets are below the fast board's
    fast = [d["fraction"] for d in devices.values() if d["board"] == "dev-a"]
    slow = [d["fraction"] for d in devices.values() if d["board"] == "dev-b"]
    assert max(slow) < min(fast), devices


def test_budgets_on_the_layer_model_need_profiled_steps(measured, tmp_path):
    from edgemask.cli.budgets import write_budgets

    ws, _, bare = measured
    with pytest.raises(ConfigError) as e:
        write_budgets(ws / "pfm.toml", bare, {"dev-a": 0.5, "dev-b": 0.5}, 0.2, tmp_path / "out.toml",
                      cost_model="layers")
    msg = str(e.value)
    assert "\n" not in msg and "profile_layers = true" in msg and "--cost-model line" in msg
    assert not (tmp_path / "out.toml").exists()
    # the line needs only the timed steps
    write_budgets(ws / "pfm.toml", bare, {"dev-a": 0.5, "dev-b": 0.5}, 0.2, tmp_path / "out.toml")
    assert "a_ms" in json.dumps(tomllib.loads((tmp_path / "out.toml").read_text())["algorithm"]["args"]
                                ["budget_source"]["boards"])


def test_the_command_line_takes_the_cost_model(measured, tmp_path):
    import subprocess
    import sys

    ws, results, _ = measured
    ws2 = tmp_path / "ws"
    shutil.copytree(ws, ws2)
    res = subprocess.run([sys.executable, "-m", "edgemask.cli", "budgets", "--workspace", str(ws2), "--config",
                          str(ws2 / "pfm.toml"), "--results", str(ws2 / "results" / results.name), "--mix",
                          "dev-a=0.5,dev-b=0.5", "--deadline", "0.2", "--out", str(tmp_path / "o.toml"),
                          "--cost-model", "layers"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "trains " in res.stdout and "wrote" in res.stdout
