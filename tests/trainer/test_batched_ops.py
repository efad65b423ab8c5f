"""trainer.batched_ops: each rule computes what PyTorch's own vmap rule computes, values and gradients; the
convolution and pooling rules keep the clients beside the channels so that conv → pool → conv copies nothing, and
the linear rule hands back weight gradients laid out like the weights."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch._C._functorch import _unwrap_batched, is_batchedtensor, maybe_current_level
from torch.func import grad, vmap

from edgemask.trainer import batched_ops
from edgemask.trainer.batched_ops import BATCHED_OPS, BatchedLayers, vmap_clients

C, N = 3, 5  # clients, samples per client


def _both(fn, *tensors):
    """``vmap(fn)`` over the clients with PyTorch's rules and with BatchedLayers: outputs, the gradients of a
    fixed random projection of the output w.r.t. every tensor, and how many calls the rules took."""
    out = []
    for mode in (None, BatchedLayers()):
        ts = [t.detach().clone().requires_grad_(True) for t in tensors]
        if mode is None:
            y = vmap(fn)(*ts)
        else:
            with mode:
                y = vmap(fn)(*ts)
        g = torch.autograd.grad((y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum(), ts)
        out.append((y.detach(), g, mode.routed if mode is not None else 0))
    return out


def _close(a, b, tol=1e-5):
    return all(torch.allclose(x, y, rtol=tol, atol=tol) for x, y in zip(a, b))


@pytest.mark.parametrize("kw", [dict(padding=1), dict(stride=2), dict(padding="same", dilation=2), dict(groups=2)])
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d_equals_pytorch_rule(kw, bias):
    torch.manual_seed(0)
    x, w = torch.randn(C, N, 4, 7, 7), torch.randn(C, 6, 4 // kw.get("groups", 1), 3, 3)
    b = torch.randn(C, 6)
    fn = (lambda x, w, b: F.conv2d(x, w, b, **kw)) if bias else (lambda x, w, b: F.conv2d(x, w, None, **kw) + 0 * b.sum())
    (y0, g0, _), (y1, g1, routed) = _both(fn, x, w, b)
    assert routed == 1 and torch.allclose(y0, y1, atol=1e-5) and _close(g0, g1)


def test_conv1d_and_a_shared_weight():
    torch.manual_seed(1)
    x, w, b = torch.randn(C, N, 3, 11), torch.randn(4, 3, 5), torch.randn(4)  # one weight for every client
    (y0, g0, _), (y1, g1, routed) = _both(lambda x: F.conv1d(x, w, b, padding=2), x)
    assert routed == 1 and torch.allclose(y0, y1, atol=1e-5) and _close(g0, g1)


@pytest.mark.parametrize("op", [
    lambda x: torch.max_pool2d(x, 2),  # torch.max_pool2d's stride=[]: the kernel size
    lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),
    lambda x: F.avg_pool2d(x, 2, count_include_pad=False),
    lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
])
def test_pools_equal_pytorch_rule(op):
    torch.manual_seed(2)
    x = torch.randn(C, N, 4, 7, 6)
    (y0, g0, _), (y1, g1, routed) = _both(op, x)
    assert routed == 1 and torch.allclose(y0, y1) and _close(g0, g1)


@pytest.mark.parametrize("gather", [True, False])
@pytest.mark.parametrize("op", [
    lambda x: torch.max_pool2d(x, 2),
    lambda x: F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True),  # overlapping windows, padding, ceil
    lambda x: F.max_pool2d(x, 2, stride=1, dilation=2),
])
def test_max_pool_from_channels_last_indices_is_max_pool_bit_for_bit(op, gather, monkeypatch):
    """The max-pooling rule finds the maxima in channels-last layout and gathers them (or, above
    MAX_POOL_GATHER_ELEMENTS, runs max_pool2d itself): values and gradients bit-equal to PyTorch's rule, with
    ties everywhere (integers, and the zeros of a ReLU) and a NaN, where the first maximum of a window must win."""
    monkeypatch.setattr(batched_ops, "MAX_POOL_GATHER_ELEMENTS", 1 << 30 if gather else 0)
    torch.manual_seed(4)
    x = torch.randint(-3, 4, (C, N, 4, 9, 8)).float()
    x[0, 1, 2, 3, 3] = float("nan")
    (y0, g0, _), (y1, g1, routed) = _both(lambda x: op(torch.relu(x)), x)
    assert routed == 1 and torch.equal(y0.nan_to_num(-1), y1.nan_to_num(-1))
    assert torch.equal(g0[0].nan_to_num(-1), g1[0].nan_to_num(-1))


def test_conv_pool_conv_keeps_clients_beside_channels():
    torch.manual_seed(3)
    w1, w2 = torch.randn(C, 8, 2, 3, 3), torch.randn(C, 4, 8, 3, 3)
    seen = []

    def net(x, w1, w2):
        h = torch.relu(F.conv2d(x, w1, padding=1))
        h = torch.max_pool2d(h, 2)
        seen.append(_unwrap_batched(h, 1))  # the physical pooled activation and its client dimension
        return F.conv2d(h, w2, padding=1)

    (y0, g0, _), (y1, g1, routed) = _both(net, torch.randn(C, N, 2, 8, 8), w1, w2)
    assert routed == 3 and torch.allclose(y0, y1, atol=1e-4) and _close(g0, g1, 1e-4)
    physical, bdim = seen[-1]  # with the rules: (N, C, 8, 4, 4), a contiguous view of (N, C·8, 4, 4)
    assert bdim == 1 and physical.shape == (N, C, 8, 4, 4) and physical.is_contiguous()
    assert seen[0][1] == 0  # PyTorch's rule had moved the clients to the front (a copy)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_equals_pytorch_rule_and_hands_back_contiguous_weight_gradients(bias):
    torch.manual_seed(5)
    x, w1, b1, w2 = torch.randn(C, N, 6), torch.randn(C, 8, 6), torch.randn(C, 8), torch.randn(C, 4, 8)
    seen = []

    def net(x, w1, b1, w2):
        h = torch.relu(F.linear(x, w1, b1) if bias else F.linear(x, w1) + 0 * b1)
        seen.append(_unwrap_batched(h, 1))
        return F.linear(h, w2)

    (y0, g0, _), (y1, g1, routed) = _both(net, x, w1, b1, w2)
    assert routed == 2 and torch.allclose(y0, y1, atol=1e-5) and _close(g0, g1)
    assert not g0[1].is_contiguous() and g1[1].is_contiguous() and g1[3].is_contiguous()  # ∂W like W: (C, O, I)
    physical, bdim = seen[-1]  # with the rule: (C, N, 8) laid out as (C, 8, N), so the next layer's xᵀ is a view
    assert bdim == 0 and physical.transpose(1, 2).is_contiguous()


def test_linear_with_a_shared_weight_keeps_pytorch_rule():
    torch.manual_seed(6)
    w, b = torch.randn(4, 6), torch.randn(4)  # one weight for every client: one plain matmul over C·N samples
    (y0, g0, _), (y1, g1, routed) = _both(lambda x: F.linear(x, w, b), torch.randn(C, N, 6))
    assert routed == 0 and torch.equal(y0, y1)


def test_rules_stand_aside_under_grad_inside_vmap_and_for_single_samples():
    torch.manual_seed(4)
    x, w = torch.randn(C, N, 2, 6, 6), torch.randn(C, 3, 2, 3, 3)

    def inner(w, x):  # Per-FedAvg-style: a gradient taken inside the vmapped function
        return grad(lambda w: F.conv2d(x, w).square().mean())(w)

    mode = BatchedLayers()
    with mode:
        got = vmap(inner)(w, x)
        single = vmap(lambda x, w: F.conv2d(x, w))(x[:, 0], w)  # (2, 6, 6): one sample, no batch dimension
        pooled, where = vmap(lambda x: F.max_pool2d(x, 2, return_indices=True))(x)  # indices: PyTorch's rule
    assert mode.routed == 0
    assert torch.equal(pooled, vmap(lambda x: F.max_pool2d(x, 2))(x)) and where.shape == pooled.shape
    assert torch.allclose(got, vmap(inner)(w, x)) and torch.allclose(single, vmap(F.conv2d)(x[:, 0], w))
    assert not is_batchedtensor(single)


def test_every_registered_rule_is_tested_here():
    # a new entry of BATCHED_OPS needs its equality test above
    assert set(BATCHED_OPS.names()) == {"linear", "conv1d", "conv2d", "max_pool2d", "avg_pool2d",
                                        "adaptive_avg_pool2d"}


def test_vmap_clients_equals_torch_func_vmap_on_nested_arguments_and_outputs():
    """The batched loop's lean vmap: dicts and tuples of stacked tensors in, a dict, a tuple, a tensor that does
    not depend on the clients (broadcast), all bit-equal to torch.func.vmap's, gradients included; a nested
    torch.func.grad (Per-FedAvg's inner step) works under it."""
    torch.manual_seed(0)
    p = {"w": torch.randn(C, 4, 2, requires_grad=True), "b": torch.randn(C, 4)}
    xs = (torch.randn(C, N, 2), torch.randn(C, N, 2))

    def fn(p, xs):
        y = xs[0] @ p["w"].T + p["b"]
        inner = grad(lambda w: (xs[1] @ w.T).square().sum())(p["w"])
        return {"y": y, "pair": (y.sum(), torch.zeros(()))}, inner

    ours, theirs = vmap_clients(fn)(p, xs), vmap(fn)(p, xs)
    assert torch.equal(ours[0]["y"], theirs[0]["y"]) and torch.equal(ours[1], theirs[1])
    assert ours[0]["pair"][1].shape == (C,) and torch.equal(ours[0]["pair"][0], theirs[0]["pair"][0])
    g_ours = torch.autograd.grad(ours[0]["y"].sum() + ours[1].sum(), p["w"])[0]
    g_theirs = torch.autograd.grad(theirs[0]["y"].sum() + theirs[1].sum(), p["w"])[0]
    assert torch.equal(g_ours, g_theirs)
    assert maybe_current_level() is None  # the level is left, as after vmap


class _Seen(BatchedLayers):
    """BatchedLayers that records the name of every call it sees."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.append(getattr(func, "__name__", str(func)))
        return super().__torch_function__(func, types, args, kwargs)


def test_vmap_clients_enters_the_mode_around_the_function_alone():
    """With ``mode``, the rules run inside vmap (the linear rule takes the call, the output equals vmap's with
    the mode around it, bit for bit), and the mode sees only the function's own calls, not the wrapping's
    ``dim()`` and ``shape`` of every argument; it is left on exit, also when the function raises."""
    torch.manual_seed(0)
    p = {"w": torch.randn(C, 4, 2), "b": torch.randn(C, 4)}
    x = torch.randn(C, N, 2)

    def fn(p, x):
        return torch.relu(F.linear(x, p["w"], p["b"]))

    mode = _Seen()
    ours = vmap_clients(fn, mode)(p, x)
    with BatchedLayers() as outside:
        theirs = vmap(fn)(p, x)
    assert mode.routed == outside.routed == 1 and torch.equal(ours, theirs)
    assert mode.seen == ["linear", "relu"]
    with pytest.raises(ZeroDivisionError):
        vmap_clients(lambda a: 1 / 0, mode)(x)
    torch.relu(x)
    assert mode.seen == ["linear", "relu"] and maybe_current_level() is None


def test_vmap_clients_rejects_what_vmap_rejects_and_leaves_its_level():
    with pytest.raises(ValueError, match=r"stack 3 clients.*shape \(2, 5\)"):
        vmap_clients(lambda a, b: a + b)(torch.ones(C, 5), torch.ones(2, 5))
    with pytest.raises(ValueError, match="no tensor"):
        vmap_clients(lambda a: a)({"a": 1})
    with pytest.raises(ValueError, match="no tensor"):
        vmap_clients(lambda a: a)(torch.tensor(1.0))
    with pytest.raises(ValueError, match=r"shape \(\)"):
        vmap_clients(lambda a, b: a * b)(torch.ones(C), torch.tensor(2.0))
    with pytest.raises(ValueError, match="must return tensors"):
        vmap_clients(lambda a: 1.0)(torch.ones(C))
    with pytest.raises(RuntimeError, match="random"):  # randomness "error", as vmap's default
        vmap_clients(lambda a: a + torch.rand(()))(torch.ones(C))
    assert maybe_current_level() is None
