"""Real training artifacts (issue #39) for the devices and fleet tests: a tiny MLP (64 -> 32 -> 10) trained one
round on digits by the real engine, then exported by the real exporters with its local step as pte-train and
torch-train (train.pte, train.pt2, train_io.npz), a few seconds each."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from edgemask.fileio import sha256_file
from edgemask.manifest import load_manifest, write_manifest

TRAINING = ("pte-train", "torch-train")
# per algorithm: its learning rate (FedMask's masks learn with a large one, as supermask training needs)
LR = {"fedmask": 5.0, "fedavg": 0.1}


def make_training_artifact(root: Path, algorithm: str = "fedmask", client: str = "client-000") -> Path:
    """Train ``algorithm`` one round on 2 digits clients and export ``client`` with onnx and both training
    formats under ``root``; returns the client's artifact directory."""
    from edgemask.export import export_run
    from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
    from edgemask.trainer.data import DataConfig
    from edgemask.trainer.simulation import train

    cfg = TrainConfig(run=RunConfig(seed=0, run_id=f"tiny-{algorithm}"), data=DataConfig(name="digits", num_clients=2),
                      model=ModelConfig("mlp", {"hidden": [32]}), algorithm=AlgorithmConfig(algorithm, {}),
                      training=TrainingConfig(rounds=1, batch_size=16, lr=LR[algorithm], momentum=0.9))
    run_dir = train(cfg, Path(root) / "runs")
    export_run(run_dir, Path(root) / "artifacts", [client], ["onnx", *TRAINING])
    return Path(root) / "artifacts" / cfg.run.run_id / client


def rewrite_train_io(artifact: Path, change, update_manifest: bool = True) -> None:
    """Rewrite ``artifact``'s train_io.npz with ``change(arrays)`` applied (a dict of its arrays, changed in place);
    with ``update_manifest`` the manifest records the new digest (a consistent, but wrong, reference)."""
    path = Path(artifact) / "train_io.npz"
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k].copy() for k in npz.files}
    change(arrays)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    if update_manifest:
        m = load_manifest(artifact)
        write_manifest(artifact, dataclasses.replace(m, training={**m.training, "sha256": sha256_file(path)}))
