"""SCAFFOLD, FedNova and MOON: each one's update checked against a hand computation that a wrong implementation
(a sign flipped, K instead of ‖a‖₁, FedAvg weights, anchors swapped) does not reproduce; then each end to end."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from edgemask.trainer.accounting import tensor_bytes
from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.aggregation import momentum_norm
from edgemask.trainer.algorithms.fednova import NORM_KEY, normalized_average
from edgemask.trainer.algorithms.moon import contrastive_loss, representation_call
from edgemask.trainer.algorithms.scaffold import DC_PREFIX, client_control_update
from edgemask.trainer.batched import local_train_batched
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.local_training import evaluate, local_train
from edgemask.trainer.run_dir import load_run
from edgemask.trainer.sampling import batch_order
from edgemask.trainer.simulation import simulate
from edgemask.trainer.task_program import program


def cfg(algo, clients=2, per_client=40, rounds=1, model="mlp", model_args=None, args=None, data=None,
        **training) -> TrainConfig:
    return TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": clients, "samples_per_client": per_client, **(data or {})},
        "model": {"name": model, "args": model_args or {}}, "algorithm": {"name": algo, "args": args or {}},
        "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": 0.05, **training},
    })


def make(algo_name, **kw):
    c = cfg(algo_name, **kw)
    algo = ALGORITHMS.get(algo_name)(c, build_dataset(c.data, c.run.seed))
    algo.setup()
    return algo


def train(algo, cid, rnd=0):
    """The sequential loop on client ``cid``'s round-``rnd`` task, as simulate runs it."""
    t, d = algo.cfg.training, algo.dataset.client(cid)
    order = batch_order(d.num_train, algo.cfg.training.local_epochs, algo.cfg.run.seed, rnd, algo.client_ids.index(cid))
    return local_train(algo.local_task(cid, rnd), d.train_x, d.train_y, order, t.batch_size, t.momentum,
                       t.weight_decay), order


def _softmax_grads(W, b, x, y):  # mean cross-entropy of softmax(x Wᵀ + b): ((p − onehot)ᵀ x, Σ(p − onehot)) / n
    z = x @ W.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    return p.T @ x / len(y), p.sum(0) / len(y)


# -- SCAFFOLD ---------------------------------------------------------------------------------------------------
def test_scaffold_local_steps_control_variates_and_server_update_by_hand():
    """A linear softmax model (mlp without hidden layers), 2 of N = 3 clients, η_g = 0.5, nonzero c and c_i:
    the corrected steps y ← y − η(g − c_i + c), option II c_i⁺ = c_i − c + (x − y)/(Kη) with K = ⌈30/16⌉ = 2,
    x ← x + η_g mean(Δy), c ← c + (|S|/N) mean(Δc) — all in numpy."""
    algo = make("scaffold", clients=3, model_args={"hidden": []}, args={"server_lr": 0.5}, lr=0.1)
    assert set(algo.global_params) == {"out.weight", "out.bias"}
    g = torch.Generator().manual_seed(0)
    algo.c = {k: 0.1 * torch.randn(v.shape, generator=g) for k, v in algo.global_params.items()}
    for cid in algo.client_ids:
        algo.c_i[cid] = {k: 0.1 * torch.randn(v.shape, generator=g) for k, v in algo.global_params.items()}
    x = {k: v.double().numpy().copy() for k, v in algo.global_params.items()}
    c = {k: v.double().numpy() for k, v in algo.c.items()}
    a, b = algo.client_ids[:2]
    ci = {cid: {k: v.double().numpy() for k, v in algo.c_i[cid].items()} for cid in (a, b)}
    ups, ys, dcs = [], {}, {}
    for cid in (a, b):
        res, order = train(algo, cid)
        d = algo.dataset.client(cid)
        assert d.num_train == 30  # two steps of 16 and 14 samples
        X, Y = d.train_x.flatten(1).double().numpy(), d.train_y.numpy()
        W, bias = x["out.weight"].copy(), x["out.bias"].copy()
        for s in range(0, 30, 16):
            idx = order[0][s: s + 16]
            gW, gb = _softmax_grads(W, bias, X[idx], Y[idx])
            W -= 0.1 * (gW - ci[cid]["out.weight"] + c["out.weight"])
            bias -= 0.1 * (gb - ci[cid]["out.bias"] + c["out.bias"])
        ys[cid] = {"out.weight": W, "out.bias": bias}
        np.testing.assert_allclose(res.trained["out.weight"].numpy(), W, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res.trained["out.bias"].numpy(), bias, rtol=1e-5, atol=1e-6)
        ups.append(algo.client_updates(0, [(cid, res)])[0])
        dcs[cid] = {}
        for k in x:
            c_plus = ci[cid][k] - c[k] + (x[k] - ys[cid][k]) / (2 * 0.1)  # option II, K = 2
            np.testing.assert_allclose(algo.c_i[cid][k].numpy(), c_plus, rtol=1e-4, atol=1e-5)
            dcs[cid][k] = c_plus - ci[cid][k]
            np.testing.assert_allclose(ups[-1].payload[DC_PREFIX + k].numpy(), dcs[cid][k], rtol=1e-4, atol=1e-5)
    untouched = algo.c_i[algo.client_ids[2]]["out.bias"].clone()
    algo.aggregate(0, ups)
    for k in x:
        x_new = x[k] + 0.5 * ((ys[a][k] - x[k]) + (ys[b][k] - x[k])) / 2
        c_new = c[k] + (2 / 3) * (dcs[a][k] + dcs[b][k]) / 2
        np.testing.assert_allclose(algo.global_params[k].numpy(), x_new, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(algo.c[k].numpy(), c_new, rtol=1e-4, atol=1e-5)
    assert torch.equal(algo.c_i[algo.client_ids[2]]["out.bias"], untouched)  # an unsampled client keeps its c_i


def test_scaffold_uploads_model_and_control_delta_downloads_model_and_c():
    algo = make("scaffold", momentum=0.9)
    res, _ = train(algo, algo.client_ids[0])
    upd = algo.client_updates(0, [(algo.client_ids[0], res)])[0]
    model = tensor_bytes(algo.global_params)
    assert not algo.global_buffers and upd.bytes_up == 2 * model == upd.bytes_down
    assert algo.local_steps(algo.client_ids[0]) == momentum_norm(2, 0.9)  # 30 samples, B = 16: K = 2, under ρ


def test_scaffold_option_two_recovers_the_gradient_under_momentum():
    """With a constant gradient g, y_i − x = −η‖a‖₁(g + c − c_i) for SGD with momentum ρ, so option II with
    ‖a‖₁ (K when ρ = 0) gives c_i⁺ = g exactly; dividing by K would inflate it ‖a‖₁/K-fold."""
    gvec, c, ci = torch.tensor([0.3, -1.2]), torch.tensor([0.1, 0.2]), torch.tensor([-0.4, 0.05])
    for rho, K in ((0.0, 5), (0.9, 5), (0.5, 3)):
        y = torch.zeros(2, requires_grad=True)
        opt = torch.optim.SGD([y], lr=0.1, momentum=rho)
        for _ in range(K):
            opt.zero_grad()
            ((y * gvec).sum() + (y * (c - ci)).sum()).backward()  # f(y) = ⟨g, y⟩ plus SCAFFOLD's term
            opt.step()
        c_plus = client_control_update(ci, c, torch.zeros(2), y.detach(), 0.1 * momentum_norm(K, rho))
        torch.testing.assert_close(c_plus, gvec)
        if rho:  # the paper's K (plain SGD) would not
            by_k = client_control_update(ci, c, torch.zeros(2), y.detach(), 0.1 * K)
            assert momentum_norm(K, rho) > K and not torch.allclose(by_k, gvec, rtol=0.1)


# -- FedNova ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tau,rho", [(1, 0.9), (2, 0.5), (4, 0.5), (7, 0.9), (3, 0.0)])
def test_fednova_momentum_norm_is_the_displacement_of_torch_sgd(tau, rho):
    """‖a‖₁ = [τ − ρ(1 − ρ^τ)/(1 − ρ)]/(1 − ρ) is how far τ steps of torch's SGD with momentum go on a unit gradient,
    in units of η (τ = 2, ρ = 0.5: 1 + 1.5 = 2.5; τ = 4: 1 + 1.5 + 1.75 + 1.875 = 6.125)."""
    y = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([y], lr=0.01, momentum=rho)
    for _ in range(tau):
        opt.zero_grad()
        y.sum().backward()
        opt.step()
    assert momentum_norm(tau, rho) == pytest.approx(float(-y.detach()) / 0.01, rel=1e-5)
    assert momentum_norm(2, 0.5) == 2.5 and momentum_norm(4, 0.5) == 6.125


def test_fednova_client_without_a_step_moves_nothing_and_no_client_keeps_x():
    """p = (1/2, 1/2), ‖a‖₁ = (2, 0): τ_eff = 1 and only client 1 moves x: x − (1/2)(x − y_1)/2 = (3x + y_1)/4;
    with no client at all the model stays."""
    x = {"w": torch.tensor([1.0, 2.0])}
    ys = [{"w": torch.tensor([0.0, 0.0])}, {"w": torch.tensor([5.0, 5.0])}]
    assert torch.equal(normalized_average(x, ys, [2.0, 0.0], [1, 1])["w"], torch.tensor([0.75, 1.5]))
    assert torch.equal(normalized_average(x, [], [], [])["w"], x["w"])


def test_fednova_aggregate_by_hand_with_unequal_steps_and_momentum():
    """x = 1; client 1: n = 1, τ = 2, y = 0; client 2: n = 3, τ = 4, y = −2; ρ = 0.5, so ‖a‖₁ = 2.5 and 6.125.
    d = (1/2.5, 3/6.125), p = (1/4, 3/4), τ_eff = 2.5/4 + 3·6.125/4; FedAvg would give −1.5."""
    x = {"w": torch.tensor([1.0])}
    ys = [{"w": torch.tensor([0.0])}, {"w": torch.tensor([-2.0])}]
    got = normalized_average(x, ys, [momentum_norm(2, 0.5), momentum_norm(4, 0.5)], [1, 3])["w"]
    tau_eff = 0.25 * 2.5 + 0.75 * 6.125
    expect = 1.0 - tau_eff * (0.25 * 1 / 2.5 + 0.75 * 3 / 6.125)
    assert float(got) == pytest.approx(expect, rel=1e-6)
    assert abs(expect - (-1.5)) > 0.05  # ≈ −1.439
    # and through the algorithm's hooks: τ_i from the client's own sample count, ‖a_i‖₁ in the upload
    algo = make("fednova", clients=3, data={"partition": "dirichlet"}, momentum=0.5, local_epochs=2)
    sizes = [algo.dataset.client(c).num_train for c in algo.client_ids]
    assert len(set(sizes)) > 1
    ups = []
    for cid, n in zip(algo.client_ids, sizes):
        res, _ = train(algo, cid)
        upd = algo.client_updates(0, [(cid, res)])[0]
        assert float(upd.payload[NORM_KEY]) == pytest.approx(momentum_norm(2 * math.ceil(n / 16), 0.5))
        assert upd.bytes_up == tensor_bytes(algo.global_params) + 4  # y_i and one float32
        ups.append(upd)
    x0 = {k: v.clone() for k, v in algo.global_params.items()}
    algo.aggregate(0, ups)
    norms = [float(u.payload[NORM_KEY]) for u in ups]
    p = [n / sum(sizes) for n in sizes]
    tau_eff = sum(pi * a for pi, a in zip(p, norms))
    for k in x0:
        by_hand = x0[k] - tau_eff * sum(pi * (x0[k] - u.payload[k]) / a for pi, a, u in zip(p, norms, ups))
        torch.testing.assert_close(algo.global_params[k], by_hand)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_is_fedavg_when_every_client_takes_the_same_steps(momentum):
    """Equal τ_i (3 clients of 30 samples) and so equal ‖a_i‖₁: FedNova's update is FedAvg's Σ p_i y_i, whatever
    the momentum; a run of both ends at the same model."""
    runs = {a: simulate(cfg(a, clients=3, rounds=2, momentum=momentum)) for a in ("fedavg", "fednova")}
    assert len({c.num_train for c in runs["fednova"].algorithm.dataset.clients}) == 1
    fa, fn = runs["fedavg"].algorithm.global_params, runs["fednova"].algorithm.global_params
    for k in fa:
        torch.testing.assert_close(fn[k], fa[k], rtol=1e-5, atol=1e-6)
    x = {"w": torch.tensor([2.0, -1.0])}
    ys = [{"w": torch.tensor([0.5, 1.0])}, {"w": torch.tensor([3.0, -4.0])}]
    torch.testing.assert_close(normalized_average(x, ys, [6.125, 6.125], [1, 3])["w"], torch.tensor([2.375, -2.75]))


# -- MOON -------------------------------------------------------------------------------------------------------
def test_moon_contrastive_loss_by_hand():
    """Row 1: z = (1, 0), z_glob = (1, 1) (cos 1/√2), z_prev = (0, 2) (cos 0), τ = 0.5: log(1 + e^{−√2}).
    Row 2: z = (1, 1), z_glob = (−1, −1) (cos −1), z_prev = (3, 3) (cos 1): log(1 + e^{4})."""
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    zg = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    zp = torch.tensor([[0.0, 2.0], [3.0, 3.0]])
    expect = 0.5 * (math.log(1 + math.exp(-math.sqrt(2))) + math.log(1 + math.exp(4)))
    assert float(contrastive_loss(z, zg, zp, 0.5)) == pytest.approx(expect, rel=1e-6)
    assert float(contrastive_loss(z, zp, zg, 0.5)) != pytest.approx(expect, rel=1e-2)  # anchors matter
    r = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    a = torch.randn(5, 7, generator=torch.Generator().manual_seed(1))
    assert float(contrastive_loss(r, a, a, 0.5)) == pytest.approx(math.log(2), rel=1e-6)


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_moon_representation_is_the_input_of_the_head(model):
    algo = make("moon", model=model)
    x = algo.dataset.client(algo.client_ids[0]).train_x[:5]
    p = algo.global_params
    z, logits = representation_call(algo.model, "out", {**p, **algo.global_buffers}, x)
    if model == "mlp":  # relu(fc2(relu(fc1 x)))
        h = torch.relu(x.flatten(1) @ p["fc1.weight"].T + p["fc1.bias"])
        expect = torch.relu(h @ p["fc2.weight"].T + p["fc2.bias"])
    else:  # global average of relu(conv2(maxpool(relu(conv1 x))))
        h = torch.max_pool2d(torch.relu(torch.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=1)), 2)
        expect = torch.relu(torch.conv2d(h, p["conv2.weight"], p["conv2.bias"], padding=1)).mean(dim=(2, 3))
    torch.testing.assert_close(z, expect)
    torch.testing.assert_close(logits, expect @ p["out.weight"].T + p["out.bias"])


def test_moon_task_loss_is_cross_entropy_plus_mu_contrastive_with_global_and_previous_model():
    """CE + μ ℓ_con by hand on the MLP, with the local, global and previous models all different: swapping the
    global and previous anchors (or dropping μ) gives another value."""
    algo = make("moon", model_args={"hidden": [16, 12]}, args={"mu": 2.0, "tau": 0.5})
    cid = algo.client_ids[0]
    g = torch.Generator().manual_seed(0)
    assert torch.equal(algo.local_task(cid, 0).constants["moon:prev:fc1.weight"], algo.global_params["fc1.weight"])
    noisy = lambda: {k: v + 0.3 * torch.randn(v.shape, generator=g) for k, v in algo.global_params.items()}  # noqa
    prev, local = noisy(), noisy()
    res, _ = train(algo, cid)
    algo.client_updates(0, [(cid, res)])[0]
    task = algo.local_task(cid, 1)
    assert torch.equal(task.constants["moon:prev:fc1.weight"], res.trained["fc1.weight"])  # last participation
    task.constants.update({f"moon:prev:{k}": v for k, v in prev.items()})
    d = algo.dataset.client(cid)
    x, y = d.train_x[:8], d.train_y[:8]

    def rep(p):
        h = torch.relu(x.flatten(1) @ p["fc1.weight"].T + p["fc1.bias"])
        return torch.relu(h @ p["fc2.weight"].T + p["fc2.bias"]).double()

    z, zg, zp = rep(local), rep(algo.global_params), rep(prev)
    ce = torch.nn.functional.cross_entropy(rep(local).float() @ local["out.weight"].T + local["out.bias"], y)
    cos = lambda u, v: (u * v).sum(1) / (u.norm(dim=1) * v.norm(dim=1))  # noqa: E731
    pos, neg = torch.exp(cos(z, zg) / 0.5), torch.exp(cos(z, zp) / 0.5)
    con = float(-torch.log(pos / (pos + neg)).mean())
    got = program(task).loss({k: v.clone().requires_grad_(True) for k, v in local.items()}, task.constants, x, y, {})
    assert float(got.detach()) == pytest.approx(float(ce) + 2.0 * con, rel=1e-5)
    swapped = float(-torch.log(neg / (pos + neg)).mean())
    assert abs(con - swapped) > 1e-3 and con > 1e-3


@pytest.mark.parametrize("model", ["cnn", "tiny_mobilenet"])
def test_moon_batched_matches_sequential_on_conv_and_batch_norm_models(model):
    """Stacked clients, each with its own previous model (one at its first participation), batch norm included:
    the vmapped loss (hooked representation, eval-mode anchors) equals the sequential one, and the anchors'
    running statistics are never updated."""
    algo = make("moon", clients=3, model=model, data={"partition": "dirichlet"}, momentum=0.9, batch_size=8)
    g = torch.Generator().manual_seed(0)
    for cid in algo.client_ids[1:]:
        algo.previous[cid] = {k: v + 0.1 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v.clone()
                              for k, v in {**algo.global_params, **algo.global_buffers}.items()}
    tasks = [algo.local_task(cid, 0) for cid in algo.client_ids]
    data = [(algo.dataset.client(c).train_x, algo.dataset.client(c).train_y) for c in algo.client_ids]
    orders = [batch_order(len(y), 1, 0, 0, i) for i, (_, y) in enumerate(data)]
    anchors = {k: v.clone() for k, v in tasks[1].constants.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fallback to the sequential loop would warn
        bat = local_train_batched(tasks, data, orders, 8, 0.9)
    for t, (x, y), o, r in zip(tasks, data, orders, bat):
        ref = local_train(t, x, y, o, 8, 0.9)
        for k in ref.trained:
            torch.testing.assert_close(r.trained[k], ref.trained[k], rtol=1e-4, atol=1e-5)
        for k in ref.buffers:
            torch.testing.assert_close(r.buffers[k], ref.buffers[k], rtol=1e-4, atol=1e-5)
        assert r.loss == pytest.approx(ref.loss, rel=1e-5)
    for k, v in anchors.items():
        assert torch.equal(tasks[1].constants[k], v), k
    if model == "tiny_mobilenet":
        assert algo.global_buffers and not torch.equal(bat[0].buffers["stem_bn.running_mean"],
                                                       algo.global_buffers["stem_bn.running_mean"])


# -- end to end -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("algo,up_ratio", [("scaffold", 2.0), ("fednova", None), ("moon", 1.0)])
def test_end_to_end_on_digits_and_run_directory_reloads(algo, up_ratio, tmp_path):
    res = simulate(cfg(algo, clients=3, rounds=2, momentum=0.9))
    fedavg_bytes = tensor_bytes(res.algorithm.global_params)
    ups = [r["value"] for r in res.history if r["metric"] == "bytes_up"]
    assert len(ups) == 6 and all(math.isfinite(r["value"]) for r in res.history if r["metric"] == "train_loss")
    if up_ratio is not None:
        assert res.summary["vs_fedavg"]["bytes_up"] == pytest.approx(up_ratio)
    else:  # FedNova: the model and ‖a_i‖₁
        assert set(ups) == {fedavg_bytes + 4}
    run = load_run(res.write(tmp_path / algo))
    for cid in run.client_ids:
        d = run.dataset.client(cid)
        with torch.no_grad():
            acc, _ = evaluate(run.build_model(cid), d.test_x, d.test_y)
        assert acc == pytest.approx(run.summary["clients"][cid]["accuracy"], abs=1e-9)
    if algo == "scaffold":  # the server's control variate moved
        assert any(float(v.abs().max()) > 0 for v in res.algorithm.c.values())


def test_unknown_argument_names_the_valid_ones():
    from edgemask.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^config: \[algorithm.args\] temperature: unknown field; "
                                          r"valid fields: mu, tau$"):
        make("moon", args={"temperature": 0.5})
