"""The one local-training loop: minibatch SGD on whatever tensors a :class:`LocalTask` names."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from trainer.records import LocalResult, LocalTask


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(logits, y)`` over a batch ``(B, classes)`` written out: log-softmax, the target's entry,
    and for ``"mean"`` the sum over the batch divided by B. Under ``vmap`` PyTorch computes exactly these ops (its
    decomposition of ``nll_loss``, which has no batching rule: the same bits, tested), but through Python machinery
    costing milliseconds a call, and its first call imports sympy (~0.8 s). Per sample (``"none"``) this is
    F.cross_entropy's bits; the eager mean (a cascaded sum) can differ in the last bit, so a task's own loss uses
    this in both loops."""
    per_sample = -logits.log_softmax(-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    if reduction == "none":
        return per_sample
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    return per_sample.sum() / y.shape[-1]


def step_plan(orders: list[np.ndarray], epochs: int, max_steps: int | None, batch_size: int,
              batches_per_step: int = 1) -> np.ndarray:
    """The client's optimizer steps as sample indices, ``(steps, batches_per_step, batch_size)``, -1 padding a
    partial minibatch (the last of an epoch). The minibatches are the consecutive ``batch_size`` slices of each
    epoch's order, epochs one after another; a step takes the next ``batches_per_step`` of them, a last incomplete
    group wrapping around to the first minibatches; ``max_steps`` keeps the first steps. The one plan of both the
    sequential and the batched loop."""
    rows = []
    for epoch in range(epochs):
        order = np.asarray(orders[epoch % len(orders)], dtype=np.int64)
        nb = -(-len(order) // batch_size)
        padded = np.full(nb * batch_size, -1, dtype=np.int64)
        padded[: len(order)] = order
        rows.append(padded.reshape(nb, batch_size))
    out = np.concatenate(rows) if rows else np.zeros((0, batch_size), dtype=np.int64)
    k = batches_per_step
    if k < 1:
        raise ValueError(f"batches_per_step must be ≥ 1, got {k}")
    steps = -(-len(out) // k)
    out = out[np.arange(steps * k) % max(len(out), 1)] if len(out) else out
    out = out.reshape(steps, k, batch_size)
    return out[:max_steps] if max_steps is not None else out


def noise_generator(task: LocalTask) -> torch.Generator | None:
    """The client's own random stream for :attr:`LocalTask.noise` (``None`` when the task draws nothing)."""
    return torch.Generator().manual_seed(task.seed) if task.noise else None


def draw_noise(task: LocalTask, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One step's uniform [0, 1) tensors, in the task's order of names (the same in both loops)."""
    return {name: torch.rand(shape, generator=gen) for name, shape in task.noise.items()}


def local_train(task: LocalTask, x: torch.Tensor, y: torch.Tensor, orders: list[np.ndarray],
                batch_size: int, momentum: float = 0.0, weight_decay: float = 0.0) -> LocalResult:
    """Run ``task.epochs`` epochs over the client's samples in the given per-epoch orders (:func:`step_plan`).

    Loss per step: mean cross-entropy (or ``task.loss``) + ``task.regularizer`` (if any). SGD's direction is
    d = (∇ + wd·p) ⊙ keep: weight decay is added to the gradient *before* the elements where ``task.grad_keep`` is
    0 are zeroed, so frozen elements never move (decay and momentum included), unlike ``torch.optim.SGD``'s own
    ``weight_decay``, which adds wd·p inside ``step()``; after the step, ``task.project`` (if any) replaces the
    tensors it returns.
    """
    k = task.batches_per_step
    if k > 1 and task.loss is None:
        raise ValueError(f"batches_per_step = {k} needs the task's own loss (it receives the {k} minibatches)")
    params = {k_: v.detach().clone().requires_grad_(True) for k_, v in task.trainable.items()}
    buffers = {k_: v.clone() for k_, v in task.buffers.items()}
    groups = ([{"params": [v], "lr": task.lrs.get(n, task.lr)} for n, v in params.items()] if task.lrs
              else list(params.values()))  # per-tensor rates where the task names any
    opt = torch.optim.SGD(groups, lr=task.lr, momentum=momentum)  # weight decay below, before the masking
    keep = {n: task.grad_keep[n] for n in params if n in task.grad_keep}
    total, seen = 0.0, 0
    gen = noise_generator(task)
    consts = task.constants
    for step in step_plan(orders, task.epochs, task.max_steps, batch_size, k):
        parts = [torch.from_numpy(r[r >= 0]) for r in step]
        n = sum(len(i) for i in parts)
        if gen is not None:  # the step's fresh random numbers (LocalTask.noise)
            consts = {**task.constants, **draw_noise(task, gen)}
        if k > 1:
            loss = task.loss(params, consts, tuple(x[i] for i in parts), tuple(y[i] for i in parts), buffers)
        elif task.loss is not None:
            loss = task.loss(params, consts, x[parts[0]], y[parts[0]], buffers)
        else:
            loss = F.cross_entropy(task.forward(params, consts, x[parts[0]], buffers), y[parts[0]])
        total += float(loss.detach()) * n
        seen += n
        if task.regularizer is not None:
            loss = loss + task.regularizer(params, consts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if weight_decay:  # on every tensor with a gradient, as torch.optim.SGD would (it skips the others)
            for p in params.values():
                if p.grad is not None:
                    p.grad.add_(p.detach(), alpha=weight_decay)
        for name, m in keep.items():
            if params[name].grad is not None:
                params[name].grad.mul_(m)
        opt.step()
        if task.project is not None:
            with torch.no_grad():
                for name, v in task.project(params).items():
                    params[name].copy_(v)
    trained = {n: v.detach() for n, v in params.items()}
    return LocalResult(trained, buffers, total / max(seen, 1), seen, int(len(y)))


@torch.no_grad()
def evaluate(forward, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``forward`` on a test split."""
    if len(y) == 0:
        return float("nan"), float("nan")
    correct, loss = 0, 0.0
    for s in range(0, len(y), batch_size):
        logits = forward(x[s: s + batch_size])
        loss += float(F.cross_entropy(logits, y[s: s + batch_size], reduction="sum"))
        correct += int((logits.argmax(1) == y[s: s + batch_size]).sum())
    return correct / len(y), loss / len(y)
