"""Each algorithm of issue 4 writes a run directory whose clients reload (``load_run(p).build_model(cid)``) to
exactly the accuracy the run recorded — masks and personal parameters (``client_state``) included."""

from __future__ import annotations

import pytest
import torch

from edgemask.trainer.config import TrainConfig
from edgemask.trainer.local_training import evaluate
from edgemask.trainer.run_dir import load_run
from edgemask.trainer.simulation import simulate

CASES = {
    "fedprox": {},
    "fedpews": {"warmup_rounds": 1},
    "fedpews_fixed": {"warmup_rounds": 1},
    "perfedmask": {"nu": 0.5, "budget": 0.6, "finetune_epochs": 1},
    "fedselect": {"p": 0.5, "L": 2, "E": 1, "localalt_epochs": 1},
    "fedper": {},
    "fedrep": {"head_epochs": 1},
    "fedbabu": {"finetune_epochs": 1},
    "ditto": {"lam": 0.1},
    "heterofl": {"rates": [1.0, 0.5]},
}


def _cfg(algo: str, args: dict) -> TrainConfig:
    return TrainConfig.from_dict({
        "run": {"seed": 3, "run_id": f"reload-{algo}"},
        "data": {"name": "digits", "num_clients": 3, "samples_per_client": 60},
        "model": {"name": "mlp", "args": {"hidden": [16, 12]}},
        "algorithm": {"name": algo, "args": args},
        "training": {"rounds": 2, "batch_size": 16, "lr": 0.1},
    })


@pytest.mark.parametrize("algo", sorted(CASES))
def test_run_directory_reloads_to_recorded_accuracy(algo, tmp_path):
    res = simulate(_cfg(algo, CASES[algo]))
    run = load_run(res.write(tmp_path / f"reload-{algo}"))
    assert run.summary["algorithm"] == algo
    for cid in run.client_ids:
        d = run.dataset.client(cid)
        model = run.build_model(cid)
        with torch.no_grad():
            acc, _ = evaluate(model, d.test_x, d.test_y)
        assert acc == pytest.approx(run.summary["clients"][cid]["accuracy"], abs=1e-9), cid
