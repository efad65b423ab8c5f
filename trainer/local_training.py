"""The one local-training loop: minibatch SGD on whatever tensors a :class:`LocalTask` names."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from edgemask.trainer.records import LocalResult, LocalTask
from edgemask.trainer.sampling import step_plan
from edgemask.trainer.task_program import direction, noise_generator, program, step_constants, tensor_rate


def local_train(task: LocalTask, x: torch.Tensor, y: torch.Tensor, orders: list[np.ndarray],
                batch_size: int, momentum: float = 0.0, weight_decay: float = 0.0) -> LocalResult:
    """Run ``task.epochs`` epochs over the client's samples in the given per-epoch orders (:func:`step_plan`),
    each field read as :mod:`edgemask.trainer.task_program` says: loss per step the mean cross-entropy of the forward
    (or the task's own loss) + its regularizers; SGD's direction (∇ + wd·p) ⊙ keep (:func:`direction`), then the
    projection."""
    prog = program(task)
    k = task.batches_per_step
    params = {k_: v.detach().clone().requires_grad_(True) for k_, v in task.trainable.items()}
    buffers = {k_: v.clone() for k_, v in task.buffers.items()}
    groups = ([{"params": [v], "lr": tensor_rate(task, n)} for n, v in params.items()] if task.lrs
              else list(params.values()))  # per-tensor rates where the task names any
    opt = torch.optim.SGD(groups, lr=task.lr, momentum=momentum)  # weight decay in direction(), before the keep
    keep = {n: task.grad_keep[n] for n in params if n in task.grad_keep}
    total, seen = 0.0, 0
    gen = noise_generator(task)
    for step in step_plan(orders, task.epochs, task.max_steps, batch_size, k):
        parts = [torch.from_numpy(r[r >= 0]) for r in step]
        n = sum(len(i) for i in parts)
        consts = step_constants(task, gen)
        if prog.loss is not None:
            loss = prog.own_loss(params, consts, tuple(x[i] for i in parts), tuple(y[i] for i in parts), buffers)
        else:
            loss = F.cross_entropy(prog.forward(params, consts, x[parts[0]], buffers), y[parts[0]])
        total += float(loss.detach()) * n
        seen += n
        if prog.regularizer is not None:
            loss = loss + prog.regularizer(params, consts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        for name, p in params.items():  # on every tensor with a gradient, as torch.optim.SGD would
            if p.grad is not None and (weight_decay or name in keep):
                p.grad = direction(p.grad, p.detach(), keep.get(name), weight_decay)
        opt.step()
        if prog.project is not None:
            with torch.no_grad():
                for name, v in prog.project(params).items():
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
