"""trainer.local_training's cross-entropy: what PyTorch computes, in a form vmap runs without its decomposition."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import vmap

from trainer.local_training import cross_entropy


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
