"""PerFedMask's budgets meet export (issue #44; docs/fedmask.md, "Budgets and export meet"): a device with budget
ψ_n = 0 trains nothing, so it has no local step to export; it is exported for inference, its training step left out
with a line that names it and why, and every other client, and the dense baseline, export fully."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from edgemask.export import export_run
from edgemask.export.training import TRAIN_IO
from edgemask.manifest import load_artifact
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.run_dir import load_run
from edgemask.trainer.simulation import train

REFERENCE = Path(__file__).resolve().parents[2] / "configs" / "digits-perfedmask.toml"


def budget_zero_run(tmp_path):
    """configs/digits-perfedmask.toml, small (3 devices, a 32-16 body, one round), client-001's ψ_n = 0 as
    ``edgemask budgets`` writes it for a board that misses the deadline."""
    d = tomllib.loads(REFERENCE.read_text())
    d["run"]["run_id"] = "digits-perfedmask-psi0"
    d["data"].update(num_clients=3, samples_per_client=120)
    d["model"]["args"] = {"hidden": [32, 16]}
    d["algorithm"]["args"].update(budgets=[1.0, 0.0, 1.0], finetune_epochs=1)
    d["training"].update(rounds=1, local_epochs=1)
    return load_run(train(TrainConfig.from_dict(d), tmp_path / "runs"))


def test_a_device_with_budget_zero_is_exported_for_inference_and_the_others_fully(tmp_path):
    # Before: the export stopped at client-001 with "nothing in its step trains (every trainable tensor is
    # frozen whole)", naming no client; client-002 was never exported
    run = budget_zero_run(tmp_path)
    with pytest.warns(UserWarning) as warned:
        out = export_run(run.path, tmp_path / "artifacts", "all", ["onnx", "torch-train"], progress=False)
    assert [d.name for d in out] == ["dense", "client-000", "client-001", "client-002"]
    notes = [str(w.message) for w in warned if "training step" in str(w.message)]
    assert notes == [f"{run.run_id}/client-001: no training step written (torch-train): nothing in its step trains "
                     "(every trainable tensor is frozen whole); its inference files are written"]
    for d in out:
        m = load_artifact(d)
        assert m.file_for("onnx").max_abs_diff is not None
        if d.name == "client-001":
            assert m.training is None and m.find_file("torch-train") is None
            assert sorted(p.name for p in d.iterdir()) == ["manifest.json", "model.onnx", "sample_io.npz"]
        else:  # the dense baseline trains the whole body; ψ = d_w trains it too
            assert m.training["trained"] and m.training["max_abs_diff"]["torch-train"] <= m.training["limit"]
            assert (d / TRAIN_IO).is_file() and m.find_file("torch-train") is not None
