"""A training job (issue #39) on the `local` device, the real runner and real exported steps: each training format's
step is checked against train_io.npz, timed step by step and round by round; a wrong reference fails naming the
tensor, a train_io.npz that is not the manifest's is refused before anything is sent, and `devices check` says
which training formats a board can take."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from artifacts import make_artifact
from training_artifacts import TRAINING, make_training_artifact, rewrite_train_io

from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.connection import open_connection
from edgemask.devices.inventory import local_device
from edgemask.devices.probe import check_device, training_formats
from edgemask.devices.records import RunnerSettings
from edgemask.devices.runner_app import runner_path
from edgemask.devices.setup import install_commands, packages_for, pip_installs
from edgemask.errors import CorruptFileError, UnknownNameError
from edgemask.manifest import load_manifest
from edgemask.targets import BOARDS

FAST = RunnerSettings(warmup_runs=2, warmup_seconds=0.0, min_runs=12, min_seconds=0.05, idle_seconds=0.0)
ROUNDS = 3


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """FedMask's and FedAvg's client-000, each with both training formats (exported once for the module)."""
    root = tmp_path_factory.mktemp("training")
    return {alg: make_training_artifact(root / alg, alg) for alg in ("fedmask", "fedavg")}


@pytest.fixture
def local(tmp_path):
    return local_device(tmp_path / "ws")


def _copy(art, tmp_path):
    return shutil.copytree(art, tmp_path / "art")


@pytest.mark.parametrize("algorithm", ["fedmask", "fedavg"])
@pytest.mark.parametrize("fmt", TRAINING)
def test_a_local_step_is_checked_and_timed_on_the_local_device(trained, local, fmt, algorithm):
    art = trained[algorithm]
    manifest = load_manifest(art)
    info = manifest.training
    with open_connection(local) as conn:
        m = run_benchmark(conn, local, art, fmt, settings=FAST, train_rounds=ROUNDS)
        assert conn.uploads == 3  # the runner, the step's file, train_io.npz: no sample_io
    assert m.ok, m.error
    assert m.format == fmt and m.output_check_passed
    assert m.artifact_sha256 == manifest.file_for(fmt).sha256
    expected = {"pte-train": "executorch 1.5.1", "torch-train": "torch 2.13.0"}[fmt]
    assert m.runtime_version.startswith(expected)
    # the board's one step from the file's state met the manifest's rule (export measured this file at ≤ its own)
    assert 0.0 <= m.output_max_abs_diff <= info["limit"]
    assert m.training["check_max_abs_diff"] == m.output_max_abs_diff
    assert m.training["train_io_sha256"] == info["sha256"]
    assert m.training["batch_size"] == info["batch_size"] == 16
    assert m.training["steps_per_round"] == info["steps_per_round"] > 1
    # each latency sample one step; ROUNDS whole rounds of steps_per_round steps each after them
    assert m.runs >= FAST.min_runs and m.inferences_per_sample == 1 and m.timed_window_s >= FAST.min_seconds
    rounds = m.training["round_ms"]
    assert len(rounds) == ROUNDS
    fastest = min(m.latency_ms)
    assert all(r >= 0.5 * info["steps_per_round"] * fastest for r in rounds), (rounds, fastest)
    assert m.first_inference_ms > 0 and m.load_ms > 0 and np.isnan(m.accuracy)
    assert m.to_dict()["training"]["round_ms"] == rounds  # the record carries it


def test_a_step_past_the_rule_fails_naming_the_tensor(trained, local, tmp_path):
    art = _copy(trained["fedmask"], tmp_path)
    info = load_manifest(art).training
    atol, rtol = info["limit"], info["rtol"]
    names = [str(n) for n in np.load(art / "train_io.npz")["names"]]

    def move(by):
        def change(a):
            ref = float(a["after_0"][5])
            a["after_0"][5] = np.float32(ref + by(ref))
        return change

    with open_connection(local) as conn:
        # within the rule: half the limit there still passes
        rewrite_train_io(art, move(lambda ref: 0.5 * (atol + rtol * abs(ref))))
        ok = run_benchmark(conn, local, art, "torch-train", settings=FAST, train_rounds=1)
        assert ok.ok, ok.error
        assert 0.4 * atol <= ok.output_max_abs_diff <= 0.6 * (atol + rtol)
        # twice the limit: the job fails before anything is timed, naming t0 and its task name
        rewrite_train_io(art, move(lambda ref: 3 * (atol + rtol * abs(ref))))
        for fmt in TRAINING:
            m = run_benchmark(conn, local, art, fmt, settings=FAST, train_rounds=1)
            assert not m.ok and m.runs == 0 and not m.training
            assert "training step check failed" in m.error and f"t0 ({names[0]!r})" in m.error, m.error
            assert "element 5" in m.error and f"atol {atol:g} + rtol {rtol:g}" in m.error
            assert m.output_max_abs_diff > atol
        # the loss is held to the same rule
        rewrite_train_io(art, lambda a: a.__setitem__("loss", np.float64(float(a["loss"]) + 0.1)))
        m = run_benchmark(conn, local, art, "pte-train", settings=FAST, train_rounds=1)
        assert not m.ok and "loss" in m.error, m.error


def test_a_train_io_that_is_not_the_manifests_is_refused_before_sending(trained, local, tmp_path):
    art = _copy(trained["fedavg"], tmp_path)
    rewrite_train_io(art, lambda a: a["after_1"].__setitem__(0, a["after_1"][0] + 1), update_manifest=False)
    with open_connection(local) as conn:
        with pytest.raises(CorruptFileError, match=r"train_io\.npz: sha256 .* differs from manifest\.json"):
            run_benchmark(conn, local, art, "torch-train", settings=FAST)
        assert conn.uploads == 0  # nothing sent, not even the runner


def test_an_artifact_without_its_step_says_how_to_export_it(local, tmp_path):
    art = make_artifact(tmp_path / "plain")  # onnx only: no training block
    with open_connection(local) as conn:
        with pytest.raises(UnknownNameError) as e:
            run_benchmark(conn, local, art, "pte-train", settings=FAST)
        assert conn.uploads == 0
    msg = str(e.value)
    assert "\n" not in msg and "run-test/client-007" in msg and "no local step" in msg
    assert "--formats onnx,pte-train,torch-train" in msg and "--run run-test --clients client-007" in msg


def test_the_runner_needs_train_io_for_a_training_format(trained, tmp_path):
    art = trained["fedavg"]
    r = subprocess.run([sys.executable, str(runner_path()), "--model", str(art / "train.pt2"), "--format",
                        "torch-train", "--sample-io", str(art / "sample_io.npz")], capture_output=True, text=True,
                       timeout=120)
    doc = json.loads(r.stdout)
    assert r.returncode == 1 and doc == {"ok": False, "error": "--train-io is required for format torch-train"}


def test_devices_check_says_which_training_formats_a_board_takes(local):
    row = check_device(local)
    assert row["reachable"], row
    assert row["training"]["pte-train"].startswith("yes — executorch 1.5.1")
    assert row["training"]["torch-train"].startswith("yes — torch 2.13.0")
    assert {"pte-train", "torch-train", "onnx", "pte"} <= set(row["formats"])
    assert row["runtimes"]["torch"].startswith("torch 2.13.0")
    # a device that does not list torch among its runtimes: installed, but not this device's format
    row = check_device(replace(local, runtimes=("onnxruntime", "executorch")))
    assert row["training"]["torch-train"].startswith('no — torch is installed (torch 2.13.0') and \
        'add "torch" to runtimes of [devices.local]' in row["training"]["torch-train"]
    assert "torch-train" not in row["formats"] and "pte-train" in row["formats"]


def test_the_probe_lines_for_boards_that_cannot_train(local):
    info = {"python_executable": "/usr/bin/python3", "training_runtimes": {"pte-train": None, "torch-train": None},
            "training_errors": {"pte-train": "no module named 'executorch.extension.training'",
                                "torch-train": "no module named 'torch'"}}
    lines = training_formats(replace(local, kind="linux", runtimes=("onnxruntime", "executorch", "torch")), info)
    assert lines == {"pte-train": "no — no module named 'executorch.extension.training'",
                     "torch-train": "no — torch is not installed for /usr/bin/python3 (no module named 'torch')"}
    # a TX2 (Python 3.6) takes neither, whatever its probe says: one line each saying why
    tx2 = replace(local, kind="jetson-tx2", runtimes=("onnxruntime", "tensorrt"))
    lines = training_formats(tx2, {**info, "training_errors": {}})
    assert set(lines) == set(TRAINING)
    for line in lines.values():
        assert line.startswith("no — Python 3.6 on a TX2") and "torch 1.10" in line and "\n" not in line


def test_a_pi_that_trains_with_torch_gets_the_hosts_torch_once():
    assert "torch" in BOARDS["rpi4"].runtimes and "torch" not in BOARDS["jetson-tx2"].runtimes
    pi = local_device(".", kind="rpi4", runtimes=("onnxruntime", "executorch", "torch"))
    pkgs = packages_for(pi)
    assert [p.runtime for p in pkgs] == ["numpy", "onnxruntime", "executorch", "torch"]
    steps = install_commands(pi, pkgs)
    flat = [r for s in steps for r in s]
    assert flat.count("torch==2.13.0") == 1 and steps[0][-1] == "torch==2.13.0"  # from the CPU index, first
    torch_only = local_device(".", kind="rpi4", runtimes=("onnxruntime", "torch"))
    assert pip_installs(packages_for(torch_only)) == [["numpy", "onnxruntime", "torch==2.13.0"]]
