"""Evaluating many clients' models at once (trainer.batched.evaluate_many) against one after another."""

from __future__ import annotations

import math

import pytest
import torch
from torch.func import functional_call

from edgemask.trainer import batched
from edgemask.trainer.algorithms import EvalModel
from edgemask.trainer.batched import evaluate_many
from edgemask.trainer.local_training import evaluate
from edgemask.trainer.models import build_model

MODELS = [("mlp", (1, 8, 8), {"hidden": (16, 12)}), ("cnn", (1, 8, 8), {"widths": (4, 6)}),
          ("tiny_mobilenet", (1, 8, 8), {"width": 4, "expand": 2}),  # batch norm: per-client running statistics
          ("char_lstm", (5,), {"hidden": 4, "embed": 3, "fc": (6,)})]  # no vmap rule: one client after another


def _clients(name, shape, args, sizes, shared: bool):
    torch.manual_seed(0)
    model = build_model(name, shape, 7, **args).eval()
    base = {k: v.detach() for k, v in model.named_parameters()}
    bufs = {k: v.detach() for k, v in model.named_buffers()}

    def call(p, b, x):
        return functional_call(model, {**p, **b}, (x,))

    models, data = [], []
    for i, n in enumerate(sizes):
        if shared:  # FedAvg: every client evaluates the very same global tensors
            p, b = base, bufs
        else:
            p = {k: v + 0.3 * torch.randn_like(v) for k, v in base.items()}
            b = {k: (v + 0.5 * torch.rand_like(v.float())).to(v.dtype) if v.is_floating_point() else v
                 for k, v in bufs.items()}
        models.append(EvalModel(p, b, call))
        x = torch.randint(0, 7, (n, *shape)) if name == "char_lstm" else torch.randn(n, *shape)  # 7 tokens
        data.append((x, torch.randint(0, 7, (n,))))
    return models, data


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize(("name", "shape", "args"), MODELS)
def test_many_clients_score_what_each_scores_alone(name, shape, args, shared, monkeypatch):
    sizes = [9, 0, 3, 14, 1]  # unequal test sets (padding), one client with none
    models, data = _clients(name, shape, args, sizes, shared)
    alone = [evaluate(lambda x, m=m: m.forward(m.params, m.buffers, x), x, y) for m, (x, y) in zip(models, data)]
    got = evaluate_many(models, data)
    for (a_acc, a_loss), (g_acc, g_loss), n in zip(alone, got, sizes):
        if n == 0:
            assert math.isnan(g_acc) and math.isnan(g_loss)
            continue
        assert g_acc == a_acc
        assert g_loss == pytest.approx(a_loss, rel=1e-5)
    if not shared:  # the clients' models differ, so a mix-up between clients would show
        assert len({round(loss, 6) for _, loss in alone if not math.isnan(loss)}) == 4
    # several blocks of samples and several chunks of clients give the same scores
    monkeypatch.setattr(batched, "EVAL_SAMPLES_PER_CALL", 8)
    again = evaluate_many(models, data, batch_size=4)
    assert [a for a, _ in again] == pytest.approx([a for a, _ in got], abs=0, nan_ok=True)  # exactly
    assert [lo for _, lo in again] == pytest.approx([lo for _, lo in got], rel=1e-6, nan_ok=True)


def test_models_of_different_kinds_are_grouped_apart():
    mlp_models, mlp_data = _clients("mlp", (1, 8, 8), {"hidden": (16, 12)}, [4, 5], False)
    cnn_models, cnn_data = _clients("cnn", (1, 8, 8), {"widths": (4, 6)}, [6, 2], False)
    models, data = [mlp_models[0], cnn_models[0], mlp_models[1], cnn_models[1]], [mlp_data[0], cnn_data[0],
                                                                                 mlp_data[1], cnn_data[1]]
    alone = [evaluate(lambda x, m=m: m.forward(m.params, m.buffers, x), x, y) for m, (x, y) in zip(models, data)]
    got = evaluate_many(models, data)
    assert [a for a, _ in got] == [a for a, _ in alone]
    assert [lo for _, lo in got] == pytest.approx([lo for _, lo in alone], rel=1e-5)


@pytest.mark.parametrize("model", ["mlp", "tiny_mobilenet"])
def test_per_fedavgs_adaptation_steps_together_are_each_clients_own(model):
    # Per-FedAvg evaluates w_i = w - α ∇f(w; D_i^train): all clients' steps in one batched call, or one by one
    from edgemask.trainer.algorithms.perfedavg import adapt
    from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig
    from edgemask.trainer.data import DataConfig
    from edgemask.trainer.simulation import build_algorithm

    args = {"mlp": {"hidden": [16, 12]}, "tiny_mobilenet": {"width": 4, "expand": 2}}[model]
    cfg = TrainConfig(run=RunConfig(seed=1), data=DataConfig(name="digits", num_clients=5, partition="dirichlet",
                                                             alpha=0.5, samples_per_client=30),
                      model=ModelConfig(model, args), algorithm=AlgorithmConfig("perfedavg", {"alpha": 0.5}))
    algo = build_algorithm(cfg)
    algo.model.eval()  # as the loop evaluates
    ids = list(algo.client_ids)
    together = [dict(m.params) for m in algo.eval_models(ids)]
    alone = [adapt(algo.model_context.call, algo.global_params, algo.global_buffers, d.train_x, d.train_y, 0.5)
             for d in map(algo.dataset.client, ids)]  # the sequential reference's step
    for t, a in zip(together, alone):
        assert max(float((t[k] - a[k]).abs().max()) for k in a) < 1e-5
        assert max(float((t[k] - algo.global_params[k]).abs().max()) for k in a) > 1e-3  # a real step was taken
