"""The FedMask paper's baselines (§4.3): one hand-checkable property each, and the end-to-end comparison on
digits with 2 classes per client."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgemask.trainer import batched_ops
from edgemask.trainer.accounting import tensor_bytes
from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.records import LocalTask
from edgemask.trainer.algorithms.perfedavg import FoMamlLoss
from edgemask.trainer.batched import local_train_batched
from edgemask.trainer.algorithms.topk import top_k_sparsify
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.local_training import evaluate, local_train
from edgemask.trainer.engines import engine_for
from edgemask.trainer.masks import packed_nbytes
from edgemask.trainer.models import head_names
from edgemask.trainer.run_dir import load_run
from edgemask.trainer.sampling import batch_order
from edgemask.trainer.simulation import simulate

from test_batched import lend, named  # a test's own functions and model as registered names


def cfg(algo, clients=2, per_client=40, rounds=1, lr=0.05, args=None, **training) -> TrainConfig:
    return TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": clients, "samples_per_client": per_client},
        "model": {"name": "mlp"}, "algorithm": {"name": algo, "args": args or {}},
        "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": lr, "momentum": 0.9, **training},
    })


def one_update(algo, cid, steps=2, rnd=0):
    task = algo.local_task(cid, rnd)
    task.max_steps = steps
    d = algo.dataset.client(cid)
    res = local_train(task, d.train_x, d.train_y, batch_order(d.num_train, 1, 0, rnd, 0), 16, 0.9)
    return res, algo.client_updates(rnd, [(cid, res)])[0]


def make(algo_name, **kw):
    c = cfg(algo_name, **kw)
    algo = ALGORITHMS.get(algo_name)(c, build_dataset(c.data, c.run.seed), engine_for(c.training))
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
        torch.testing.assert_close(algo.residual_of(cid), torch.where(rest, delta, torch.zeros(())))  # error feedback
        ups.append(upd)
    algo.aggregate(0, ups)
    flat_before = torch.cat([before[p].reshape(-1) for p in algo.names])
    expect = flat_before.clone()
    total = sum(u.num_samples for u in ups)
    for u in ups:
        expect[u.payload["indices"].long()] += u.payload["values"] * u.num_samples / total
    torch.testing.assert_close(torch.cat([algo.global_params[p].reshape(-1) for p in algo.names]), expect)


UPLOADS_TOGETHER = {"topk": "values", "bnn_fedavg": "scale:fc1.weight", "scaffold": "scaffold:dc:fc1.weight"}


@pytest.mark.parametrize("name", list(UPLOADS_TOGETHER))
def test_uploads_computed_together_are_each_clients_own(name):
    # client_updates sparsifies / binarizes / updates the control variates of all clients' stacked tensors at
    # once; a list of one client gives each alone. Two equal instances, fed the same trained results for two rounds
    # (Top-k's residuals and SCAFFOLD's c_i carry over).
    from edgemask.trainer.simulation import train_clients

    together_algo, alone_algo = make(name, clients=4, batched=True), make(name, clients=4, batched=True)
    ids = list(together_algo.client_ids)
    for rnd in range(2):
        results = train_clients(together_algo, ids, rnd)  # batched: the tensors are rows of one stack
        together = together_algo.client_updates(rnd, results)
        alone = [alone_algo.client_updates(rnd, [(cid, res)])[0] for cid, res in results]
        for t, a in zip(together, alone):
            assert t.client_id == a.client_id and (t.bytes_up, t.bytes_down) == (a.bytes_up, a.bytes_down)
            assert list(t.payload) == list(a.payload)
            assert all(torch.equal(t.payload[k], a.payload[k]) for k in a.payload), (rnd, t.client_id)
            if name == "topk":
                assert torch.equal(together_algo.residual_of(t.client_id), alone_algo.residual_of(a.client_id))
            if name == "scaffold":
                assert all(torch.equal(v, alone_algo.c_i[a.client_id][k])
                           for k, v in together_algo.c_i[t.client_id].items())
        together_algo.aggregate(rnd, together)
        alone_algo.aggregate(rnd, alone)
        assert all(torch.equal(v, alone_algo.global_params[k]) for k, v in together_algo.global_params.items())
    own = UPLOADS_TOGETHER[name]  # differs between clients: their rows are not mixed up
    assert not torch.equal(together[0].payload[own], together[1].payload[own])


def test_bnn_forward_uses_plus_minus_one_weights_and_one_bit_uploads(monkeypatch):
    algo = make("bnn_fedavg", args={"scale": False})
    seen = {}
    call = algo.model_context.call  # what the task's functions call the model with

    def spy(params, buffers, x):
        seen.update(params)
        return call(params, buffers, x)

    monkeypatch.setattr(algo.model_context, "call", spy)
    res, upd = one_update(algo, algo.client_ids[0])
    for w in ("fc1.weight", "fc2.weight", "out.weight"):
        assert set(seen[w].detach().unique().tolist()) == {-1.0, 1.0}
        assert not set(res.trained[w].unique().tolist()) <= {-1.0, 1.0}  # the shadow weights are real-valued
    bits = sum(packed_nbytes(algo.global_params[w].numel()) for w in algo.binary)
    biases = tensor_bytes({k: v for k, v in algo.global_params.items() if k.endswith("bias")})
    assert upd.bytes_up == bits + biases == 1024 + 1024 + 80 + 4 * (128 + 64 + 10)


def test_bnn_straight_through_gradient_is_cancelled_outside_one():
    from edgemask.trainer.algorithms.bnn_fedavg import binarize_ste

    w = torch.tensor([-2.0, -0.5, 0.3, 1.5], requires_grad=True)
    b = binarize_ste(w, scale=False)
    assert b.tolist() == [-1, -1, 1, 1]
    (b * torch.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
    assert w.grad.tolist() == [0.0, 2.0, 3.0, 0.0]


def test_bnn_shadow_weights_are_clipped_to_one_after_every_step(monkeypatch):
    """Hubara et al. Algorithm 1: W ← clip(W − η·g, −1, 1). A huge rate throws every unclipped weight far out."""
    # At η = 1e3 the batched matmul's summation order (trainer.batched_ops' linear rule) shows in the 5th digit:
    # compared under PyTorch's own vmap rules, which sum as the sequential loop does.
    monkeypatch.setattr(batched_ops, "_ROUTES", {})
    algo = make("bnn_fedavg", clients=3, lr=1e3)
    tasks, data, orders = [], [], []
    for i, cid in enumerate(algo.client_ids):
        tasks.append(algo.local_task(cid, 0))
        d = algo.dataset.client(cid)
        data.append((d.train_x[: 8 * (i + 1)], d.train_y[: 8 * (i + 1)]))  # 1, 2, 3 steps: idle clients too
        orders.append(batch_order(8 * (i + 1), 1, 0, 0, i))
    seq = [local_train(t, x, y, o, 8, 0.9) for t, (x, y), o in zip(tasks, data, orders)]
    bat = local_train_batched(tasks, data, orders, 8, 0.9)
    for s, b in zip(seq, bat):
        for w in algo.binary:
            for r in (s, b):
                assert float(r.trained[w].abs().max()) <= 1.0
            assert float(s.trained[w].abs().max()) == 1.0  # the step did try to leave [−1, 1]
            torch.testing.assert_close(b.trained[w], s.trained[w], rtol=1e-5, atol=1e-5)
        assert float(s.trained["fc1.bias"].abs().max()) > 1.0  # biases are not binarized, hence not clipped
    # the straight-through gradient still flows through the clipped weights (|W| ≤ 1 includes the boundary)
    from edgemask.trainer.algorithms.bnn_fedavg import binarize_ste

    w = torch.tensor([-1.0, 1.0], requires_grad=True)
    binarize_ste(w, scale=False).sum().backward()
    assert w.grad.tolist() == [1.0, 1.0]


def _softmax_grad(W, x, y):  # mean cross-entropy of softmax(x Wᵀ): (softmax − onehot)ᵀ x / n
    z = x @ W.T
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    return p.T @ x / len(y)


@pytest.mark.parametrize("n", [8, 6])
def test_perfedavg_first_order_update_by_hand_on_two_different_batches(n):
    """FO-MAML steps on a linear softmax model, computed with numpy: w̃ = w − α∇f(w; D), w ← w − β∇f(w̃; D'),
    D and D' two consecutive minibatches of the client's order (not two halves of one): 8 samples in batches of
    2 make two steps (B0, B1), (B2, B3); 6 samples make (B0, B1), (B2, B0) — the odd batch wraps around."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3)).astype(np.float32)
    Y = rng.integers(0, 2, size=n)
    W0 = rng.normal(size=(2, 3)).astype(np.float32)
    alpha, beta = 0.1, 0.5
    order = rng.permutation(n)
    B = [order[i: i + 2] for i in range(0, n, 2)]
    pairs = [(B[0], B[1]), (B[2], B[3])] if n == 8 else [(B[0], B[1]), (B[2], B[0])]
    W = W0.astype(np.float64)
    for D, D2 in pairs:
        assert not set(D) & set(D2)  # two different batches
        W_tilde = W - alpha * _softmax_grad(W, X[D], Y[D])
        W = W - beta * _softmax_grad(W_tilde, X[D2], Y[D2])

    call = lambda p, b, x: x @ p["w"].T  # noqa: E731
    task = LocalTask({"w": torch.from_numpy(W0.copy())}, lend(), named(lambda p, c, x, b: call(p, b, x)), lr=beta,
                     loss=named(FoMamlLoss(call, alpha)), batches_per_step=2)
    x, y = torch.from_numpy(X), torch.from_numpy(Y)
    res = local_train(task, x, y, [order], batch_size=2)
    np.testing.assert_allclose(res.trained["w"].numpy(), W, rtol=1e-5, atol=1e-6)
    assert res.samples_seen == 8  # four minibatches of 2: with n = 6, B0 serves twice
    # the batched loop takes the same pairs, also next to a client with another plan (one step, 3 + 2 samples)
    x2, y2 = torch.from_numpy(rng.normal(size=(5, 3)).astype(np.float32)), torch.from_numpy(rng.integers(0, 2, 5))
    other = LocalTask({"w": torch.from_numpy(W0.copy())}, task.model, task.forward, lr=beta, loss=task.loss,
                      batches_per_step=2)
    bat = local_train_batched([task, other], [(x, y), (x2, y2)], [[order], [np.arange(5)]], batch_size=3)
    ref = [local_train(t, a, b, [o], batch_size=3) for t, (a, b), o in
           zip([task, other], [(x, y), (x2, y2)], [order, np.arange(5)])]
    for r, q in zip(bat, ref):
        torch.testing.assert_close(r.trained["w"], q.trained["w"], rtol=1e-5, atol=1e-6)
        assert (r.samples_seen, r.loss) == (q.samples_seen, pytest.approx(q.loss, rel=1e-5))


def test_perfedavg_task_takes_two_minibatches_per_step():
    algo = make("perfedavg")
    task = algo.local_task(algo.client_ids[0], 0)
    assert task.batches_per_step == 2
    res, _ = one_update(algo, algo.client_ids[0], steps=1)
    assert res.samples_seen == 16 + 14  # one step: D and D', the client's 30 samples in minibatches of 16


def test_lg_fedavg_uploads_only_the_head_and_keeps_the_representation_personal():
    algo = make("lg_fedavg", args={"warmup_rounds": 0})
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


def test_lg_fedavg_warmup_is_fedavg_on_the_whole_model_then_head_only():
    """Liang et al.'s first stage: W rounds of FedAvg uploading every parameter, then only the head travels (and
    a device's first local round downloads the FedAvg model's representation once)."""
    assert make("lg_fedavg", rounds=10).warmup == 8  # default: ⌊0.8·T⌋ (400 FedAvg rounds of 500 in the paper's code)
    algo = make("lg_fedavg", rounds=4, args={"warmup_rounds": 2})
    head = set(head_names(algo.model))
    full, head_bytes = tensor_bytes(algo.global_params), 4 * (10 * 64 + 10)
    assert not algo.global_buffers and full > 10 * head_bytes
    for rnd in range(4):
        before = {k: v.clone() for k, v in algo.global_params.items()}
        if rnd == 2:  # the switch: every device's representation starts from the FedAvg model
            for cid in algo.client_ids:
                assert torch.equal(algo.local_task(cid, rnd).trainable["fc1.weight"], before["fc1.weight"])
        ups = [one_update(algo, cid, rnd=rnd)[1] for cid in algo.client_ids]
        algo.aggregate(rnd, ups)
        total = sum(u.num_samples for u in ups)
        if rnd < 2:  # FedAvg: the whole model up and down, every parameter averaged
            for u in ups:
                assert set(u.payload) == set(algo.global_params) and u.bytes_up == full == u.bytes_down
            torch.testing.assert_close(algo.global_params["fc1.weight"],
                                       sum(u.payload["fc1.weight"] * u.num_samples / total for u in ups))
            assert not torch.equal(algo.global_params["fc1.weight"], before["fc1.weight"])
        else:
            for u in ups:
                assert set(u.payload) == head and u.bytes_up == head_bytes
                assert u.bytes_down == (full if rnd == 2 else head_bytes)
            assert torch.equal(algo.global_params["fc1.weight"], before["fc1.weight"])  # representation stays local
    a, b = algo.client_ids
    assert not torch.equal(algo.rep[a]["fc1.weight"], algo.rep[b]["fc1.weight"])


def test_lg_fedavg_bytes_per_stage_in_the_history():
    res = simulate(cfg("lg_fedavg", rounds=3, participation=1.0, args={"warmup_rounds": 1}))
    up = {(r["round"], r["client"]): r["value"] for r in res.history if r["metric"] == "bytes_up"}
    full, head_bytes = tensor_bytes(res.algorithm.global_params), 4 * (10 * 64 + 10)
    assert {v for (rnd, _), v in up.items() if rnd == 0} == {full}
    assert {v for (rnd, _), v in up.items() if rnd > 0} == {head_bytes}
    assert res.summary["warmup_rounds"] == 1


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
    # the structured figure (whole dead units only) is the paper's computation cost: never below element sparsity
    assert fm["vs_fedavg"]["flops_train"] <= fm["vs_fedavg"]["flops_train_structured"] <= 1.0
    assert fm["flops_train_structured"] == pytest.approx(fm["vs_fedavg"]["flops_train_structured"]
                                                         / fa["vs_fedavg"]["flops_train"] * fa["flops_train"])
    h = fedmask_vs_fedavg["fedmask"][0].history
    rows = {m: [r["value"] for r in h if r["metric"] == m] for m in ("flops_fwd", "flops_fwd_structured")}
    assert len(rows["flops_fwd"]) == len(rows["flops_fwd_structured"]) > 0
    assert all(e <= s for e, s in zip(rows["flops_fwd"], rows["flops_fwd_structured"]))
    assert sum(rows["flops_fwd"]) < sum(rows["flops_fwd_structured"])  # 80 % of the last 2 layers pruned


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
