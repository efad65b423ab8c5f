"""What export and training print when something goes wrong or is left out (issue #44): an error starts a line of
its own, never the end of a progress bar's; a note from a worker process reaches the terminal."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from edgemask.cli.progress import progress_printer
from edgemask.errors import EdgemaskError
from export_helpers import random_masks  # noqa: F401 - (the helpers' module, as the other export tests)
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.models import build_model
from edgemask.trainer.run_dir import ClientState, write_run


def edgemask(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgemask.cli", *args], capture_output=True, text=True,
                          timeout=600)


def own_line(stderr: str, start: str) -> str:
    """The line of ``stderr`` holding ``start``; it must begin with it (a bar drawn before it on the same line,
    '\\r'-separated, would come first)."""
    lines = [ln for ln in stderr.split("\n") if start in ln]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(start), repr(lines[0])
    return lines[0]


def test_an_export_error_starts_a_line_of_its_own(tmp_path):
    # Before: "export <run>:   0%|          | 0/2 [00:00<?, ?model/s]edgemask export: error: ..."
    ws = tmp_path / "ws"
    cfg = TrainConfig(run=RunConfig(seed=0, run_id="digits-bnn"), data=DataConfig(name="digits", num_clients=2),
                      model=ModelConfig("mlp", {"hidden": [32, 16]}), algorithm=AlgorithmConfig("bnn_fedavg"),
                      training=TrainingConfig(lr=0.05))
    torch.manual_seed(0)
    model = build_model("mlp", (64,), 10, hidden=(32, 16))
    write_run(ws / "runs" / cfg.run_id, cfg, model.state_dict(), {"client-000": ClientState(),
                                                                  "client-001": ClientState()},
              [], {"run_id": cfg.run_id, "clients": {}})
    p = edgemask("export", "--workspace", str(ws), "--run", cfg.run_id, "--formats", "onnx,torch-train", "--jobs", "1")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    line = own_line(p.stderr, "edgemask export: error: ")
    assert f"artifacts/{cfg.run_id}/dense: torch-train: algorithm 'bnn_fedavg'" in line
    if "other libraries' messages" in p.stderr:
        own_line(p.stderr, "other libraries' messages")
    assert "export digits-bnn" in p.stderr  # the bar was drawn: the test exercises a bar and an error together


@pytest.mark.slow
def test_a_note_from_a_worker_process_reaches_the_terminal_on_its_own_line(tmp_path):
    from test_budgets_meet_export import budget_zero_run

    ws = tmp_path / "ws"
    run = budget_zero_run(ws)
    p = edgemask("export", "--workspace", str(ws), "--run", run.run_id, "--formats", "onnx,torch-train",
                 "--jobs", "2")
    assert p.returncode == 0, p.stderr
    line = own_line(p.stderr, "edgemask: warning: ")
    assert line == (f"edgemask: warning: {run.run_id}/client-001: no training step written (torch-train): nothing "
                    "in its step trains (every trainable tensor is frozen whole); its inference files are written")
    assert all(f"wrote {ws / 'artifacts' / run.run_id / d}" in p.stdout
               for d in ("dense", "client-000", "client-001", "client-002"))


def test_a_training_bar_an_error_stops_ends_its_line(capsys):
    # `edgemask train` and the demo draw this bar; the error is printed after it (cli/main.py)
    with pytest.raises(EdgemaskError):
        with progress_printer("train r") as progress:
            progress(0, 3, {})
            progress(1, 3, {"mean_accuracy": 0.5})
            raise EdgemaskError("round 2 failed")
    err = capsys.readouterr().err
    assert err.endswith("\n") and "1/3" in err.split("\n")[-2]
