"""FedMask as the paper specifies it (Li et al., SenSys 2021): each test asserts a value a wrong implementation
would not produce."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from edgemask.trainer.accounting import tensor_bytes
from edgemask.trainer.aggregation import personalization_preserving
from edgemask.trainer.algorithms.fedmask import FedMask, group_lasso
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.data.base import ClientData, FederatedDataset
from edgemask.trainer.local_training import local_train
from edgemask.trainer.masks import binarize, pack_bits, packed_nbytes
from edgemask.trainer.models.masking import MaskSite, effective_params
from edgemask.trainer.records import ClientUpdate
from edgemask.trainer.sampling import batch_order
from edgemask.trainer.engines import engine_for
from edgemask.trainer.task_program import program


def cfg(algo="fedmask", model="mlp", clients=2, per_client=40, model_args=None, **args) -> TrainConfig:
    return TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": clients, "samples_per_client": per_client},
        "model": {"name": model, "args": model_args or {}},
        "algorithm": {"name": algo, "args": args},
        "training": {"rounds": 1, "local_epochs": 1, "batch_size": 16, "lr": 100.0, "momentum": 0.9},
    })


@pytest.fixture(scope="module")
def fedmask_digits():
    c = cfg(prune_rate=0.2, prune_last=2, lambda_r=0.002)
    algo = FedMask(c, build_dataset(c.data, c.run.seed), engine_for(c.training))
    algo.setup()
    return algo


def test_personalization_preserving_aggregation_on_hand_built_masks():
    # 3 uploads, 6 elements. Element 4 is kept by upload 0 alone: its value; element 5 by none: the previous global.
    masks = [torch.tensor([1., 0, 1, 1, 1, 0]), torch.tensor([1., 1, 0, 0, 0, 0]), torch.tensor([0., 1, 1, 1, 1, 0])]
    keeps = [torch.tensor([1., 1, 1, 0, 1, 0]), torch.tensor([1., 1, 0, 1, 0, 0]), torch.tensor([0., 1, 1, 1, 0, 0])]
    previous = torch.tensor([0., 0, 0, 0, 0, 1])
    out, kept = personalization_preserving(previous, masks, keeps)
    # kept by: e0 {0,1} -> (1+1)/2; e1 {0,1,2} -> (0+1+1)/3; e2 {0,2} -> (1+1)/2; e3 {1,2} -> (0+1)/2; e4 {0} -> 1
    torch.testing.assert_close(out, torch.tensor([1., 2 / 3, 1, .5, 1, 1]))
    assert kept.tolist() == [True] * 5 + [False]
    assert binarize(out).tolist() == [1, 1, 1, 1, 1, 1]  # the global mask: 1 bit per element


def _hand_global(previous, sent, keeps):
    """§3.6 element by element: the mean over the uploads that keep it, binarized at 0.5; else ``previous``."""
    out = previous.clone().reshape(-1)
    for e in range(out.numel()):
        vals = [float(m.reshape(-1)[e]) for m, k in zip(sent, keeps) if k.reshape(-1)[e] == 1]
        if vals:
            out[e] = 1.0 if sum(vals) / len(vals) >= 0.5 else 0.0
    return out.reshape(previous.shape)


def test_server_aggregate_is_personalization_preserving_for_pruned_and_unpruned_layers():
    # Fig. 7-8 on the clients' one-shot structures, every client sampled; a layer nobody pruned is averaged over all
    # K clients, and all of them then start from one and the same tensor (no per-client copy)
    c = cfg(clients=3, prune_rate=0.2, prune_last=2, lambda_r=0.002)
    algo = FedMask(c, build_dataset(c.data, c.run.seed), engine_for(c.training))
    algo.setup()
    g = torch.Generator().manual_seed(0)
    sent = {cid: {w: (torch.rand(k.shape, generator=g) < 0.5).float() * k for w, k in algo.keep[cid].items()}
            for cid in algo.client_ids}
    updates = [ClientUpdate(cid, 10, sent[cid], 0, 0, 0.0) for cid in algo.client_ids]
    algo.aggregate(0, updates)
    s = algo.args.init_scale
    for w in ("fc1.weight", "out.weight"):
        keeps = [algo.keep[cid][w] for cid in algo.client_ids]
        want = _hand_global(torch.ones_like(keeps[0]), [sent[cid][w] for cid in algo.client_ids], keeps)
        assert torch.equal(algo.global_mask[w], want), w
        for k, cid in enumerate(algo.client_ids):  # Alg. 1 lines 11 and 14: ±s from m^T ⊙ m_k, 0 where pruned
            assert torch.equal(algo.local_task(cid, 1).trainable[w], (s * (2 * want * keeps[k] - 1)) * keeps[k])
    a, b = algo.client_ids[:2]
    assert algo.start_scores(a)["fc1.weight"] is algo.start_scores(b)["fc1.weight"]  # not pruned: one tensor
    assert not torch.equal(algo.start_scores(a)["out.weight"], algo.start_scores(b)["out.weight"])  # pruned: own


def test_every_client_starts_from_the_one_global_mask_under_partial_participation():
    # Alg. 1 line 11: a selected device starts from m^T ⊙ m_k, the *current* global mask under its own structure,
    # whether or not it was sampled in the rounds that formed m^T. 4 devices, 2 sampled a round.
    c = cfg(clients=4, prune_rate=0.2, prune_last=2, lambda_r=0.002)
    algo = FedMask(c, build_dataset(c.data, c.run.seed), engine_for(c.training))
    algo.setup()
    ids, s = algo.client_ids, algo.args.init_scale
    own = {cid: {w: m.clone() for w, m in algo.masks[cid].items()} for cid in ids}  # m_k from ClientPruning
    g = torch.Generator().manual_seed(1)
    glob = {w: torch.ones_like(m) for w, m in algo.masks[ids[0]].items()}  # m^0 = 1 (Alg. 1 line 2)
    covered = {w: torch.zeros_like(m) for w, m in glob.items()}
    for rnd, sampled in enumerate((ids[:2], ids[2:], ids[1:3])):
        sent = {cid: {w: (torch.rand(k.shape, generator=g) < 0.5).float() * k for w, k in algo.keep[cid].items()}
                for cid in sampled}
        algo.aggregate(rnd, [ClientUpdate(cid, 10, sent[cid], 0, 0, 0.0) for cid in sampled])
        for w in glob:
            keeps = [algo.keep[cid][w] for cid in sampled]
            glob[w] = _hand_global(glob[w], [sent[cid][w] for cid in sampled], keeps)
            covered[w] = torch.clamp(covered[w] + sum(keeps), max=1)
        for cid in ids:  # sampled this round or not: the next start derives from the current global mask
            start = algo.local_task(cid, rnd + 1).trainable
            for w, keep in algo.keep[cid].items():
                m = torch.where(covered[w] == 1, glob[w], own[cid][w]) * keep  # never kept by an upload: m^0 ⊙ m_k
                assert torch.equal(start[w], (s * (2 * m - 1)) * keep), (rnd, cid, w)
        # hence two devices' starts agree wherever both keep an element that some upload has kept
        for a, b in ((ids[0], ids[3]), (ids[1], ids[2])):
            sa, sb = algo.start_scores(a), algo.start_scores(b)
            for w in glob:
                both = (algo.keep[a][w] * algo.keep[b][w] * covered[w]) == 1
                assert torch.equal(sa[w][both], sb[w][both]), (rnd, a, b, w)
    # the unpruned layer: every device's start is the global mask, e.g. device 0 after rounds it did not join
    assert torch.equal(algo.local_task(ids[0], 3).trainable["fc1.weight"], s * (2 * glob["fc1.weight"] - 1))
    assert not torch.equal(glob["fc1.weight"], own[ids[0]]["fc1.weight"])  # not its stale ClientPruning mask


def test_uploads_computed_together_are_each_clients_own():
    # client_updates binarizes all clients' stacked scores at once (Eq. 3); a list of one client gives each alone
    from edgemask.trainer.simulation import train_clients

    c = cfg(clients=3, prune_rate=0.2, prune_last=2, lambda_r=0.002)
    algo = FedMask(c, build_dataset(c.data, c.run.seed), engine_for(c.training))
    algo.setup()
    results = train_clients(algo, list(algo.client_ids), 0)  # batched: the scores are rows of one tensor
    together = algo.client_updates(0, results)
    local_together = {cid: dict(m) for cid, m in algo.local.items()}
    alone = [algo.client_updates(0, [(cid, res)])[0] for cid, res in results]
    for t, a in zip(together, alone):
        assert t.client_id == a.client_id and (t.bytes_up, t.bytes_down) == (a.bytes_up, a.bytes_down)
        assert list(t.payload) == list(a.payload)
        assert all(torch.equal(t.payload[w], a.payload[w]) for w in a.payload)
        assert all(torch.equal(local_together[a.client_id][w], algo.local[a.client_id][w]) for w in a.payload)
        assert float((a.payload["out.weight"] * (1 - algo.keep[a.client_id]["out.weight"])).abs().sum()) == 0
    assert not torch.equal(together[0].payload["fc1.weight"], together[1].payload["fc1.weight"])


def test_packed_sizes():
    for n in range(0, 40):
        assert pack_bits(torch.ones(n)).size == math.ceil(n / 8) == packed_nbytes(n)


def test_fedmask_upload_is_exactly_the_packed_masks(fedmask_digits):
    algo = fedmask_digits
    cid = algo.client_ids[0]
    task = algo.local_task(cid, 0)
    task.max_steps = 1
    d = algo.dataset.client(cid)
    res = local_train(task, d.train_x, d.train_y, batch_order(d.num_train, 1, 0, 0, 0), 16)
    upd = algo.client_updates(0, [(cid, res)])[0]
    # 64-128-64-10 MLP: fc1 128×64, fc2 64×128, out 10×64 -> ⌈8192/8⌉ + ⌈8192/8⌉ + ⌈640/8⌉
    assert upd.bytes_up == 1024 + 1024 + 80 == upd.bytes_down
    dense = tensor_bytes(algo.global_params)
    assert 32 < dense / upd.bytes_up < 33  # 4 bytes per weight and bias vs 1 bit per weight


def test_sigmoid_gradient_factor_through_the_fedmask_forward():
    """Eq. 7-8 under the soft forward (``forward = "soft"``, a deviation kept as an option): ∂L/∂m^r =
    m(1 − m) ⊙ ∂L/∂m with m = σ(m^r). The paper's binary forward: tests/trainer/test_fedmask_fidelity.py."""
    c = cfg(prune_rate=0.2, prune_last=2, lambda_r=0.002, forward="soft")
    algo = FedMask(c, build_dataset(c.data, c.run.seed), engine_for(c.training))
    algo.setup()
    cid = algo.client_ids[0]
    task = algo.local_task(cid, 0)
    d = algo.dataset.client(cid)
    x, y = d.train_x[:8], d.train_y[:8]
    mr = {k: (v + 0.3 * torch.randn_like(v)).requires_grad_(True) for k, v in task.trainable.items()}
    F.cross_entropy(program(task).forward(mr, task.constants, x, task.buffers), y).backward()
    keep = algo.keep[cid]  # pruned elements: σ(m^r)·0 (the task carries only the pruned layers' structure)
    m = {k: (torch.sigmoid(v.detach()) * keep[k]).requires_grad_(True) for k, v in mr.items()}
    F.cross_entropy(algo.model_context.call(effective_params(algo.global_params, m, algo.sites), task.buffers, x), y).backward()
    for w in ("fc1.weight",):  # not pruned: keep = 1 everywhere
        s = m[w].detach()
        torch.testing.assert_close(mr[w].grad, s * (1 - s) * m[w].grad)
        assert mr[w].grad.abs().sum() > 0


def test_one_shot_pruning_keeps_exactly_p_r_of_the_last_layers(fedmask_digits):
    algo = fedmask_digits
    for cid in algo.client_ids:
        keep = algo.keep[cid]
        assert keep["fc1.weight"].sum() == keep["fc1.weight"].numel()  # not among the last 2: 100 %
        for w in ("fc2.weight", "out.weight"):
            assert int(keep[w].sum()) == round(0.2 * keep[w].numel())
            assert float((algo.local[cid][w] * (1 - keep[w])).abs().sum()) == 0  # pruned stays zero
    a, b = algo.client_ids
    assert not torch.equal(algo.keep[a]["out.weight"], algo.keep[b]["out.weight"])  # heterogeneous


def test_group_lasso_value_is_the_group_norm_not_l1():
    site = MaskSite("c", "conv", ("c.weight",), ())
    m = torch.tensor([1., 1, 0, 0]).reshape(2, 1, 1, 2)  # filter 0 = (1, 1), filter 1 = (0, 0); one channel
    # filters: √2 + 0; channel 0: √2  (L1 would give 2 + 2)
    assert float(group_lasso(site, {"c.weight": m})) == pytest.approx(2 * math.sqrt(2), abs=1e-5)


def test_group_lasso_kills_whole_useless_filters():
    """A conv with 6 filters whose last 3 do not reach the output: with the group lasso of Eq. 9-10 their masks
    die as whole filters, the useful ones survive."""
    g = torch.Generator().manual_seed(0)
    W = torch.randn(6, 1, 3, 3, generator=g)
    head = torch.randn(3, 6, generator=g)
    head[:, 3:] = 0  # filters 3-5 are useless
    site = MaskSite("conv", "conv", ("conv.weight",), ())
    x = torch.randn(64, 1, 6, 6, generator=g)

    def net(mask):
        h = torch.relu(F.conv2d(x, W * mask, padding=1)).mean(dim=(2, 3))  # (B, 6)
        return h @ head.T  # (B, 3)

    y = net(torch.ones_like(W)).argmax(1)

    def train(lam):
        mr = torch.full_like(W, 1.0).requires_grad_(True)
        opt = torch.optim.SGD([mr], lr=2.0, momentum=0.9)
        for _ in range(150):
            soft = torch.sigmoid(mr)
            loss = F.cross_entropy(net(soft), y) + lam * group_lasso(site, {"conv.weight": soft})
            opt.zero_grad()
            loss.backward()
            opt.step()
        return binarize(torch.sigmoid(mr.detach()))

    mask = train(0.005)
    per_filter = mask.reshape(6, -1).sum(1)
    assert per_filter[3:].tolist() == [0, 0, 0]  # whole filters dead
    assert per_filter[:3].sum() > 0
    assert (net(mask).argmax(1) == y).float().mean() > 0.9  # the task is still solved
    assert train(0.0).reshape(6, -1).sum(1)[3:].tolist() == [9, 9, 9]  # without R_g nothing kills them


def test_lstm_partial_mask_trains_the_output_gate_and_masks_the_others():
    torch.manual_seed(0)
    T, V = 6, 5

    def client(i):
        x = torch.randint(0, V, (24, T))
        return ClientData(f"client-{i:03d}", x[:16], x[:16, -1] % V, x[16:], x[16:, -1] % V)

    ds = FederatedDataset("toy", (T,), V, (client(0), client(1)), input_dtype="int64")
    c = TrainConfig.from_dict({"data": {"name": "digits", "num_clients": 2},
                               "model": {"name": "char_lstm", "args": {"hidden": 4, "embed": 3, "fc": [6, 5]}},
                               "algorithm": {"name": "fedmask", "args": {"prune_last": 2}},
                               "training": {"lr": 1.0}})
    algo = FedMask(c, ds, engine_for(c.training))
    algo.setup()
    H = 4
    w = "lstm.weight_ih_l0"
    assert algo.masks["client-000"][w].shape == (3 * H, 3)  # masks on i, f, g only
    before = algo.global_params[w].clone()
    task = algo.local_task("client-000", 0)
    assert task.trainable[f"o:{w}"].shape == (H, 3)  # W_o real-valued and trained
    updates = []
    for i, cid in enumerate(algo.client_ids):
        task = algo.local_task(cid, 0)
        d = algo.dataset.client(cid)
        res = local_train(task, d.train_x, d.train_y, batch_order(d.num_train, 1, 0, 0, i), 8)
        updates.append(algo.client_updates(0, [(cid, res)])[0])
    o = [u.extra["o"][f"o:{w}"] for u in updates]
    assert not torch.equal(o[0], before[3 * H:])
    algo.aggregate(0, updates)
    after = algo.global_params[w]
    torch.testing.assert_close(after[:3 * H], before[:3 * H], rtol=0, atol=0)  # i, f, g frozen
    torch.testing.assert_close(after[3 * H:], (o[0] * 16 + o[1] * 16) / 32)  # W_o averaged
    assert updates[0].bytes_up == sum(packed_nbytes(m.numel()) for m in updates[0].payload.values()) \
        + 4 * sum(v.numel() for v in updates[0].extra["o"].values())
