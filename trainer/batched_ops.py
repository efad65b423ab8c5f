"""Batching rules for the layers whose ``vmap`` rules copy, or hand back gradients laid out for a slow update.

Under :func:`torch.func.vmap` over C clients, PyTorch runs a convolution with batched weights as one grouped
convolution over ``(N, C·ch, H, W)``, but it adds the bias in a separate op and hands the output on with the
client dimension in second place, ``(N, C, O, H', W')``; max-pooling then moves that dimension to the front and
copies the activation, and the next convolution copies it back. A hand-written batched loop keeps
``(N, C·ch, H, W)`` from layer to layer and folds the bias into the convolution. The rules here do the same
for the layers that would copy, so the batched loop computes what it computed before with fewer copies:

* ``conv1d`` / ``conv2d`` with a batched input: one grouped convolution, the bias folded in, the output left as
  ``(N, C, O, ...)`` (a view of ``(N, C·O, ...)``);
* ``max_pool2d`` / ``avg_pool2d`` / ``adaptive_avg_pool2d`` on an input whose client dimension sits just before
  its channels: the pooling of ``(N, C·ch, H, W)``, a view in and a view out (max-pooling on the CPU finds the
  maxima with the channels-last kernel and gathers them, which vectorizes over the CNN's many small planes:
  :func:`_max_pool2d`).
* ``linear`` with per-client weights ``(C, O, I)``: ``yᵀ = W xᵀ + b`` as one batched matmul, bias folded in.
  PyTorch's rule (like a hand-written ``x Wᵀ``) returns the weight's gradient transposed, ``(C, I, O)`` in
  memory, and the optimizer's ``p -= lr·g`` over a transposed ``g`` runs element by element instead of
  vectorized: for an MLP the largest single cost of a step after the matmuls.

Each rule is one entry of :data:`BATCHED_OPS`. A rule applies only under a single ``vmap`` level (the batched
loop's; not under ``torch.func.grad`` inside it, e.g. Per-FedAvg's inner step) and returns ``NotImplemented``
where it does not fit, so PyTorch's own rule runs. A rule unwraps the batched tensors (the physical tensor and
where its client dimension is), runs plain ops on them and wraps the result: autograd records those ops, as in
the hand-written loop. (``torch.autograd.Function``'s ``vmap`` staticmethod does the same, but its Python
machinery costs more per call than the copies save on small models.) :class:`BatchedLayers` is the mode
that routes the calls; the batched loop enters it around its forward.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch._C._functorch import (TransformType, _add_batch_dim, _remove_batch_dim, _unwrap_batched,
                                 _vmap_decrement_nesting, _vmap_increment_nesting, is_batchedtensor,
                                 maybe_current_level, peek_interpreter_stack)
from torch._functorch.vmap import lazy_load_decompositions
from torch.overrides import TorchFunctionMode

from edgemask.registry import Registry


def vmap_clients(fn: Callable, mode: TorchFunctionMode | None = None) -> Callable:
    """``torch.func.vmap(fn)`` for the batched loop's calls, whose every tensor argument (alone, or in dicts,
    tuples and lists, nested) is stacked along its first dimension, the clients', as every output is.
    ``mode`` (:class:`BatchedLayers`) is entered around ``fn`` alone, inside ``vmap``: the wrapping and
    unwrapping of the arguments and outputs (their ``dim()``, ``shape``) then do not pay its dispatch on every
    attribute, which would cost more than the rules save on a small model's forward.

    The same transform (one ``vmap`` level over the C clients, randomness ``"error"``, each tensor wrapped as a
    batched tensor at dimension 0 and each output unwrapped to dimension 0, an output that does not depend on
    the clients broadcast), without ``torch.func.vmap``'s per-call generality: its pytree flattening of the
    arguments and ``in_dims``, and its wrappers' checks for tracing, are Python work on every call, a visible
    part of a small model's step. Arguments whose tensors disagree on C (or hold none) raise
    ``ValueError``, as ``vmap`` does."""
    lazy_load_decompositions()  # what vmap does on every call (its batching rules written in Python): once

    def call(*args):
        C = next((t.shape[0] for t in _tensors(args) if t.dim()), -1)
        if C < 0:
            raise ValueError(f"vmap_clients({getattr(fn, '__name__', fn)}): no tensor argument with a first "
                             "dimension (the clients') to batch over")
        level = _vmap_increment_nesting(C, "error")

        def batched(x):
            if not isinstance(x, torch.Tensor):
                return x
            if x.dim() == 0 or x.shape[0] != C:
                raise ValueError(f"vmap_clients: every tensor argument must stack {C} clients along its first "
                                 f"dimension, got one of shape {tuple(x.shape)}")
            return _add_batch_dim(x, 0, level)

        def unbatched(x):
            if not isinstance(x, torch.Tensor):
                raise ValueError(f"a function run under vmap_clients must return tensors (alone, or in dicts, "
                                 f"tuples and lists), got {type(x).__name__}")
            return _remove_batch_dim(x, level, C, 0)

        try:
            inputs = _map(args, batched)
            if mode is None:
                out = fn(*inputs)
            else:
                with mode:
                    out = fn(*inputs)
            return _map(out, unbatched)
        finally:
            _vmap_decrement_nesting()

    return call


def _map(x, leaf: Callable):
    """``x`` (dicts, tuples and lists, nested) with ``leaf`` applied to everything else in it."""
    if isinstance(x, dict):
        return {k: _map(v, leaf) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)([_map(v, leaf) for v in x])
    return leaf(x)


def _tensors(x):
    """The tensors in ``x`` (dicts, tuples and lists, nested), in order."""
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _tensors(v)
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _tensors(v)


#: op name -> (the torch functions that call it, the route: their arguments -> output or NotImplemented)
BATCHED_OPS: Registry[tuple[tuple[Callable, ...], Callable]] = Registry("batched op")


def _vmap_level(x: torch.Tensor) -> int | None:
    """The level of the one ``vmap`` running when ``x`` is batched by it, else ``None`` (no vmap, a nested
    transform such as ``grad`` inside ``vmap``, or ``x`` not batched)."""
    level = maybe_current_level()
    if level != 1 or not is_batchedtensor(x) or peek_interpreter_stack().key() != TransformType.Vmap:
        return None
    return level


def _front(t: torch.Tensor | None, level: int, C: int) -> torch.Tensor | None:
    """The physical ``t`` with the client dimension first: ``(C, *shape)`` (broadcast when ``t`` is shared)."""
    if t is None:
        return None
    if not is_batchedtensor(t):
        return t.unsqueeze(0).expand(C, *t.shape)
    return _unwrap_front(t, level)


def _unwrap_front(t: torch.Tensor, level: int) -> torch.Tensor:
    """The physical tensor of batched ``t``, its client dimension moved first (a view)."""
    t, bdim = _unwrap_batched(t, level)
    return t if bdim == 0 else t.movedim(bdim, 0)


def _into_channels(x: torch.Tensor, level: int) -> tuple[torch.Tensor, int]:
    """The physical batched ``x`` with its client dimension folded into its channels, ``(N, C·ch, *spatial)``,
    and C; a view when the client dimension sits just before the channels (the layout the rules leave), else
    one copy."""
    x, bdim = _unwrap_batched(x, level)
    x = x.movedim(bdim, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:]), x.shape[1]


def _out(y: torch.Tensor, C: int, level: int) -> torch.Tensor:
    """``(N, C·O, *spatial)`` handed back batched, as ``(N, C, O, *spatial)`` with the clients in dimension 1."""
    return _add_batch_dim(y.view(y.shape[0], C, -1, *y.shape[2:]), 1, level)


def _conv(op: Callable, ndim: int) -> Callable:
    """One grouped convolution over the clients, bias folded in."""
    def route(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        level = _vmap_level(input)
        if level is None or input.dim() != ndim:  # not one vmap's batch of samples
            return NotImplemented
        x, C = _into_channels(input, level)
        w = _front(weight, level, C)  # (C, O, ch/groups, *kernel)
        b = _front(bias, level, C)
        y = op(x, w.reshape(-1, *w.shape[2:]), None if b is None else b.reshape(-1), stride, padding, dilation,
               groups * C)
        return _out(y, C, level)

    return route


def _pool(op: Callable) -> Callable:
    """A 2-D pooling of ``(N, C·ch, H, W)``: every channel on its own, so the clients fold into the channels."""
    def route(input, *args, **kwargs):
        level = _vmap_level(input)
        if level is None or input.dim() != 4:  # not one vmap's batch of samples
            return NotImplemented
        x, C = _into_channels(input, level)
        y = op(x, *args, **kwargs)
        return y if y is NotImplemented else _out(y, C, level)

    return route


def _linear(input, weight, bias=None):
    """Per-client weights: one batched matmul per layer computed as ``yᵀ = W xᵀ + b`` (``(C, O, B)``), the bias
    folded in. Laid out so, the weight's gradient ``∂yᵀ · x`` comes out ``(C, O, I)`` contiguous like the weight,
    and the optimizer's update runs at full vector speed (PyTorch's rule, and ``x Wᵀ``, hand back a transposed
    gradient whose strided update costs ~8× more); ``yᵀ``'s transpose is handed on, so the next layer's ``xᵀ``
    is contiguous."""
    level = _vmap_level(input)
    if level is None or input.dim() != 2 or not is_batchedtensor(weight):  # a shared weight: PyTorch's rule
        return NotImplemented
    x = _unwrap_front(input, level)  # (C, B, I)
    C = x.shape[0]
    w = _front(weight, level, C)  # (C, O, I)
    xt = x.transpose(1, 2)  # (C, I, B)
    yt = torch.bmm(w, xt) if bias is None else torch.baddbmm(_front(bias, level, C).unsqueeze(2), w, xt)
    return _add_batch_dim(yt.transpose(1, 2), 0, level)  # (C, B, O) seen per client as (B, O)


#: Largest input (elements) whose max-pooling :func:`_max_pool2d` picks in channels-last layout on the CPU.
MAX_POOL_GATHER_ELEMENTS = 8 << 20


def _max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, return_indices=False):
    """Max-pooling of the folded ``(N, C·ch, H, W)``. On the CPU, PyTorch's kernel for this layout runs plane by
    plane, slow for the many small planes of stacked clients, while its channels-last kernel vectorizes across
    the channels, layout changes and indices included. So the window maxima are found there, as indices, without a graph, and the output is gathered from ``x`` at
    them: the same values, and, as ``gather``'s gradient scatters each output's gradient onto its index, the
    same gradient as ``max_pool2d``'s (whose backward scatters onto the same indices; both kernels keep the first
    maximum of a window). The gather pays off for small inputs only (the figures are in the commit that added
    it), hence :data:`MAX_POOL_GATHER_ELEMENTS`; above it, and on other devices, ``max_pool2d`` itself."""
    if return_indices:  # indices into the folded planes: PyTorch's rule
        return NotImplemented
    # torch.max_pool2d's stride=[] means "the kernel size", as F.max_pool2d's None
    stride = stride if stride not in (None, []) else None
    if x.device.type != "cpu" or x.numel() > MAX_POOL_GATHER_ELEMENTS:
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode)
    with torch.no_grad():
        where = F.max_pool2d(x.contiguous(memory_format=torch.channels_last), kernel_size, stride, padding, dilation,
                             ceil_mode, return_indices=True)[1].contiguous()  # (N, C·ch, H', W') into each H×W
    return x.flatten(2).gather(2, where.flatten(2)).view(where.shape)


BATCHED_OPS.add("linear", ((F.linear,), _linear))
BATCHED_OPS.add("conv1d", ((torch.conv1d,), _conv(F.conv1d, 3)))
BATCHED_OPS.add("conv2d", ((torch.conv2d,), _conv(F.conv2d, 4)))
BATCHED_OPS.add("max_pool2d", ((torch.max_pool2d, F.max_pool2d), _pool(_max_pool2d)))
BATCHED_OPS.add("avg_pool2d", ((F.avg_pool2d,), _pool(F.avg_pool2d)))
BATCHED_OPS.add("adaptive_avg_pool2d", ((torch._C._nn.adaptive_avg_pool2d, F.adaptive_avg_pool2d),
                                        _pool(F.adaptive_avg_pool2d)))
_ROUTES: dict[Callable, Callable] = {f: BATCHED_OPS.get(n)[1] for n in BATCHED_OPS for f in BATCHED_OPS.get(n)[0]}


class BatchedLayers(TorchFunctionMode):
    """Routes the calls of :data:`BATCHED_OPS` ' functions with batched inputs to their rules, under one
    ``vmap`` level; every other call runs unchanged. ``routed`` counts the calls a rule took (a model with
    none, such as an MLP, need not pay for the mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.routed = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        route = _ROUTES.get(func)
        if route is not None:
            out = route(*args, **kwargs)
            if out is not NotImplemented:
                self.routed += 1
                return out
        return func(*args, **kwargs)
