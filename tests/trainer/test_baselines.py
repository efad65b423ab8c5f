"""The FedMask paper's baselines (§4.3): one hand-checkable property each, and the end-to-end comparison on
digits with 2 classes per client."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from trainer.accounting import tensor_bytes
from trainer.algorithms import ALGORITHMS
from trainer.algorithms.base import LocalTask
from trainer.algorithms.perfedavg import fo_maml_loss
from trainer.algorithms.topk import top_k_sparsify
from trainer.config import TrainConfig
from trainer.data import build_dataset
from trainer.local_training import evaluate, local_train
from trainer.masks import packed_nbytes
from trainer.models import head_names
from trainer.run_dir import load_run
from trainer.sampling import batch_order
from trainer.simulation import simulate


def cfg(algo, clients=2, per_client=40, rounds=1, lr=0.05, args=None, **training) -> TrainConfig:
    return TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": clients, "samples_per_client": per_client},
        "model": {"name": "mlp"}, "algorithm": {"name": algo, "args": args or {}},
        "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": lr, "momentum": 0.9, **training},
    })


def one_update(algo, cid, steps=2):
    task = algo.local_task(cid, 0)
    task.max_steps = steps
    d = algo.client_data(cid)
    res = local_train(task, d.train_x, d.train_y, batch_order(d.num_train, 1, 0, 0, 0), 16, 0.9)
    return res, algo.client_update(cid, 0, res)


def make(algo_name, **kw):
    c = cfg(algo_name, **kw)
    algo = ALGORITHMS.get(algo_name)(c, build_dataset(c.data, c.run.seed))
    algo.setup()
    return algo


def test_top_k_selection_by_hand():
    idx, vals = top_k_sparsify(torch.tensor([0.1, -3.0, 2.0, 0.0, -0.5]), 2)
    assert sorted(idx.tolist()) == [1, 2] and idx.dtype == torch.int32
    assert sorted(vals.tolist()) == [-3.0, 2.0]


def test_topk_uploads_exactly_k_values_and_k_indices():
    algo = make("topk")
    n = sum(v.numel() for v in algo.global_params.values())
    k = round(0.1 * n)
    before = {k_: v.clone() for k_, v in algo.global_params.items()}
    ups = []
    for cid in algo.client_ids:
        res, upd = one_update(algo, cid)
        assert upd.payload["indices"].numel() == k == upd.payload["values"].numel()
        assert upd.bytes_up == 8 * k  # float32 value + int32 index, no buffers in the MLP
        delta = torch.cat([(res.trained[p] - before[p]).reshape(-1) for p in algo.names])
        sent = upd.payload["indices"].long()
        rest = torch.ones(n, dtype=torch.bool)
        rest[sent] = False
        assert delta.abs()[sent].min() >= delta.abs()[rest].max()  # the largest |Δ|
        torch.testing.assert_close(algo.residual[cid], torch.where(rest, delta, torch.zeros(())))  # error feedback
        ups.append(upd)
    algo.aggregate(0, ups)
    flat_before = torch.cat([before[p].reshape(-1) for p in algo.names])
    expect = flat_before.clone()
    total = sum(u.num_samples for u in ups)
    for u in ups:
        expect[u.payload["indices"].long()] += u.payload["values"] * u.num_samples / total
    torch.testing.assert_close(torch.cat([algo.global_params[p].reshape(-1) for p in algo.names]), expect)


def test_bnn_forward_uses_plus_minus_one_weights_and_one_bit_uploads():
    algo = make("bnn_fedavg", args={"scale": False})
    seen = {}
    call = algo.call

    def spy(params, buffers, x):
        seen.update(params)
        return call(params, buffers, x)

    algo.call = spy
    res, upd = one_update(algo, algo.client_ids[0])
    for w in ("fc1.weight", "fc2.weight", "out.weight"):
        assert set(seen[w].detach().unique().tolist()) == {-1.0, 1.0}
        assert not set(res.trained[w].unique().tolist()) <= {-1.0, 1.0}  # the shadow weights are real-valued
    bits = sum(packed_nbytes(algo.global_params[w].numel()) for w in algo.binary)
    biases = tensor_bytes({k: v for k, v in algo.global_params.items() if k.endswith("bias")})
    assert upd.bytes_up == bits + biases == 1024 + 1024 + 80 + 4 * (128 + 64 + 10)


def test_bnn_straight_through_gradient_is_cancelled_outside_one():
    from trainer.algorithms.bnn_fedavg import binarize_ste

    w = torch.tensor([-2.0, -0.5, 0.3, 1.5], requires_grad=True)
    b = binarize_ste(w, scale=False)
    assert b.tolist() == [-1, -1, 1, 1]
    (b * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert w.grad.tolist() == [0.0, 2.0, 3.0, 0.0]


def test_perfedavg_first_order_update_by_hand():
    """One FO-MAML step on a linear softmax model, computed with numpy: w̃ = w − α∇f(w; D), w ← w − β∇f(w̃; D')."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(4, 3)).astype(np.float32)
    Y = np.array([0, 1, 1, 0])
    W0 = rng.normal(size=(2, 3)).astype(np.float32)
    alpha, beta = 0.1, 0.5

    def grad(W, x, y):  # mean cross-entropy of softmax(x Wᵀ): (softmax − onehot)ᵀ x / n
        z = x @ W.T
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        return p.T @ x / len(y)

    W_tilde = W0 - alpha * grad(W0, X[:2], Y[:2])
    expected = W0 - beta * grad(W_tilde, X[2:], Y[2:])

    call = lambda p, b, x: x @ p["w"].T  # noqa: E731
    task = LocalTask({"w": torch.from_numpy(W0.copy())}, forward=lambda p, c, x, b: call(p, b, x), lr=beta,
                     loss=fo_maml_loss(call, alpha))
    res = local_train(task, torch.from_numpy(X), torch.from_numpy(Y), [np.arange(4)], batch_size=4)
    np.testing.assert_allclose(res.trained["w"].numpy(), expected, rtol=1e-5, atol=1e-6)


def test_lg_fedavg_uploads_only_the_head_and_keeps_the_representation_personal():
    algo = make("lg_fedavg")
    head = set(head_names(algo.model))
    assert head == {"out.weight", "out.bias"}
    init = {k: v.clone() for k, v in algo.global_params.items()}
    ups = [one_update(algo, cid)[1] for cid in algo.client_ids]
    for u in ups:
        assert set(u.payload) == head
        assert u.bytes_up == 4 * (10 * 64 + 10) == u.bytes_down
    algo.aggregate(0, ups)
    a, b = algo.client_ids
    assert not torch.equal(algo.rep[a]["fc1.weight"], algo.rep[b]["fc1.weight"])
    assert torch.equal(algo.global_params["fc1.weight"], init["fc1.weight"])  # never averaged
    total = sum(u.num_samples for u in ups)
    torch.testing.assert_close(algo.global_params["out.weight"],
                               sum(u.payload["out.weight"] * u.num_samples / total for u in ups))


def test_standalone_communicates_nothing_and_trains_every_round():
    res = simulate(cfg("standalone", clients=3, per_client=30, rounds=2, participation=0.34))
    h = [r for r in res.history if r["metric"] in ("bytes_up", "bytes_down")]
    assert h and all(r["value"] == 0 for r in h)
    assert res.summary["bytes_up"] == 0 == res.summary["bytes_down"]
    trained = {(r["round"], r["client"]) for r in res.history if r["metric"] == "train_loss"}
    assert len(trained) == 2 * 3  # every client in every round although only 1 of 3 is sampled


# -- end to end on digits with 2 classes per client -------------------------------------------------------------
def digits(algo, **over) -> TrainConfig:
    d = TrainConfig.load(f"configs/digits-{algo}.toml").to_dict()
    d["training"].update({"rounds": 3, "local_epochs": 1, **over})
    return TrainConfig.from_dict(d)


@pytest.fixture(scope="module")
def fedmask_vs_fedavg(tmp_path_factory):
    out = {}
    for algo in ("fedavg", "fedmask"):
        res = simulate(digits(algo))
        out[algo] = (res, res.write(tmp_path_factory.mktemp(algo) / algo))
    return out


def test_fedmask_beats_fedavg_with_32x_less_upload(fedmask_vs_fedavg):
    fa, fm = fedmask_vs_fedavg["fedavg"][0].summary, fedmask_vs_fedavg["fedmask"][0].summary
    assert fm["mean_accuracy"] > fa["mean_accuracy"] + 0.2
    assert 30 < fa["bytes_up"] / fm["bytes_up"] < 34
    assert fm["vs_fedavg"]["bytes_up"] == pytest.approx(fm["bytes_up"] / fa["bytes_up"])
    assert fm["vs_fedavg"]["flops_train"] < 1.0  # pruned and dead units cost nothing


def reloaded_accuracies(path):
    run = load_run(path)
    accs = {}
    for cid in run.client_ids:
        d = run.dataset.client(cid)
        accs[cid] = evaluate(run.build_model(cid), d.test_x, d.test_y)[0]
    return run, accs


def test_fedmask_run_directory_reloads_to_the_same_accuracy(fedmask_vs_fedavg):
    run, accs = reloaded_accuracies(fedmask_vs_fedavg["fedmask"][1])
    for cid, a in accs.items():
        assert a == pytest.approx(run.summary["clients"][cid]["accuracy"], abs=1e-9)


@pytest.mark.parametrize("algo", ["standalone", "perfedavg", "lg_fedavg", "topk", "bnn_fedavg"])
def test_baseline_run_directory_reloads_to_the_same_accuracy(algo, tmp_path):
    c = cfg(algo, clients=3, per_client=40, rounds=2)
    path = simulate(c).write(tmp_path / algo)
    run, accs = reloaded_accuracies(path)
    assert len(accs) == 3
    for cid, a in accs.items():
        assert a == pytest.approx(run.summary["clients"][cid]["accuracy"], abs=1e-9)
