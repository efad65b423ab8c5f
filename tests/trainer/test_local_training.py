"""trainer.local_training's cross-entropy: what PyTorch computes, in a form vmap runs without its decomposition."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from edgemask.trainer.losses import cross_entropy


def test_cross_entropy_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)], [math.log(2.0), 0.0]])  # softmax rows (1/4, 3/4), (2/3, 1/3)
    y = torch.tensor([1, 1])
    per = cross_entropy(logits, y, reduction="none")
    torch.testing.assert_close(per, torch.tensor([-math.log(0.75), -math.log(1 / 3)]))
    torch.testing.assert_close(cross_entropy(logits, y), per.mean())
    with pytest.raises(ValueError, match="reduction"):
        cross_entropy(logits, y, reduction="sum")


def test_per_sample_is_pytorchs_bits_and_the_mean_is_what_vmap_computes():
    torch.manual_seed(0)
    for n in (1, 5, 16, 33):
        x = (3 * torch.randn(7, n, 10)).requires_grad_(True)
        y = torch.randint(0, 10, (7, n))
        assert torch.equal(cross_entropy(x[0], y[0], reduction="none"), F.cross_entropy(x[0], y[0], reduction="none"))
        ours, theirs = vmap(cross_entropy)(x, y), vmap(F.cross_entropy)(x, y)  # PyTorch's own decomposition
        assert torch.equal(ours, theirs)
        g_ours, = torch.autograd.grad(ours.sum(), x)
        g_theirs, = torch.autograd.grad(theirs.sum(), x)
        assert torch.equal(g_ours, g_theirs)
        eager = torch.stack([F.cross_entropy(x[i], y[i]) for i in range(7)])  # a cascaded sum: the last bit may differ
        torch.testing.assert_close(ours, eager)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_weight_decay_never_moves_frozen_elements_in_either_loop(momentum):
    # LocalTask: elements with grad_keep 0 are frozen. torch.optim.SGD(weight_decay=...) would add wd·p inside
    # step(), after the gradients were masked, and decay them; both loops use d = (∇ + wd·p) ⊙ keep instead.
    from edgemask.trainer.records import LocalTask
    from edgemask.trainer.batched import local_train_batched
    from edgemask.trainer.local_training import local_train
    from edgemask.trainer.sampling import batch_order

    def forward(p, c, x, b):  # w is trained by the data; v only decays (its data gradient is exactly 0)
        return x @ p["w"] + 0.0 * p["v"].sum()

    g = torch.Generator().manual_seed(3)
    keep = {"w": (torch.rand(6, 3, generator=g) < 0.5).float(), "v": torch.tensor([1.0, 0.0, 1.0, 0.0])}
    from test_batched import lend, named

    tasks = [LocalTask({"w": torch.randn(6, 3, generator=g), "v": torch.randn(4, generator=g)}, lend(),
                       named(forward), lr=0.1, grad_keep=keep) for _ in range(2)]
    data = [(torch.randn(20, 6, generator=g), torch.randint(0, 3, (20,), generator=g)) for _ in tasks]
    orders = [batch_order(20, 1, 0, 0, i) for i in range(2)]  # 3 steps of batch 8 (8, 8, 4)
    lr, wd = 0.1, 0.05
    factor, buf = 1.0, 0.0  # by hand: v_t = factor_t · v_0 on kept elements (SGD on the loss wd/2·v²)
    for step in range(3):
        d = wd * factor
        buf = d if step == 0 else momentum * buf + d
        factor -= lr * (buf if momentum else d)
    sequential = [local_train(t, x, y, o, 8, momentum, wd) for t, (x, y), o in zip(tasks, data, orders)]
    batched = local_train_batched(tasks, data, orders, 8, momentum, wd)
    for task, res in zip(tasks * 2, sequential + batched):
        for name, k in keep.items():
            frozen = k == 0
            assert torch.equal(res.trained[name][frozen], task.trainable[name][frozen]), name  # bit for bit
        v0, v = task.trainable["v"], res.trained["v"]
        torch.testing.assert_close(v[keep["v"] == 1], factor * v0[keep["v"] == 1], rtol=1e-6, atol=1e-7)
        assert not torch.equal(res.trained["w"][keep["w"] == 1], task.trainable["w"][keep["w"] == 1])
