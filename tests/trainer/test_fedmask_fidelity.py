"""FedMask as the paper runs it (issue #26): the binarized feedforward with σ′ straight through (§3.3, Eq. 7-8),
both masks' accuracies reported and labelled, and training FLOPs counted on the masks the forward passes ran.
Each test asserts a hand-computed value the earlier code (soft forward, one accuracy, FLOPs on the end-of-round
mask) does not produce."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from edgemask.errors import ConfigError
from edgemask.trainer.algorithms.fedmask import FedMask, binary_ste
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.engines import engine_for
from edgemask.trainer.local_training import evaluate
from edgemask.trainer.masks import binarize, masked_model
from edgemask.trainer.models.masking import effective_params
from edgemask.trainer.simulation import simulate
from edgemask.trainer.task_program import program


def cfg(rounds=1, clients=2, per_client=40, participation=1.0, **args) -> TrainConfig:
    return TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": clients, "samples_per_client": per_client},
        "model": {"name": "mlp"},
        "algorithm": {"name": "fedmask", "args": {"prune_rate": 0.2, "prune_last": 2, **args}},
        "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": 100.0, "momentum": 0.9,
                     "participation": participation},
    })


def built(c: TrainConfig) -> FedMask:
    algo = FedMask(c, build_dataset(c.data, c.run.seed), engine_for(c.training))
    algo.setup()
    return algo


def test_binary_ste_on_a_two_unit_net_by_hand():
    """y = W·(x ⊙ m) with W = (2, −1), x = (1, 1), m^r = (1, −1); L = y².
    Soft (Eq. 6): m = σ(m^r) = (0.7311, 0.2689), y = 1.1932. Binary (§3.3): m = (1, 0), y = 2.
    Eq. 7-8 at the binary mask: ∂L/∂m = 2y·W·x = (8, −4); σ′(±1) = 0.19661; ∂L/∂m^r = (1.5729, −0.7864)
    (the soft forward would give 2·1.1932·(2, −1)·0.19661 = (0.9384, −0.4692))."""
    W, x = torch.tensor([2.0, -1.0]), torch.tensor([1.0, 1.0])
    mr = torch.tensor([1.0, -1.0], requires_grad=True)
    m = binary_ste(torch.sigmoid(mr))
    assert m.tolist() == [1.0, 0.0]  # exactly binary, not 1 ± an ulp
    y = (W * x * m).sum()
    assert float(y.detach()) == 2.0
    (y ** 2).backward()
    torch.testing.assert_close(mr.grad, torch.tensor([1.5729, -0.7864]), atol=1e-4, rtol=0)


def test_default_forward_is_binary_and_its_gradient_is_sigmoid_prime_at_the_binary_mask():
    """The task's forward equals the frozen model under 1[σ(m^r) ≥ 0.5] ⊙ keep, and ∂L/∂m^r = σ′(m^r) ⊙ ∂L/∂m
    with ∂L/∂m taken at that binary mask."""
    algo = built(cfg(lambda_r=0.0))
    assert algo.args.forward == "binary"
    cid = algo.client_ids[0]
    task = algo.local_task(cid, 0)
    d = algo.dataset.client(cid)
    x, y = d.train_x[:8], d.train_y[:8]
    g = torch.Generator().manual_seed(0)
    mr = {k: (v + 0.8 * torch.randn(v.shape, generator=g)).requires_grad_(True) for k, v in task.trainable.items()}
    out = program(task).forward(mr, task.constants, x, task.buffers)
    F.cross_entropy(out, y).backward()
    keep = algo.keep[cid]
    m = {k: (binarize(torch.sigmoid(v.detach())) * keep[k]).requires_grad_(True) for k, v in mr.items()}
    ref = algo.model_context.call(effective_params(algo.global_params, m, algo.sites), task.buffers, x)
    torch.testing.assert_close(out, ref, rtol=0, atol=0)  # the very mask inference uses
    F.cross_entropy(ref, y).backward()
    for w in ("fc1.weight", "fc2.weight"):
        s = torch.sigmoid(mr[w].detach())
        torch.testing.assert_close(mr[w].grad, s * (1 - s) * m[w].grad * keep[w])
        assert mr[w].grad.abs().sum() > 0


def test_unknown_forward_or_restart_is_a_config_error_naming_the_valid_values():
    with pytest.raises(ConfigError, match=r"\[algorithm.args\] forward: unknown value 'hard'; valid names: binary, "
                                          r"soft"):
        built(cfg(forward="hard"))
    with pytest.raises(ConfigError, match=r"\[algorithm.args\] restart: unknown value 'x'; valid names: keep_agreeing, "
                                          r"reset"):
        built(cfg(restart="x"))


@pytest.fixture(scope="module")
def two_rounds():
    return simulate(cfg(rounds=2, lambda_r=2e-3))


def test_both_masks_accuracies_are_reported_and_labelled(two_rounds):
    """summary.json: ``accuracy`` stays the local mask's; ``accuracies`` holds it as ``local_mask`` and the
    returned mask m^T ⊙ m_k as ``returned_mask``, recomputed here from the server's state by hand."""
    res = two_rounds
    algo, s = res.algorithm, res.summary
    returned = {}
    for cid in algo.client_ids:
        masks = {}
        for w, m_k in algo.masks[cid].items():  # m^T where some upload kept the element, else m_k; 0 where pruned
            cov = algo.covered[w]
            masks[w] = torch.where(cov, algo.global_mask[w], m_k) * algo.keep[cid][w]
        d = algo.dataset.client(cid)
        model = masked_model(algo.model_context, algo.global_params, masks, algo.buffers[cid])
        returned[cid] = evaluate(model, d.test_x, d.test_y)[0]
        local = evaluate(masked_model(algo.model_context, algo.global_params, algo.local[cid], algo.buffers[cid]),
                         d.test_x, d.test_y)[0]
        c = s["clients"][cid]
        assert c["accuracies"] == {"local_mask": c["accuracy"], "returned_mask": pytest.approx(returned[cid])}
        assert c["accuracy"] == pytest.approx(local)
    assert s["mean_accuracies"]["returned_mask"] == pytest.approx(sum(returned.values()) / len(returned))
    assert s["mean_accuracies"]["local_mask"] == s["mean_accuracy"]
    metrics = {r["metric"] for r in res.history}
    assert {"accuracy_returned_mask", "test_loss_returned_mask", "mean_accuracy_returned_mask"} <= metrics
    # the two masks differ (personalization): otherwise reporting both would show nothing
    assert any(not torch.equal(algo.local[c][w], algo.returned_mask(c)[w]) for c in algo.client_ids
               for w in algo.mask_names)


def _element_flops(masks: dict[str, torch.Tensor]) -> int:
    """Forward FLOPs per sample of the 64-128-64-10 MLP under ``masks``, by hand, on what the compacted model
    computes: a hidden unit stays when its mask row has a 1 (alive: its bias then makes it non-zero; a dead row's
    bias is gated) and a kept unit of the layer after reads it (a 1 in its column of a kept row; the head's 10 rows
    always stay); 2 × the non-zero weight elements of kept rows over kept inputs (every pixel)."""
    w1, w2, w3 = (masks[k].ne(0) for k in ("fc1.weight", "fc2.weight", "out.weight"))
    k2 = w2.any(1) & w3.any(0)  # fc2: alive and read by the head
    k1 = w1.any(1) & (w2 & k2[:, None]).any(0)  # fc1: alive and read by a kept fc2 row
    assert k1.any() and k2.any()  # (else compaction keeps a layer's first unit: not these tests' masks)
    n = (w1 & k1[:, None]).sum() + (w2 & k2[:, None] & k1[None, :]).sum() + (w3 & k2[None, :]).sum()
    return 2 * int(n)


def test_training_flops_count_the_masks_the_forward_ran():
    """Soft forward: σ(m^r) is never 0, so every element the pruning keeps ran: fc1 whole (8192), 20 % of fc2
    (1638) and of the head (128), 2 × 9958 = 19,916 FLOPs per sample before compaction, whatever the end-of-round
    mask is; the compacted model computes fewer (fc2 units whose head column the pruning removed whole are
    unread: their rows, and fc1 units only they read, cost nothing). Binary forward: the union of the round's
    start mask and its upload. Both counted by hand (_element_flops)."""
    soft = simulate(cfg(rounds=1, lambda_r=2e-3, forward="soft"))
    algo = soft.algorithm
    fwd = [r for r in soft.history if r["metric"] == "flops_fwd"]
    for r in fwd:
        keep = algo.keep.unpacked(r["client"], list(algo.mask_names))
        assert sum(int(m.sum()) for m in keep.values()) == 9958  # the pruning structure: σ(m^r) > 0 on it
        expect = _element_flops(keep)
        assert expect < 19916  # a wrong count that skips the unread rule gets 19,916
        assert r["value"] == expect * algo.dataset.client(r["client"]).num_train
    binary = simulate(cfg(rounds=1, lambda_r=2e-3))
    algo = binary.algorithm
    for r in (r for r in binary.history if r["metric"] == "flops_fwd"):
        cid = r["client"]
        start = algo.masks[cid]  # round 0 starts from m^0 ⊙ m_k = m_k
        union = {w: torch.maximum(start[w], algo.local[cid][w]) for w in start}
        expect = _element_flops(union) * algo.dataset.client(cid).num_train
        assert r["value"] == expect
        assert expect > _element_flops(algo.local[cid]) * algo.dataset.client(cid).num_train  # not the end mask's


def test_keep_agreeing_restart_keeps_the_devices_scores_where_their_sign_agrees():
    algo = built(cfg(lambda_r=0.0, restart="keep_agreeing", init_scale=1.0))
    cid = algo.client_ids[0]
    algo.local_task(cid, 0)
    w = "fc1.weight"
    own = torch.full(algo.masks[cid][w].shape, -0.25)
    own[0, :3] = torch.tensor([0.5, -3.0, 2.0])
    algo.scores[cid] = {k: own.clone() if k == w else torch.zeros_like(v) for k, v in algo.masks[cid].items()}
    b = algo.returned_mask(cid)[w]
    start = algo.start_scores(cid)[w]
    # sign agrees with b (score ≥ 0 ⇔ bit 1): the own score; else ±s = 2b − 1
    expect = torch.where((own >= 0).float().eq(b), own, 2 * b - 1)
    torch.testing.assert_close(start, expect)


def test_ic_cifar10_config_gives_25_training_samples_per_device_at_20_plus_5():
    """Table 4's 25 samples per device are training samples; Fig. 13's grid makes them 20 + 5 (balance rate
    0.25). The config's partition on CIFAR-10's label layout (10 classes × 6,000 images)."""
    from pathlib import Path

    import numpy as np

    from edgemask.trainer.data.partition import partition, train_test_split

    d = TrainConfig.load(Path(__file__).parents[2] / "configs" / "ic-cifar10-fedmask.toml").data
    y = np.repeat(np.arange(10), 6000)
    rng = np.random.default_rng(0)
    train, big, small = [], [], []
    for idx in partition(y, d, rng):
        idx = np.sort(rng.permutation(idx)[: d.samples_per_client])
        tr, _ = train_test_split(idx, y, d.test_fraction, rng)
        counts = sorted(c for c in np.bincount(y[tr], minlength=10) if c > 0)
        train.append(len(tr))
        small.append(counts[0])
        big.append(counts[-1])
    assert (np.mean(train), np.mean(big), np.mean(small)) == (25.0, 20.0, 5.0)


def test_client_pruning_upload_is_counted(two_rounds):
    """Alg. 1 line 28: every device sends its pruned mask m_k once before the first round: the MLP's
    64·128 + 128·64 + 64·10 = 17,024 mask bits, ⌈17,024 / 8⌉ = 2,128 bytes per device, 2 devices."""
    assert two_rounds.summary["bytes_up_setup"] == 2 * 2128


def test_vote_tie_and_literal_product_start_settings():
    """vote_tie: a mean of exactly 0.5 (one of two uploads) is 1 under "keep" (Eq. 3's ≥ τ), 0 under "drop".
    start_mask "product": the start is m^T ⊙ m_k elementwise, so an element m_k turned off stays off."""
    mean = torch.tensor([0.5, 0.49, 1.0, 0.0])
    assert built(cfg(lambda_r=0.0))._vote(mean).tolist() == [1, 0, 1, 0]
    algo = built(cfg(lambda_r=0.0, vote_tie="drop", start_mask="product"))
    assert algo._vote(mean).tolist() == [0, 0, 1, 0]
    cid = algo.client_ids[0]
    w = "fc1.weight"
    g = torch.zeros(algo.masks[cid][w].shape)
    g[:, :32] = 1  # a global mask keeping the first 32 inputs
    algo.global_mask[w] = g
    algo.covered[w] = torch.ones(g.shape, dtype=torch.bool)
    torch.testing.assert_close(algo.returned_mask(cid)[w], g * algo.masks[cid][w])
    assert algo.masks[cid][w][:, :32].sum() < 128 * 32  # ClientPruning turned some of them off: the product differs
