"""Train a round's clients together: the batched form of :func:`edgemask.trainer.local_training.local_train`.

Clients whose :class:`LocalTask` s are compatible (the same model, function names and settings, the same tensor
names, shapes and dtypes: :func:`task_signature`) are stacked along a leading client dimension C and trained as one
computation, each task field read as :mod:`edgemask.trainer.task_program` says:

* ``trainable`` / ``constants`` / ``buffers`` / ``grad_keep``: ``(C, *shape)`` — per-client state, one op per
  tensor name (a tensor every task holds, e.g. FedAvg's global weights or FedMask's frozen ones, is broadcast,
  never copied);
* step ``s`` of every client at once: ``x (C, B, *input)``, ``y (C, B)`` gathered from each client's own order
  (:func:`edgemask.trainer.sampling.batch_order`, the same orders as the sequential loop), with a per-sample weight
  ``w (C, B)``: 1 for a real sample, 0 for padding (a client's last partial batch, or no batch at all once the
  client has run out of steps);
* loss: client c's loss is the mean cross-entropy over its real samples (+ its regularizer), the total loss
  the *sum* over active clients, so each client's gradient is exactly its own; the forward is ``vmap``
  (:func:`~edgemask.trainer.batched_ops.vmap_clients`) over the task's forward function, the cross-entropy one op over
  the flattened ``(C·B)`` batch, weighted by ``1/n_c`` on client c's real samples and summed per client;
* SGD with momentum and weight decay written on the stacked tensors, equal to the sequential loop per client
  (``d = (g + wd·p) ⊙ keep``, so frozen elements never move; ``buf = d`` on the first step, ``buf = μ·buf + d``
  after; ``p -= lr·buf``); a client with no real batch at step ``s`` takes no step at all (no decay, no momentum).

Batch norm: running statistics are stacked per client and updated in place under ``vmap``. Since padding
would enter a batch's statistics, clients with buffers are never padded: at each step the clients are split by
their real batch size and each split runs unpadded (usually one or two splits per step). The same holds for a
task with its own ``loss`` (it sees whole batches; with ``batches_per_step`` k > 1 a step's k minibatches, e.g.
Per-FedAvg's D and D', split by the tuple of their sizes). ``lrs`` (per-tensor rates) may differ per client;
``epochs`` and ``max_steps`` too (a client's steps end where its own plan ends). ``project`` runs under ``vmap``
after each step, on the clients that took it.

Groups that cannot run under ``vmap`` (random ops such as dropout, tensors captured on another device, ops
without a batching rule) are detected by a one-sample probe and trained by the sequential loop instead, with a
warning naming the reason. Memory is bounded by chunking clients (:func:`clients_per_chunk`).
"""

from __future__ import annotations

import math
import operator
import warnings
from itertools import repeat
from typing import Callable, Hashable

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from edgemask.trainer.batched_ops import BatchedLayers, vmap_clients
from edgemask.trainer.devices import resolve_device
from edgemask.trainer.local_training import evaluate, local_train
from edgemask.trainer.losses import cross_entropy
from edgemask.trainer.masks import BITS_PREFIX
from edgemask.trainer.records import EvalModel, LocalResult, LocalTask
from edgemask.trainer.sampling import step_plan
from edgemask.trainer.task_program import (TaskProgram, direction, draw_noise, kind, noise_generator, program,
                                           tensor_rate)

CPU_MEMORY_BUDGET = 512 << 20  # bytes of stacked state + activations per chunk on the CPU
CUDA_MEMORY_FRACTION = 0.5  # of the free device memory
PADDED_CACHE_BYTES = 256 << 20  # padded client data kept between rounds (see _padded_data), at most
EVAL_SAMPLES_PER_CALL = 4096  # clients × test samples in one vmapped evaluation call, at most
EVAL_MEMORY_BUDGET = 256 << 20  # bytes of stacked per-client tensors per evaluation chunk
_PROBED: dict[Hashable, tuple[int, bool] | str] = {}  # (task signature, batch size, device) -> probe result
_PADDED: dict[Hashable, tuple] = {}  # the data's identity -> (X, Y, the data, bytes): see _padded_data
_ASKED: set[Hashable] = set()  # the keys _padded_data was asked for once and did not keep (yet)


def local_train_batched(tasks: list[LocalTask], data: list[tuple[torch.Tensor, torch.Tensor]],
                        orders: list[list[np.ndarray]], batch_size: int, momentum: float = 0.0,
                        weight_decay: float = 0.0, device: str | torch.device = "cpu",
                        max_clients_per_chunk: int | None = None,
                        memory_budget: int | None = None) -> list[LocalResult]:
    """Train ``tasks[i]`` on ``data[i] = (x, y)`` in ``orders[i]`` for every i, together; the results equal
    ``local_train(tasks[i], x, y, orders[i], batch_size, momentum, weight_decay)`` within float rounding.

    ``max_clients_per_chunk`` caps how many clients are stacked at once (default: as many as fit
    ``memory_budget`` bytes, by default half the free CUDA memory or :data:`CPU_MEMORY_BUDGET`); a chunk that
    runs out of memory all the same is trained again in halves, with a warning.
    Results come back on the CPU, in the order of ``tasks``.
    """
    if not (len(tasks) == len(data) == len(orders)):
        raise ValueError(f"{len(tasks)} tasks, {len(data)} data splits and {len(orders)} orders: one each per client")
    dev = resolve_device(device)
    results: list[LocalResult | None] = [None] * len(tasks)
    for group in compatible_groups(tasks):
        first = group[0]
        key = (task_signature(tasks[first]), batch_size, str(dev))
        if key not in _PROBED:  # once per kind of task: the rounds of one run share it
            if len(_PROBED) >= 16:
                _PROBED.clear()
            _PROBED[key] = _probe(tasks[first], data[first], batch_size, dev)
        probe = _PROBED[key]
        if isinstance(probe, str):
            warnings.warn(f"batched training falls back to the sequential loop for {len(group)} client(s): {probe}",
                          RuntimeWarning, stacklevel=2)
            for i in group:
                results[i] = local_train(tasks[i], *data[i], orders[i], batch_size, momentum, weight_decay)
            continue
        activation_bytes, layers = probe
        if max_clients_per_chunk:
            chunk = max_clients_per_chunk
        else:
            shared = frozenset(_held_keys([tasks[i].constants for i in group]))
            chunk = clients_per_chunk(tasks[first], max(data[i][1].shape[0] for i in group), data[first][0],
                                      activation_bytes, dev, memory_budget, shared)
        s = 0
        while s < len(group):
            part = group[s: s + chunk]
            try:
                out = _train_stacked([tasks[i] for i in part], [data[i] for i in part], [orders[i] for i in part],
                                     batch_size, momentum, weight_decay, dev, layers)
            except torch.OutOfMemoryError:
                if len(part) == 1:
                    raise
                # The estimate was too high for this device (or something else took the memory): the chunk is
                # trained again in halves. Safe, since a chunk trains copies and draws from seeds of its own.
                chunk = max(1, len(part) // 2)
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
                warnings.warn(f"batched training ran out of {dev.type} memory: {chunk} client(s) at a time from here",
                              RuntimeWarning, stacklevel=2)
                continue
            for i, r in zip(part, out):
                results[i] = r
            s += len(part)
    return results  # type: ignore[return-value]


# -- which clients can be stacked --------------------------------------------------------------------------
def compatible_groups(tasks: list[LocalTask]) -> list[list[int]]:
    """Indices of ``tasks`` grouped by :func:`task_signature`, groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    specs: dict[Hashable, tuple] = {}  # tasks that hold the same tensors (FedAvg's global weights) share a spec
    for i, t in enumerate(tasks):
        groups.setdefault(task_signature(t, specs), []).append(i)
    return list(groups.values())


def task_signature(task: LocalTask, memo: dict[Hashable, tuple] | None = None) -> Hashable:
    """Two tasks with equal signatures compute the same function of their (stacked) tensors: the same
    :func:`~edgemask.trainer.task_program.kind` (model, function names and settings), the same tensor names, shapes and
    dtypes. ``memo`` keeps the specs of dicts of the very same tensors (by identity) while it is alive, e.g. one
    grouping call."""
    return (kind(task), _spec(task.trainable, memo), _spec(task.constants, memo), _spec(task.buffers, memo),
            _spec(task.grad_keep, memo))


def _spec(d: dict[str, torch.Tensor], memo: dict[Hashable, tuple] | None) -> tuple:
    """Names, shapes and dtypes of ``d``'s tensors (torch.Size hashes and compares as a tuple)."""
    if not d:
        return ()
    if memo is None:
        return tuple([(k, v.shape, v.dtype) for k, v in d.items()])
    key = (tuple(d), tuple(map(id, d.values())))
    out = memo.get(key)
    if out is None:
        out = memo[key] = tuple([(k, v.shape, v.dtype) for k, v in d.items()])
    return out


# -- probe and memory --------------------------------------------------------------------------------------
def _stack(ds: list[dict[str, torch.Tensor]], dev: torch.device, copy: bool = True,
           held: set[str] | None = None) -> dict[str, torch.Tensor]:
    """``{k: (C, *shape)}`` from C clients' tensors, one op per key. A tensor all clients share (the same
    object, e.g. the global weights of FedAvg's tasks) is broadcast instead: copied once per client when
    ``copy`` (state that is trained), else a stride-0 view (read-only constants and keep masks). ``held``: those
    keys, when the caller has them already (:func:`_held_keys`)."""
    if held is None:
        held = _held_keys(ds)
    out = {}
    for k, v in ds[0].items():
        if k in held:
            v = v.to(dev).unsqueeze(0).expand(len(ds), *v.shape)
            out[k] = v.clone(memory_format=torch.contiguous_format) if copy else v
        else:
            out[k] = torch.stack([d[k] for d in ds]).to(dev)
    return out


def _held_keys(ds: list[dict[str, torch.Tensor]]) -> set[str]:
    """The keys whose tensor every client holds as the very same object (e.g. the global weights FedAvg's tasks
    hold); the comparisons run in C (itemgetter, is_): 100 clients × the model's tensors, every round."""
    return {k for k, v in ds[0].items() if all(map(operator.is_, map(operator.itemgetter(k), ds), repeat(v)))}


def _client_loss(prog: TaskProgram) -> Callable:
    """One client's (data loss, regularizer) from its own tensors; vmapped over the client dimension."""
    fwd, reg, own = prog.forward, prog.regularizer, prog.loss

    def loss(p, c, b, x, y, w, n):
        if own is not None:  # the task's own data loss of an unpadded batch (w is all ones)
            data = own(p, c, x, y, b)  # x, y: the step's k minibatches (a tuple when k > 1)
        else:
            logits = fwd(p, c, x, b)  # (B, classes)
            data = (cross_entropy(logits, y, reduction="none") * w).sum() / n  # mean over real samples
        return data, (reg(p, c) if reg is not None else torch.zeros((), device=data.device))

    return loss


def _probe(task: LocalTask, data: tuple[torch.Tensor, torch.Tensor], batch_size: int,
           dev: torch.device, fresh_only: bool = False) -> tuple[int, bool] | str:
    """Run one client's loss under vmap on ``dev`` (on copies); return the bytes autograd saves for one
    client's step of ``batch_size`` samples and whether any :mod:`edgemask.trainer.batched_ops` rule applies to the task
    (else the loop runs without :class:`~edgemask.trainer.batched_ops.BatchedLayers`), or why the task cannot run
    batched. ``fresh_only``: count only what the step itself allocates, not the task's tensors and the batch it
    saves as they are (the memory estimate's count, :mod:`edgemask.trainer.footprint`, on ``meta`` tensors)."""
    x, y = data
    if len(y) == 0:
        return 0, False
    prog = program(task)
    idx = torch.arange(batch_size) % len(y)
    p = {k: v.detach().unsqueeze(0).to(dev).requires_grad_(True) for k, v in task.trainable.items()}
    c = {k: v.unsqueeze(0).to(dev) for k, v in task.constants.items()}
    c.update({k: torch.full((1, *shape), 0.5, device=dev) for k, shape in task.noise.items()})  # no global draw
    b = {k: v.unsqueeze(0).to(dev).clone() for k, v in task.buffers.items()}
    saved = 0
    layers = BatchedLayers()

    k = task.batches_per_step
    xb, yb = x[idx].unsqueeze(0).to(dev), y[idx].unsqueeze(0).to(dev)
    given = {v.untyped_storage()._cdata for d in (p, c, b) for v in d.values()} | {xb.untyped_storage()._cdata} \
        if fresh_only else set()  # the step's inputs: a saved view of one of them allocates nothing

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        if not given or _storage(t) not in given:
            saved += t.numel() * t.element_size()
        return t

    if k > 1:  # the step's k minibatches
        xb, yb = (xb,) * k, (yb,) * k
    args = (p, c, b, xb, yb, torch.ones(1, k * batch_size, device=dev), torch.full((1,), float(k * batch_size),
                                                                                 device=dev))
    def step_loss() -> None:
        if prog.loss is None and not task.buffers:  # as the padded loop computes it: the forward and the
            # regularizer vmapped apart, the cross-entropy outside vmap over the flattened batch
            F.cross_entropy(vmap_clients(prog.forward, layers)(p, c, xb, b).flatten(0, 1), yb.flatten())
            if prog.regularizer is not None:
                vmap_clients(prog.regularizer)(p, c)
        else:
            vmap_clients(_client_loss(prog), layers)(*args)

    try:
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                step_loss()
        except RuntimeError as e:
            if "saved tensor hooks" not in str(e):
                raise
            # A loss that takes gradients itself with torch.func (Per-FedAvg's inner step) cannot be measured
            # under the hooks: run it unmeasured, and count the forward's saved tensors on the step's samples
            # twice (the inner and the outer pass).
            saved = 0
            vmap_clients(_client_loss(prog), layers)(*args)
            xs = torch.cat(xb, 1) if k > 1 else xb
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                vmap_clients(prog.forward, layers)(p, c, xs, {n: v.clone() for n, v in b.items()})
            saved *= 2
        if prog.project is not None:
            with torch.no_grad():
                vmap_clients(prog.project)({n: v.detach() for n, v in p.items()})
    except RuntimeError as e:  # random ops under vmap, tensors captured on another device, in-place on shared
        return str(e).splitlines()[0]
    return saved, layers.routed > 0


def _storage(t: torch.Tensor) -> int:
    """The identity of the storage under ``t``, through vmap's and grad's wrappers."""
    while torch._C._functorch.is_functorch_wrapped_tensor(t):
        t = torch._C._functorch.get_unwrapped(t)
    return t.untyped_storage()._cdata


def clients_per_chunk(task: LocalTask, max_samples: int, x: torch.Tensor, activation_bytes: int,
                      dev: torch.device, memory_budget: int | None = None,
                      shared: frozenset[str] = frozenset()) -> int:
    """How many clients fit the memory budget: per client, its trainable tensors three times (value, gradient,
    momentum), constants, keep masks and buffers, its padded data, and the activations autograd saves for one
    step (measured by :func:`_probe`), counted twice for the backward's temporaries. ``shared``: constants every
    client holds as the very same tensor (FedMask's frozen weights), stacked as one broadcast view: counted once,
    not per client."""
    if memory_budget is None:
        if dev.type == "cuda":
            memory_budget = int(torch.cuda.mem_get_info(dev)[0] * CUDA_MEMORY_FRACTION)
        else:
            memory_budget = CPU_MEMORY_BUDGET

    def nbytes(d: dict[str, torch.Tensor]) -> int:
        return sum(v.numel() * v.element_size() for v in d.values())

    sample = math.prod(x.shape[1:]) * x.element_size() + 8  # + the int64 label
    own = {k: v for k, v in task.constants.items() if k not in shared}
    per_client = (3 * nbytes(task.trainable) + nbytes(own) + nbytes(task.grad_keep)
                  + 2 * nbytes(task.buffers) + max_samples * sample + 2 * activation_bytes)
    once = nbytes(task.constants) - nbytes(own)
    return max(1, (memory_budget - once) // max(per_client, 1))


# -- the stacked loop --------------------------------------------------------------------------------------
def step_indices(orders: list[np.ndarray], epochs: int, max_steps: int | None, batch_size: int) -> np.ndarray:
    """The client's minibatches as rows of sample indices, -1 padding a partial batch: ``(steps, batch_size)``.
    Exactly the batches :func:`edgemask.trainer.local_training.local_train` visits, in its order (one per step)."""
    return step_plan(orders, epochs, max_steps, batch_size)[:, 0]


_NO_SAMPLES = np.zeros(0, dtype=np.int64)


def step_plans(orders: list[list[np.ndarray]], epochs: list[int], max_steps: list[int | None],
               batch_size: int) -> np.ndarray:
    """All clients' minibatches at once: ``(S, C, batch_size)`` sample indices, -1 padding (a client's partial
    minibatch, or every step after its plan ends); client c's rows are :func:`step_indices` of its ``orders[c]``,
    ``epochs[c]`` and ``max_steps[c]``. One concatenation of every (epoch, client) order and one scatter: no loop
    over the clients' steps or the epochs."""
    C, B = len(orders), batch_size
    E = max(epochs, default=0)
    # every (epoch, client) order, epoch-major; an empty one past a client's epochs
    segs = [o[e % len(o)] if e < n else _NO_SAMPLES for e in range(E) for o, n in zip(orders, epochs)]
    lens = np.fromiter(map(len, segs), np.int64, E * C).reshape(E, C)  # (E, C) samples per epoch
    nb = -(-lens // B)  # (E, C) minibatches per epoch
    first = np.cumsum(nb, 0) - nb  # (E, C) the step of each epoch's first minibatch
    no_cap = np.iinfo(np.int64).max
    cap = np.array([no_cap if m is None else m for m in max_steps], dtype=np.int64)
    steps = np.minimum(nb.sum(0), cap)  # (C,)
    out = np.full((int(steps.max(initial=0)), C, B), -1, dtype=np.int64)
    if not out.size:
        return out
    flat = np.concatenate(segs).astype(np.int64, copy=False)
    L = lens.reshape(-1)  # (E·C,) samples of each (epoch, client) segment
    client = np.repeat(np.tile(np.arange(C), E), L)  # (n,) each sample's client
    pos = np.arange(len(flat)) - np.repeat(np.cumsum(L) - L, L)  # its place in its epoch
    row = np.repeat(first.reshape(-1), L) + pos // B
    ok = row < steps[client]
    out[row[ok], client[ok], pos[ok] % B] = flat[ok]
    return out


def _train_stacked(tasks: list[LocalTask], data: list[tuple[torch.Tensor, torch.Tensor]],
                   orders: list[list[np.ndarray]], batch_size: int, momentum: float, weight_decay: float,
                   dev: torch.device, layers: bool = True) -> list[LocalResult]:
    C = len(tasks)
    t0 = tasks[0]
    prog = program(t0)  # every task of the group is of its kind
    T = [t.trainable for t in tasks]
    # A tensor every client starts from (FedAvg's global weights) is stacked as a broadcast view, not copied C
    # times: the first update writes each client's own copy out of place (one pass over the memory, not two).
    # A projection writes the tensors in place from the first step, so then every client gets its copy up front.
    copy = prog.project is not None
    held = _held_keys(T)
    P = {k: v.detach().requires_grad_(True) for k, v in _stack(T, dev, copy, held).items()}
    fresh = set() if copy else held  # the keys stacked as broadcast views
    K = _stack([t.constants for t in tasks], dev, copy=False) if t0.constants else {}
    gens = [noise_generator(t) for t in tasks] if t0.noise else None  # each client's own stream (LocalTask.noise)
    Bf = _stack([t.buffers for t in tasks], dev) if t0.buffers else {}  # stack copies: the tasks' stay as given
    keep = _stack([t.grad_keep for t in tasks], dev, copy=False) if t0.grad_keep else {}
    keep = {k: m for k, m in keep.items() if k in P}
    lr: dict[str, float | torch.Tensor] = {}  # per tensor: one rate, or one per client (C,)
    base_rates, per_tensor = [t.lr for t in tasks], any(t.lrs for t in tasks)
    for k in P:
        rates = [tensor_rate(t, k) for t in tasks] if per_tensor else base_rates
        lr[k] = rates[0] if len(set(rates)) == 1 else torch.tensor(rates, device=dev)
    per_step = prog.batches_per_step
    padded = not Bf and prog.loss is None  # else split by batch size: batch norm statistics, own losses
    mode = BatchedLayers() if layers else None  # layout-keeping rules for linear, convolution, pooling layers
    loss_fn = vmap_clients(_client_loss(prog), mode)
    forward = vmap_clients(prog.forward, mode)  # the padded path: (P, K, x (C, B, *input), Bf) -> logits (C, B, classes)
    regularizer = vmap_clients(prog.regularizer) if prog.regularizer is not None else None  # (P, K) -> (C,)
    project = vmap_clients(prog.project) if prog.project is not None else None

    # Minibatch plan: idx (S, C, k, B) into each client's samples (k minibatches per step), w real-sample weights.
    if per_step == 1:  # one minibatch a step: all clients' plans at once
        idx_np = step_plans(orders, [t.epochs for t in tasks], [t.max_steps for t in tasks], batch_size)[:, :, None]
    else:
        plans = [step_plan(o, t.epochs, t.max_steps, batch_size, per_step) for o, t in zip(orders, tasks)]
        S = max((len(p) for p in plans), default=0)
        idx_np = np.full((S, C, per_step, batch_size), -1, dtype=np.int64)
        for c, p in enumerate(plans):
            idx_np[: len(p), c] = p
    S = len(idx_np)
    real_np = idx_np >= 0
    parts_np = real_np.sum(3)  # (S, C, k) real samples per client per step and minibatch
    counts_np = parts_np.sum(2)  # (S, C) real samples per client per step
    idx = torch.from_numpy(np.where(real_np, idx_np, 0)).to(dev)
    w = torch.from_numpy(real_np[:, :, 0]).to(dev, torch.float32)  # the padded loop's (k = 1)
    counts = torch.from_numpy(counts_np).to(dev, torch.float32)
    mean_w = w / counts.clamp(min=1).unsqueeze(2)  # (S, C, B): 1/n on each of a client's n real samples, else 0

    X, Y = _padded_data(data, dev)  # (C, N, *input), (C, N)
    rows = torch.arange(C, device=dev)[:, None]

    keys = list(P)
    bufs: dict[str, torch.Tensor] = {}
    # Without momentum, weight decay or a regularizer, a client with no real sample has an exactly zero
    # gradient, so it stays put without masking its update.
    zero_when_idle = padded and not momentum and not weight_decay and prog.regularizer is None
    loss_sum = torch.zeros(C, dtype=torch.float64, device=dev)
    for s in range(S):
        active_np = counts_np[s] > 0
        all_active = zero_when_idle or bool(active_np.all())
        active = torch.from_numpy(active_np).to(dev)
        if gens is not None:  # a client draws only on the steps it takes, as it would alone
            draws = [draw_noise(t, g) if a else None for t, g, a in zip(tasks, gens, active_np)]
            K = {**K, **{n: torch.stack([d[n] if d is not None else torch.zeros(shape) for d in draws]).to(dev)
                         for n, shape in t0.noise.items()}}
        if padded:
            # One padded call: inactive clients have all-zero weights and are left out of the sum.
            xb, yb = X[rows, idx[s, :, 0]], Y[rows, idx[s, :, 0]]  # (C, B, *input), (C, B)
            logits = forward(P, K, xb, Bf)  # (C, B, classes)
            # all clients' cross-entropies in one op over the flattened batch (C·B,), then each client's mean
            ce = F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none")
            data_loss = (ce.view(C, -1) * mean_w[s]).sum(1)  # (C,)
            per_client = (data_loss + regularizer(P, K)) if regularizer is not None else data_loss
            total = per_client.sum() if all_active else (per_client * active).sum()
            grads = torch.autograd.grad(total, [P[k] for k in keys], allow_unused=True)
            loss_sum += data_loss.detach().double() * counts[s]
        else:
            grads = _grads_by_batch_size(loss_fn, P, K, Bf, X, Y, idx[s], parts_np[s], keys, loss_sum, dev)
        with torch.no_grad():
            for k, g in zip(keys, grads):
                if g is None:  # the parameter took no part in the loss: torch.optim.SGD skips it
                    continue
                p = P[k]
                g = direction(g, p, keep.get(k), weight_decay)  # (∇ + wd·p) ⊙ keep
                if momentum:
                    if k not in bufs:
                        bufs[k] = g.clone()  # step 0: every client with any batch is active
                    elif all_active:
                        bufs[k].mul_(momentum).add_(g)
                    else:
                        a = active.view(C, *[1] * (p.dim() - 1))
                        bufs[k] = torch.where(a, bufs[k] * momentum + g, bufs[k])
                    g = bufs[k]
                rate = lr[k]
                if isinstance(rate, torch.Tensor):  # one rate per client
                    g, rate = g * rate.view(C, *[1] * (p.dim() - 1)), 1.0
                if not all_active:
                    g = torch.where(active.view(C, *[1] * (p.dim() - 1)), g, torch.zeros((), device=dev))
                if k in fresh:  # still the clients' shared start: their own copies, updated
                    P[k] = torch.sub(p, g, alpha=rate).requires_grad_(True)
                    fresh.discard(k)
                else:
                    p.sub_(g, alpha=rate)  # one fused op, as torch.optim.SGD does it
            if project is not None:  # only the clients that took step s: an idle one is never projected
                for k, v in project(P).items():
                    P[k].copy_(v if active_np.all() else torch.where(active.view(C, *[1] * (v.dim() - 1)), v, P[k]))

    for k in fresh:  # never updated: still a view of the task's tensor, so copied
        P[k] = P[k].clone()
    seen = counts_np.sum(0).tolist()
    losses = loss_sum.cpu().tolist()
    # each client's tensors: views of its rows of the stacks (the server's average reads the rows as one tensor)
    trained = _rows({k: v.detach().cpu() for k, v in P.items()}, C)
    buffers = _rows({k: v.cpu() for k, v in Bf.items()}, C)
    return [LocalResult(tr, bu, loss / (n or 1), n, y.shape[0])
            for tr, bu, loss, n, (_, y) in zip(trained, buffers, losses, seen, data)]


def _rows(stacked: dict[str, torch.Tensor], count: int) -> list[dict[str, torch.Tensor]]:
    """``{name: (C, *shape)}`` as C dicts of views of the rows (no copy)."""
    if not stacked:
        return [{} for _ in range(count)]
    names = list(stacked)
    return [dict(zip(names, row)) for row in zip(*[v.unbind(0) for v in stacked.values()])]


def _padded_data(data: list[tuple[torch.Tensor, torch.Tensor]], dev: torch.device,
                 keep: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The clients' samples padded to the largest client's N: ``X (C, N, *input)``, ``Y (C, N)`` (N ≥ 1, so
    the gathers have a row). The same clients' tensors come back round after round (client data are never
    modified in place), so the result is kept, keyed by the tensors' identity; the entry holds the tensors.
    It is kept when the same data come a second time (every round's devices under full participation, every
    evaluation's parts), not the first: data padded once (ClientPruning's chunks, a round of sampled devices) would
    fill the cache in proportion to the device count. At most :data:`PADDED_CACHE_BYTES` are kept; none with
    ``keep`` False."""
    key = (tuple([id(t) for xy in data for t in xy]), str(dev))
    if key in _PADDED:
        return _PADDED[key][0], _PADDED[key][1]
    again = key in _ASKED  # an id reused by other tensors only makes a one-off kept: the entry holds its own
    X = pad_sequence([x for x, _ in data], batch_first=True).to(dev)
    Y = pad_sequence([y for _, y in data], batch_first=True).to(dev)
    if X.shape[1] == 0:  # no client has a sample: there are no steps, but the gathers need a row
        X, Y = X.new_zeros((len(data), 1, *X.shape[2:])), Y.new_zeros((len(data), 1))
    if not keep:
        return X, Y
    if not again:
        if len(_ASKED) >= 4096:
            _ASKED.clear()
        _ASKED.add(key)
        return X, Y
    _ASKED.discard(key)
    size = X.numel() * X.element_size() + Y.numel() * Y.element_size()
    if size + sum(e[3] for e in _PADDED.values()) > PADDED_CACHE_BYTES:
        _PADDED.clear()
    if size <= PADDED_CACHE_BYTES:
        _PADDED[key] = (X, Y, list(data), size)
    return X, Y


def _grads_by_batch_size(loss_fn, P, K, Bf, X, Y, idx_s, parts_s, keys, loss_sum, dev):
    """One step for clients with buffers (batch norm) or their own loss: no padding may enter a batch's
    statistics or a loss we cannot weight per sample, so the clients are split by their real batch size (by the
    sizes of the step's minibatches when it has several: ``idx_s (C, k, B)``, ``parts_s (C, k)``); each split runs
    unpadded and updates only its own buffers."""
    C, per_step = parts_s.shape
    total = None
    for sizes in sorted(set(tuple(int(n) for n in row) for row in parts_s if row.sum() > 0)):
        sel_np = np.nonzero((parts_s == np.asarray(sizes)).all(1))[0]
        whole = len(sel_np) == C
        sel = torch.from_numpy(sel_np).to(dev)
        n = len(sel_np)
        pick = (lambda d: d) if whole else (lambda d: {k: v[sel] for k, v in d.items()})
        # a constant every client holds (MOON's global model) is one row broadcast: its first n rows, a view
        pick_const = (lambda d: d) if whole else (lambda d: {k: v[:n] if v.stride(0) == 0 else v[sel]
                                                             for k, v in d.items()})
        bsub = pick(Bf) if whole else {k: v[sel].clone() for k, v in Bf.items()}
        r = sel[:, None]
        xs = tuple(X[r, idx_s[sel, j, :b]] for j, b in enumerate(sizes))  # (C', b_j): real samples only
        ys = tuple(Y[r, idx_s[sel, j, :b]] for j, b in enumerate(sizes))
        xb, yb = (xs, ys) if per_step > 1 else (xs[0], ys[0])
        b = sum(sizes)
        ones = torch.ones(n, b, device=dev)
        data_loss, reg = loss_fn(pick(P), pick_const(K), bsub, xb, yb, ones, torch.full((n,), float(b), device=dev))
        if not whole:
            for k, v in bsub.items():
                Bf[k][sel] = v
        with torch.no_grad():
            loss_sum[sel] += data_loss.detach().double() * b
        part = (data_loss + reg).sum()
        total = part if total is None else total + part
    if total is None:
        return [None] * len(keys)
    return torch.autograd.grad(total, [P[k] for k in keys], allow_unused=True)


# -- evaluation ------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_many(models: list[EvalModel], data: list[tuple[torch.Tensor, torch.Tensor]],
                  batch_size: int = 512, device: str | torch.device = "cpu") -> list[tuple[float, float]]:
    """``(accuracy, mean cross-entropy)`` of each client's model on its test split ``data[i] = (x, y)``, as
    :func:`edgemask.trainer.local_training.evaluate` gives it (NaN for a client without test samples), for many clients
    at once: the models with the same function and tensor layout are stacked (a tensor every client holds is
    broadcast, not copied), their test sets padded, and ``vmap`` runs the forward over up to
    :data:`EVAL_SAMPLES_PER_CALL` clients × samples per call; padded samples are left out of the counts. Models
    that cannot run under ``vmap`` (an LSTM has no batching rule) are evaluated one after another, on the CPU.
    The stacked models and test sets run on ``device`` (``cuda`` when asked for and present: the training's
    device), so an :class:`EvalModel` must hold every tensor its function reads (as the masked models of
    :func:`edgemask.trainer.masks.masked_model` hold the global weights)."""
    dev = resolve_device(device)
    budget = eval_memory_budget(dev)
    out: list[tuple[float, float] | None] = [None] * len(models)
    for idx in eval_groups(models):
        group = dict(zip(idx, _shared_on([models[i] for i in idx], dev)))
        first = group[idx[0]]
        n_max = max(data[i][1].shape[0] for i in idx)  # shape, not len(): Tensor.__len__ is Python
        block = max(1, min(batch_size, n_max))
        own = sum(v.numel() * v.element_size() for d in (first.params, first.buffers) for v in d.values())
        # packed masks (masks.packed_masked_model) unpack in the forward: a float32 mask and the masked weight each
        own += sum(2 * 32 * v.numel() for k, v in first.params.items() if k.startswith(BITS_PREFIX))
        chunk = max(1, min(EVAL_SAMPLES_PER_CALL // block, budget // max(own, 1)))
        forward = vmap_clients(first.forward, BatchedLayers())
        for s in range(0, len(idx), chunk):
            part = idx[s: s + chunk]
            try:
                correct, loss, n = _evaluate_stacked(forward, [group[i] for i in part], [data[i] for i in part],
                                                     block, dev)
                scores = [(c / k, lo / k) if k else (float("nan"), float("nan"))
                          for c, lo, k in zip(correct.tolist(), loss.tolist(), n.tolist())]
            except RuntimeError:  # no batching rule for an op (LSTM): one client after another
                scores = [evaluate(models[i], *data[i], batch_size) for i in part]
            for i, sc in zip(part, scores):
                out[i] = sc
    return out  # type: ignore[return-value]


def eval_memory_budget(dev: torch.device) -> int:
    """Bytes of stacked per-client tensors one evaluation chunk may hold: :data:`EVAL_MEMORY_BUDGET` on the CPU,
    where it bounds the host's peak; on CUDA a quarter of the GPU's free memory (at least that), since a client's
    unpacked masks at full width (VGG16: 2 × 32 bits × 14.7 M / 8) alone would make a CPU-sized chunk 2 clients."""
    if dev.type != "cuda":
        return EVAL_MEMORY_BUDGET
    free, _ = torch.cuda.mem_get_info(dev)
    return max(EVAL_MEMORY_BUDGET, free // 4)


def _shared_on(models: list[EvalModel], dev: torch.device) -> list[EvalModel]:
    """``models`` with the tensors all of them hold as one object (a masked model's global weights) moved to a
    non-CPU ``dev`` once, so each chunk of :func:`evaluate_many` stacks a view of them instead of copying them
    from the host again; on the CPU, ``models`` as they are."""
    if dev.type == "cpu" or len(models) < 2:
        return models
    moved = [{k: ds[0][k].to(dev) for k in _held_keys(ds)}
             for ds in ([m.params for m in models], [m.buffers for m in models])]
    return [EvalModel({**m.params, **moved[0]}, {**m.buffers, **moved[1]}, m.forward) for m in models]


def eval_groups(models: list[EvalModel]) -> list[list[int]]:
    """Indices of ``models`` that can be stacked together: equal functions (as for tasks), the same tensor names,
    shapes and dtypes; groups in order of first appearance."""
    groups: dict[Hashable, list[int]] = {}
    memo: dict[Hashable, tuple] = {}
    for i, m in enumerate(models):
        groups.setdefault((m.forward, _spec(m.params, memo), _spec(m.buffers, memo)),
                          []).append(i)
    return list(groups.values())


def _evaluate_stacked(forward: Callable, models: list[EvalModel], data: list[tuple[torch.Tensor, torch.Tensor]],
                      block: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per client, on ``dev``: correct predictions, the summed cross-entropy (float64) and the test samples."""
    C = len(models)
    P = _stack([m.params for m in models], dev, copy=False)  # read only: shared tensors stay broadcast views
    B = _stack([m.buffers for m in models], dev, copy=False)
    # (C, N, *input), (C, N); on the CPU padded afresh each evaluation (every eval_every rounds, a copy of the test
    # samples), not kept: every device's test set would sit in the cache, more with every device
    X, Y = _padded_data(data, dev, keep=dev.type != "cpu")
    sizes = [y.shape[0] for _, y in data]
    n = torch.tensor(sizes, device=dev)
    correct = torch.zeros(C, dtype=torch.int64, device=dev)
    loss = torch.zeros(C, dtype=torch.float64, device=dev)
    for s in range(0, max(sizes), block):
        xb, yb = X[:, s: s + block], Y[:, s: s + block]
        logits = forward(P, B, xb)  # (C, b, classes)
        real = torch.arange(s, s + yb.shape[1], device=dev)[None, :] < n[:, None]  # (C, b): not padding
        ce = F.cross_entropy(logits.flatten(0, 1), yb.flatten(), reduction="none").view(C, -1)
        loss += (ce * real).sum(1, dtype=torch.float64)
        correct += ((logits.argmax(2) == yb) & real).sum(1)
    return correct, loss, n
