"""The one local-training loop: minibatch SGD on whatever tensors a :class:`LocalTask` names."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from trainer.records import LocalResult, LocalTask
from trainer.sampling import step_plan


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
