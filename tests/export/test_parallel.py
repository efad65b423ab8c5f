"""Parallel export (``export_run(workers=N)``, ``edgemask export --jobs N``) writes what serial export writes."""

from __future__ import annotations

import pytest
import torch

from edgemask.errors import EdgemaskError
from edgemask.export import export_run, load_manifest
from export_helpers import random_masks
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.models import build_model
from edgemask.trainer.run_dir import ClientState, write_digests, write_run


@pytest.fixture
def run_dir(tmp_path):
    cfg = TrainConfig(run=RunConfig(seed=0, run_id="digits-fedmask-mlp-par"),
                      data=DataConfig(name="digits", num_clients=3),
                      model=ModelConfig("mlp", {"hidden": [32, 16]}), algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    model = build_model("mlp", (64,), 10, hidden=(32, 16))
    clients = {f"client-00{i}": ClientState(masks=random_masks(model, 0.4, seed=i)) for i in range(3)}
    return write_run(tmp_path / "runs" / cfg.run_id, cfg, model.state_dict(), clients, [],
                     {"run_id": cfg.run_id, "clients": {}})


def _digests(dirs):
    """Per artifact directory: every file's sha256 as its manifest records it, and the per-layer records."""
    out = {}
    for d in dirs:
        m = load_manifest(d)
        out[d.name] = ({f.file: f.sha256 for f in m.files}, m.sample_io["sha256"], m.layers, m.input_hash,
                       m.params, m.flops)
    return out


@pytest.mark.slow
def test_parallel_export_writes_the_serial_artifacts(run_dir, tmp_path):
    serial = export_run(run_dir, tmp_path / "serial", formats=("onnx", "pte"), progress=False, workers=1)
    parallel = export_run(run_dir, tmp_path / "parallel", formats=("onnx", "pte"), progress=False, workers=2)
    assert [d.name for d in parallel] == [d.name for d in serial] == ["dense", "client-000", "client-001",
                                                                      "client-002"]
    want, got = _digests(serial), _digests(parallel)
    assert got == want
    # the digests differ between clients (a pool that wrote one client's model everywhere would fail above)
    assert len({tuple(v[0].values()) for v in got.values()}) == 4
    assert not list((tmp_path / "parallel" / "digits-fedmask-mlp-par").glob(".*"))


@pytest.mark.slow
def test_parallel_export_skips_unchanged_clients(run_dir, tmp_path):
    out = export_run(run_dir, tmp_path / "a", formats=("onnx",), progress=False, workers=2)
    stamp = {d.name: (d / "manifest.json").stat().st_mtime_ns for d in out}
    (run_dir / "clients" / "client-001.safetensors").write_bytes(
        (run_dir / "clients" / "client-002.safetensors").read_bytes())
    write_digests(run_dir)  # as a new training of the run records them
    again = export_run(run_dir, tmp_path / "a", formats=("onnx",), progress=False, workers=2)
    now = {d.name: (d / "manifest.json").stat().st_mtime_ns for d in again}
    assert [k for k in now if now[k] != stamp[k]] == ["client-001"]


@pytest.mark.slow
def test_a_worker_failure_is_raised_in_one_line_and_leaves_no_partial(run_dir, tmp_path):
    # a tolerance no compaction meets: every worker fails verification (an error, never a warning)
    with pytest.raises(EdgemaskError) as err:
        export_run(run_dir, tmp_path / "a", formats=("onnx",), progress=False, workers=2, limit=-1.0)
    assert "\n" not in str(err.value).strip()
    root = tmp_path / "a" / "digits-fedmask-mlp-par"
    assert not list(root.glob(".*partial")) and not list(root.glob("*/manifest.json"))


def test_jobs_below_one_is_refused(run_dir, tmp_path):
    with pytest.raises(EdgemaskError, match="--jobs is 0"):
        export_run(run_dir, tmp_path / "a", formats=("onnx",), progress=False, workers=0)
