"""Every number traces to the bytes it measured (issue #27, items 1, 3, 4, 5), through the real command line.

Each test reproduces a probe that made a wrong result pass as valid: a training of a run racing its export (two
real processes), an artifact copied under another client's name, a manifest whose ``bytes`` lies, a flipped byte
in a client's mask. Each is now refused in one line, with a non-zero exit, and nothing on disk changed."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from edgemask.fileio import sha256_file
from test_cli import assert_clean_failure, edgemask
from test_cli_safety import train_toml, tree
from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.simulation import simulate

CLI = [sys.executable, "-m", "edgemask.cli"]


@pytest.fixture(scope="module")
def exported_ws(tmp_path_factory) -> Path:
    """A workspace with FedMask run ``fm`` (3 clients, masks in the client files) trained and exported to ONNX."""
    ws = tmp_path_factory.mktemp("ws")
    cfg = TrainConfig(run=RunConfig(run_id="fm"), data=DataConfig(num_clients=3),
                      model=ModelConfig("mlp", {"hidden": [16]}), algorithm=AlgorithmConfig("fedmask"),
                      training=TrainingConfig(rounds=1, batch_size=64, lr=100.0))
    simulate(cfg).write(ws / "runs" / "fm")
    p = edgemask("export", "--workspace", str(ws), "--run", "fm", "--formats", "onnx")
    assert p.returncode == 0, p.stderr
    return ws


def state(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative name -> sha256) except the command line's ``logs/`` and the lock files
    (``*.lock``, which hold no data): what "nothing changed on disk" compares."""
    return {k: v for k, v in tree(root).items() if not k.startswith("logs/") and not k.endswith(".lock")}


def copy_ws(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("logs"))
    return dst


def lock_is_held(path: Path) -> bool:
    """Whether another process holds ``path``'s flock (probed without waiting; released at once if we got it)."""
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError as e:
        assert e.errno in (errno.EAGAIN, errno.EACCES)
        return True
    finally:
        os.close(fd)


def wait_until(cond, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert proc.poll() is None, f"{what}: the process ended first: {proc.communicate()}"
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


CAMPAIGN = """[campaign]
name = "c"
formats = ["onnx"]
devices = ["local"]
repetitions = 1
[[artifacts]]
run = "fm"
clients = {clients}
dense = false
[runner]
warmup_runs = 1
warmup_seconds = 0.0
min_runs = 5
min_seconds = 0.0
"""


def campaign(ws: Path, clients: list[str]) -> Path:
    path = ws.parent / "campaign.toml"  # beside the workspace: the workspace's own state is what is compared
    path.write_text(CAMPAIGN.format(clients=json.dumps(clients)))
    return path


# ---- item 1: train and export of one run id exclude each other ---------------------------------------------------
@pytest.mark.parametrize("via", ["run-id", "symlink"])
def test_export_of_a_run_being_trained_is_refused(exported_ws, tmp_path, via):
    """A real `edgemask train` of run fm holds its lock (many rounds); an `edgemask export` of fm — by its id, or
    through a symlink to the run directory, which must take the same lock — is refused, and the artifacts stay
    those of the run on disk. Before: export read the run while the trainer was about to replace it."""
    ws = copy_ws(exported_ws, tmp_path / "ws")
    cfg = train_toml(tmp_path / "t.toml", "fm", hidden=16, algorithm="fedmask")
    cfg.write_text(cfg.read_text().replace("rounds = 1", "rounds = 100000"))
    before = tree(ws / "artifacts")
    trainer = subprocess.Popen([*CLI, "train", "--workspace", str(ws), "--config", str(cfg)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: lock_is_held(ws / "runs" / ".fm.lock"), trainer, "train never took the run's lock")
        target = "fm"
        if via == "symlink":
            (tmp_path / "elsewhere").mkdir()
            (tmp_path / "elsewhere" / "fm").symlink_to(ws / "runs" / "fm")
            target = str(tmp_path / "elsewhere" / "fm")
        p = edgemask("export", "--workspace", str(ws), "--run", target, "--formats", "onnx")
        assert trainer.poll() is None, "the training ended before the export tried: the test proved nothing"
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.communicate()
    assert_clean_failure(p, "run fm (being trained) is in use by another edgemask process",
                         str(ws / "runs" / ".fm.lock"))
    assert tree(ws / "artifacts") == before


def test_training_a_run_being_exported_is_refused_and_artifacts_match_the_run(exported_ws, tmp_path):
    """A real `edgemask export` of run fm (ONNX and ExecuTorch, all clients) is running; an `edgemask train` of
    fm with other weights is refused while it runs, so every artifact computes the masks of the run its manifest's
    input hash names. Before (the probe): train replaced the run mid-export; client-004's ONNX computed the old
    masks under the new run's hash, and every later export skipped it as unchanged."""
    ws = tmp_path / "ws"
    shutil.copytree(exported_ws / "runs", ws / "runs")  # no artifacts yet: this export does all the work
    run_before = tree(ws / "runs" / "fm")
    exporter = subprocess.Popen([*CLI, "export", "--workspace", str(ws), "--run", "fm", "--formats", "onnx,pte",
                                 "--wait", "600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: lock_is_held(ws / "artifacts" / ".fm.lock"), exporter, "export never started")
        cfg = train_toml(tmp_path / "t.toml", "fm", hidden=16, algorithm="fedmask")
        cfg.write_text(cfg.read_text().replace("[run]", "[run]\nseed = 7"))
        p = edgemask("train", "--workspace", str(ws), "--config", str(cfg))
        exporting = exporter.poll() is None
        rc, _, err = exporter.wait(600), *exporter.communicate()
    finally:
        if exporter.poll() is None:
            exporter.kill()
    assert exporting, "the export ended before the training tried: the test proved nothing"
    assert rc == 0, err
    assert_clean_failure(p, "run fm is in use by another edgemask process", str(ws / "runs" / ".fm.lock"))
    assert tree(ws / "runs" / "fm") == run_before
    check_artifacts_compute_the_run(ws, "fm")


def check_artifacts_compute_the_run(ws: Path, run_id: str) -> None:
    """Every client's ONNX file computes, on its sample_io inputs, what the run on disk's masked model computes,
    and its manifest's input hash is the one an export of the run on disk computes."""
    import onnxruntime as ort
    import torch

    from edgemask.manifest import load_artifact, load_sample_io
    from edgemask.export.formats import ExportSettings
    from edgemask.export.pipeline import input_hash
    from edgemask.trainer.run_dir import load_run

    run = load_run(ws / "runs" / run_id)
    for cid in run.client_ids:
        d = ws / "artifacts" / run_id / cid
        m = load_artifact(d)
        assert m.input_hash == input_hash(run, cid, ["onnx", "pte"], ExportSettings()), cid
        x = load_sample_io(d / "sample_io.npz")["input"]
        with torch.no_grad():
            want = run.build_model(cid)(torch.from_numpy(x)).numpy()
        sess = ort.InferenceSession(str(d / "model.onnx"), providers=["CPUExecutionProvider"])
        got = np.concatenate([sess.run(None, {sess.get_inputs()[0].name: x[i:i + 1]})[0] for i in range(len(x))])
        assert np.abs(got - want).max() <= 1e-5, cid


# ---- item 3: an artifact copied under another client's name ------------------------------------------------------
def test_artifact_copied_under_another_clients_name_is_refused(exported_ws, tmp_path):
    ws = copy_ws(exported_ws, tmp_path / "ws")
    arts = ws / "artifacts" / "fm"
    shutil.rmtree(arts / "client-001")
    shutil.copytree(arts / "client-000", arts / "client-001")  # client-000's model, posing as client-001
    before = state(ws)
    p = edgemask("profile", "--workspace", str(ws), "--campaign", str(campaign(ws, ["client-001"])))
    assert_clean_failure(p, str(arts / "client-001" / "manifest.json"), "run_id/client_id say fm/client-000",
                         "sits at fm/client-001")
    assert state(ws) == before and not (ws / "results" / "c" / "results.sqlite").exists()


# ---- item 4: a manifest field the report uses that disagrees with the file ---------------------------------------
@pytest.mark.parametrize("field,value,needle", [
    ("bytes", 1, "field 'files[0].bytes' is 1 but model.onnx has"),
    ("sha256", "ab" * 32, "field 'files[0].sha256' is abababababab... but model.onnx hashes to"),
])
def test_manifest_field_that_disagrees_with_its_file_is_refused(exported_ws, tmp_path, field, value, needle):
    """Before: `bytes = 1` with the right digest gave "size reduction 100 %" in the report."""
    ws = copy_ws(exported_ws, tmp_path / "ws")
    mpath = ws / "artifacts" / "fm" / "client-000" / "manifest.json"
    m = json.loads(mpath.read_text())
    assert m["files"][0]["file"] == "model.onnx"
    m["files"][0][field] = value
    mpath.write_text(json.dumps(m))
    before = state(ws)
    p = edgemask("profile", "--workspace", str(ws), "--campaign", str(campaign(ws, ["client-000"])))
    assert_clean_failure(p, str(mpath), needle)
    assert state(ws) == before and not (ws / "results" / "c" / "results.sqlite").exists()


# ---- item 5: one flipped byte in a client's mask -----------------------------------------------------------------
def test_flipped_byte_in_a_client_mask_is_refused_and_the_good_artifact_kept(exported_ws, tmp_path):
    """Before: the damaged mask exported silently and replaced the good artifact (its input hash changed)."""
    from safetensors.numpy import load_file

    ws = copy_ws(exported_ws, tmp_path / "ws")
    f = ws / "runs" / "fm" / "clients" / "client-000.safetensors"
    good = load_file(str(f))
    data = bytearray(f.read_bytes())
    data[-1] ^= 0x01  # the last byte of the file: a byte of the last tensor, here a packed mask
    f.write_bytes(bytes(data))
    changed = load_file(str(f))
    assert [k for k in good if not np.array_equal(good[k], changed[k])] and all(k.startswith("mask.") for k in good)
    before = state(ws)
    p = edgemask("export", "--workspace", str(ws), "--run", "fm", "--formats", "onnx")
    assert_clean_failure(p, str(f), "differs from", "recorded in digests.json at train time", "re-train the run")
    assert state(ws) == before
    assert sha256_file(ws / "artifacts" / "fm" / "client-000" / "model.onnx") == \
        sha256_file(exported_ws / "artifacts" / "fm" / "client-000" / "model.onnx")
