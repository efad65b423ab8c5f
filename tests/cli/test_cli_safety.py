"""Hostile and unlucky inputs through the real command line (issue #19): names that would leave the workspace,
two writers of one run at once, a client file without its masks, a full disk, a workspace that is a file, a
pickle given as weights. Each is one line and a non-zero exit, and nothing already there is lost."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from edgemask.fileio import sha256_file
from test_cli import assert_clean_failure, edgemask
from edgemask.trainer.config import AlgorithmConfig, DataConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.simulation import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "edgemask"))  # the lock holder tests/edgemask uses too
from lock_holder import hold_lock  # noqa: E402

TRAIN_TOML = """[run]
run_id = {run_id}
[data]
num_clients = 2
[model]
name = "mlp"
args = {{hidden = {hidden}}}
[algorithm]
name = "{algorithm}"
{args}
[training]
rounds = 1
batch_size = 64
"""


def train_toml(path: Path, run_id: str, hidden: int = 8, algorithm: str = "fedavg", args: str = "") -> Path:
    path.write_text(TRAIN_TOML.format(run_id=json.dumps(run_id), hidden=f"[{hidden}]", algorithm=algorithm,
                                      args=args))
    return path


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative name -> sha256): what "nothing lost, nothing touched" compares."""
    return {str(p.relative_to(root)): sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name.endswith((".partial", ".old", ".tmp")))


@pytest.fixture(scope="module")
def fedmask_ws(tmp_path_factory) -> Path:
    """A workspace with one trained FedMask run of 2 clients (masks in the client files)."""
    ws = tmp_path_factory.mktemp("ws")
    cfg = TrainConfig(run=RunConfig(run_id="fm"), data=DataConfig(num_clients=2),
                      model=ModelConfig("mlp", {"hidden": [16]}), algorithm=AlgorithmConfig("fedmask"),
                      training=TrainingConfig(rounds=1, batch_size=64, lr=100.0))
    simulate(cfg).write(ws / "runs" / "fm")
    return ws


@pytest.mark.parametrize("kind", ["relative", "absolute", "empty"])
def test_run_id_out_of_runs_is_refused_and_touches_nothing(tmp_path, kind):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "precious").write_text("keep")
    run_id = {"relative": "../x", "absolute": str(tmp_path / "x"), "empty": ""}[kind]
    p = edgemask("train", "--workspace", str(tmp_path), "--config", str(train_toml(tmp_path / "t.toml", run_id)))
    assert_clean_failure(p, "run.run_id", repr(run_id), "not a plain name" if run_id else "expected a non-empty")
    assert tree(tmp_path / "x") == {"precious": sha256_file(tmp_path / "x" / "precious")}
    assert (tmp_path / "x" / "precious").read_text() == "keep"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_workspace_that_is_a_file_is_refused_before_training(tmp_path):
    ws = tmp_path / "ws"
    ws.write_text("not a directory")
    p = edgemask("train", "--workspace", str(ws), "--config", str(train_toml(tmp_path / "t.toml", "r")))
    assert_clean_failure(p, f"workspace {ws} is a file, not a directory")
    assert "round" not in p.stderr  # refused before the first round, not after the whole training
    assert ws.read_text() == "not a directory"


def test_second_training_of_a_run_id_leaves_at_once_while_one_writes_it(tmp_path):
    # the holder stands for an `edgemask train` of run id r that is still training
    holder, release = hold_lock(tmp_path / "runs" / ".r.lock", "test holder")
    try:
        p = edgemask("train", "--workspace", str(tmp_path), "--config", str(train_toml(tmp_path / "t.toml", "r")))
    finally:
        release.set()
        holder.join(30)
    assert_clean_failure(p, "run r is in use by another edgemask process", ".r.lock")
    assert "round" not in p.stderr and not (tmp_path / "runs" / "r").exists()


def test_client_file_without_mask_metadata_is_not_exported_as_the_dense_model(fedmask_ws, tmp_path):
    from safetensors.numpy import load_file, save_file

    ws = tmp_path / "ws"
    shutil.copytree(fedmask_ws / "runs" / "fm", ws / "runs" / "fm2")
    f = ws / "runs" / "fm2" / "clients" / "client-000.safetensors"
    assert any(k.startswith("mask.") for k in load_file(str(f)))  # a masked client: dense would be wrong
    save_file(load_file(str(f)), str(f))  # same tensors, metadata dropped
    from edgemask.trainer.run_dir import write_digests

    write_digests(ws / "runs" / "fm2")  # vouched for anew: the metadata check behind the digests still holds
    p = edgemask("export", "--workspace", str(ws), "--run", "fm2", "--formats", "onnx")
    assert_clean_failure(p, str(f), "no 'mask_shapes' metadata")
    assert not (ws / "artifacts" / "fm2" / "client-000").exists()


def check_artifacts(root: Path, expected: set[str]) -> None:
    """Every artifact under ``root`` is whole: its manifest names files that exist with the recorded sha256."""
    from edgemask.manifest import load_manifest

    assert {p.name for p in root.iterdir() if not p.name.startswith(".")} == expected
    for d in sorted(p for p in root.iterdir() if p.name in expected):
        m = load_manifest(d)
        for f in [*m.files, m.sample_io]:
            name, digest = (f.file, f.sha256) if not isinstance(f, dict) else (f["file"], f["sha256"])
            assert (d / name).is_file(), (d, name)
            assert sha256_file(d / name) == digest, (d, name)
    assert not leftovers(root)


@pytest.mark.slow
@pytest.mark.parametrize("wait", ["0", "600"])
def test_two_concurrent_exports_of_a_run_leave_whole_artifacts_or_one_clean_refusal(fedmask_ws, tmp_path, wait):
    ws = tmp_path / "ws"
    shutil.copytree(fedmask_ws / "runs", ws / "runs")
    cmd = [sys.executable, "-m", "edgemask.cli", "export", "--workspace", str(ws), "--run", "fm", "--formats",
           "onnx", *(["--wait", wait] if wait != "0" else [])]  # without --wait: leave at once
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(600), *p.communicate()) for p in procs]
    ok = [r for r in results if r[0] == 0]
    refused = [r for r in results if r[0] != 0]
    for rc, out, err in refused:
        assert rc == 2 and "Traceback" not in err, err
        assert [ln for ln in err.splitlines() if "error:" in ln] == [
            f"edgemask export: error: artifacts/fm is in use by another edgemask process "
            f"(lock {ws / 'artifacts' / '.fm.lock'}); wait for it to finish, then run again"], err
    assert len(ok) == 2 if wait != "0" else len(ok) >= 1, results  # --wait: the second one queues, then skips
    check_artifacts(ws / "artifacts" / "fm", {"dense", "client-000", "client-001"})


@pytest.fixture
def small_disk(tmp_path):
    """A 400 KiB tmpfs: a disk that really fills (needs root to mount; unmounted after)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    d = tmp_path / "disk"
    d.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(d)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


def fill(disk: Path, leave_kib: int) -> None:
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave_kib * 1024))


@pytest.mark.slow  # a Flower simulation starts Ray
def test_full_disk_is_one_line_and_loses_no_finished_run(small_disk, tmp_path):
    ws = small_disk / "ws"
    p = edgemask("train", "--workspace", str(ws), "--config", str(train_toml(tmp_path / "a.toml", "r", hidden=8)))
    assert p.returncode == 0, p.stderr
    before = tree(ws / "runs" / "r")
    fill(small_disk, leave_kib=48)
    # the same run id again, with a model (64·256 + 256·10 floats ≈ 75 KiB) that no longer fits
    p = edgemask("train", "--workspace", str(ws), "--config", str(train_toml(tmp_path / "b.toml", "r", hidden=256)))
    # refused once the model is built, before the first round: no training is lost to the full disk
    assert_clean_failure(p, f"{ws / 'runs' / 'r'}: the run needs about", "(checked before training)")
    assert tree(ws / "runs" / "r") == before and not leftovers(ws)
    p = edgemask("train", "--workspace", str(ws), "--config", str(train_toml(tmp_path / "c.toml", "s", hidden=256)))
    assert_clean_failure(p, "KiB free; free some space")
    assert not (ws / "runs" / "s").exists() and not leftovers(ws)
    # on Flower's simulation engine too: the ServerApp refuses before its first round, the CLI says why
    p = edgemask("train", "--workspace", str(ws), "--config", str(train_toml(tmp_path / "c.toml", "s", hidden=256)),
                 "--engine", "flower", "--flower-workers", "1")
    assert_clean_failure(p, f"{ws / 'runs' / 's'}: the run needs about", "(checked before training)")
    assert not (ws / "runs" / "s").exists() and not leftovers(ws)
    # export onto the full disk: one line, no temporary left, the run untouched
    p = edgemask("export", "--workspace", str(ws), "--run", "r", "--formats", "onnx")
    assert_clean_failure(p, f"could not write {ws / 'artifacts' / 'r'}/", "the disk is full")
    assert tree(ws / "runs" / "r") == before and not leftovers(ws)


def test_sqlite_disk_full_hidden_by_a_failed_rollback_is_one_line(small_disk):
    """The profiling store's COMMIT fails on a full disk and its ROLLBACK then raises "cannot rollback": the
    command line finds "database or disk is full" in the chain and says it in one line."""
    from edgemask.cli.main import _environment_failure

    db = sqlite3.connect(small_disk / "results.sqlite", isolation_level=None)
    db.execute("CREATE TABLE t (x BLOB)")
    fill(small_disk, leave_kib=0)
    with pytest.raises(sqlite3.Error) as e:
        try:
            db.execute("BEGIN")
            db.execute("INSERT INTO t VALUES (?)", (b"\0" * 200_000,))
            db.execute("COMMIT")
        except sqlite3.Error:
            db.execute("ROLLBACK")  # may itself raise, replacing the first error (its __context__ keeps it)
            raise
    db.close()
    reason = _environment_failure(e.value, "W")
    assert reason == ("the disk is full (database or disk is full); free space in W or pass another --workspace, "
                      "then run again")
    assert "\n" not in reason


def test_fedselect_init_weights_pickle_is_refused_in_one_line_and_never_run(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    weights = tmp_path / "init.pt"
    weights.write_bytes(pickle.dumps({"fc1.weight": Payload()}, protocol=4))
    cfg = train_toml(tmp_path / "t.toml", "fs", algorithm="fedselect",
                     args=f"args = {{init_weights = {json.dumps(str(weights))}}}")
    p = edgemask("train", "--workspace", str(tmp_path / "ws"), "--config", str(cfg))
    assert_clean_failure(p, "algorithm.args.init_weights", str(weights), "UnpicklingError")
    assert not marker.exists()
    lines = [ln for ln in p.stderr.splitlines() if not ln.startswith("edgemask: memory estimate: ")]  # ours, first
    assert len(lines) == 1  # not even torch's warning about the pickle protocol
