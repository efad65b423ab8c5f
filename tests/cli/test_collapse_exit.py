"""`edgemask train` on a run whose every client collapsed (issue #38): the run directory is written, one line says
what collapsed and what to change, the exit status is 3; `--allow-collapse` or `training.allow_collapse = true`
accept it; a run with some clients collapsed warns and exits 0. The report's ledger notes the collapsed clients."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from edgemask.cli.main import COLLAPSED, main
from edgemask.profiling.ledger import read_run

# tiny_mobilenet under FedMask with λ_R = 0.02 (the digits config's ×10), 4 clients of 60 samples, seed 5: two
# clients' models have collapsed at round 1, all four at round 2 (tests/trainer/test_collapse.py)
CONFIG = """\
[run]
seed = 5
run_id = "collapse"

[data]
name = "digits"
num_clients = 4
partition = "pathological"
classes_per_client = 2
samples_per_client = 60

[model]
name = "tiny_mobilenet"

[algorithm]
name = "fedmask"

[algorithm.args]
prune_rate = 0.2
prune_last = 2
lambda_r = 0.02

[training]
rounds = {rounds}
local_epochs = 2
batch_size = 16
lr = 100.0
momentum = 0.9
{extra}"""


def config(tmp_path: Path, rounds: int = 2, extra: str = "") -> str:
    path = tmp_path / "collapse.toml"
    path.write_text(CONFIG.format(rounds=rounds, extra=extra))
    return str(path)


def warned(err: str) -> list[str]:
    """The collapse warnings in ``err`` (a progress bar drawn without a newline may precede one on its line)."""
    return [ln.split("edgemask: warning: ", 1)[1] for ln in err.splitlines()
            if "edgemask: warning: " in ln and "collapsed" in ln]


def train(tmp_path: Path, capsys, *args: str, rounds: int = 2, extra: str = "") -> tuple[int, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # each run shows its lines, whatever an earlier test showed
        status = main(["train", "--config", config(tmp_path, rounds, extra), "--workspace", str(tmp_path / "ws"),
                       *args])
    return status, capsys.readouterr().err


def test_every_client_collapsed_exits_3_with_the_run_written(tmp_path, capsys):
    status, err = train(tmp_path, capsys)
    assert status == COLLAPSED == 3
    run = tmp_path / "ws" / "runs" / "collapse"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["collapse"]["all_collapsed"] is True and len(summary["collapse"]["clients"]) == 4
    assert (run / "config.toml").exists() and len(list((run / "clients").iterdir())) == 4
    lines = warned(err)
    assert len(lines) == 2 and lines[0].startswith("round 1: 2 client(s) collapsed (2 of 4 now)"), err
    assert lines[1].startswith("round 2: 2 client(s) collapsed (4 of 4 now)"), err
    errors = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(errors) == 1, err
    assert errors[0].startswith("edgemask train: error: every client's model collapsed (4 of 4; e.g. client-000, "
                                 "since round 1: no live unit in 'stem'")
    for needle in (str(run), "is written for inspection", "lambda_r (now 0.02)", "prune_rate (now 0.2)",
                   "--allow-collapse", "training.allow_collapse = true"):
        assert needle in errors[0], (needle, errors[0])
    # the report's ledger reads the run's summary and notes its collapsed clients in one line
    notes = [n for n in read_run(tmp_path / "ws", "collapse").notes if "collapsed" in n]
    assert len(notes) == 1 and notes[0].startswith("run collapse: 4 of 4 client(s) had collapsed"), notes


def test_allow_collapse_flag_exits_0_and_is_recorded(tmp_path, capsys):
    status, err = train(tmp_path, capsys, "--allow-collapse")
    assert status == 0 and "error:" not in err and len(warned(err)) == 2
    assert "allow_collapse = true" in (tmp_path / "ws" / "runs" / "collapse" / "config.toml").read_text()


def test_allow_collapse_setting_exits_0(tmp_path, capsys):
    status, err = train(tmp_path, capsys, extra="allow_collapse = true\n")
    assert status == 0 and "error:" not in err


def test_some_clients_collapsed_warns_and_exits_0(tmp_path, capsys):
    status, err = train(tmp_path, capsys, rounds=1)
    assert status == 0 and "error:" not in err
    lines = warned(err)
    assert len(lines) == 1 and lines[0].startswith("round 1: 2 client(s) collapsed (2 of 4 now)"), err


def test_the_setting_is_checked_like_any_other(tmp_path, capsys):
    status, err = train(tmp_path, capsys, extra='allow_collapse = "yes"\n')
    assert status == 2 and "allow_collapse" in err


@pytest.mark.slow
def test_collapse_through_the_installed_command(tmp_path):
    p = subprocess.run([sys.executable, "-m", "edgemask.cli", "train", "--config", config(tmp_path),
                        "--workspace", str(tmp_path / "ws")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr
    assert len(warned(p.stderr)) == 2, p.stderr
    assert "edgemask train: error: every client's model collapsed (4 of 4;" in p.stderr
    summary = json.loads((tmp_path / "ws" / "runs" / "collapse" / "summary.json").read_text())
    assert summary["collapse"]["all_collapsed"] is True
