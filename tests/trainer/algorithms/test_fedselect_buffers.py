"""FedSelect's personalized model is the client's own, batch-norm running statistics included: local training
resumes from them, so evaluation and the run directory use them too (not the server's average)."""

from __future__ import annotations

import pytest
import torch

from edgemask.trainer.config import TrainConfig
from edgemask.trainer.local_training import evaluate
from edgemask.trainer.run_dir import load_run
from edgemask.trainer.simulation import simulate


def test_fedselect_evaluates_and_saves_each_client_with_its_own_batch_norm_statistics(tmp_path):
    cfg = TrainConfig.from_dict({
        "run": {"seed": 3, "run_id": "fedselect-bn"},
        "data": {"name": "digits", "num_clients": 3, "samples_per_client": 40},
        "model": {"name": "tiny_mobilenet", "args": {"width": 4, "expand": 2}},
        "algorithm": {"name": "fedselect", "args": {"p": 0.5, "L": 1, "E": 1, "localalt_epochs": 1}},
        "training": {"rounds": 1, "batch_size": 16, "lr": 0.05},
    })
    res = simulate(cfg)
    algo = res.algorithm
    algo.model.eval()  # as the round loop evaluates: batch norm on its running statistics
    name = "stem_bn.running_mean"
    run = load_run(res.write(tmp_path / "fedselect-bn"))
    for cid in algo.client_ids:
        own = algo.buffers[cid]  # where its next local training resumes (local_task)
        assert torch.equal(algo.local_task(cid, 1).buffers[name], own[name])
        assert not torch.equal(own[name], algo.global_buffers[name])  # the server's average differs
        ev = algo.eval_models([cid])[0]
        assert all(torch.equal(ev.buffers[k], v) for k, v in own.items()), cid
        d = algo.dataset.client(cid)
        acc, _ = evaluate(lambda x: algo.model_context.call(algo.client_model(cid), own, x), d.test_x, d.test_y)
        assert res.summary["clients"][cid]["accuracy"] == pytest.approx(acc, abs=1e-12)
        saved = dict(run.build_model(cid).base.named_buffers())  # what export reads from the run directory
        assert torch.equal(saved[name], own[name]), cid
        with torch.no_grad():
            reloaded, _ = evaluate(run.build_model(cid), d.test_x, d.test_y)
        assert reloaded == pytest.approx(acc, abs=1e-9), cid
