"""The one local-training loop: minibatch SGD on whatever tensors a :class:`LocalTask` names."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from trainer.algorithms.base import LocalResult, LocalTask


def local_train(task: LocalTask, x: torch.Tensor, y: torch.Tensor, orders: list[np.ndarray],
                batch_size: int, momentum: float = 0.0, weight_decay: float = 0.0) -> LocalResult:
    """Run ``task.epochs`` epochs over the client's samples in the given per-epoch orders.

    Loss per batch: mean cross-entropy + ``task.regularizer`` (if any). Gradients of elements where
    ``task.grad_keep`` is 0 are zeroed before the step, so frozen elements never move (momentum included).
    """
    params = {k: v.detach().clone().requires_grad_(True) for k, v in task.trainable.items()}
    buffers = {k: v.clone() for k, v in task.buffers.items()}
    groups = ([{"params": [v], "lr": task.lrs.get(k, task.lr)} for k, v in params.items()] if task.lrs
              else list(params.values()))  # per-tensor rates where the task names any
    opt = torch.optim.SGD(groups, lr=task.lr, momentum=momentum, weight_decay=weight_decay)
    keep = {k: task.grad_keep[k] for k in params if k in task.grad_keep}
    total, seen, steps = 0.0, 0, 0
    for epoch in range(task.epochs):
        order = orders[epoch % len(orders)]
        for start in range(0, len(order), batch_size):
            if task.max_steps is not None and steps >= task.max_steps:
                break
            idx = torch.from_numpy(order[start: start + batch_size])
            xb, yb = x[idx], y[idx]
            if task.loss is not None:
                loss = task.loss(params, task.constants, xb, yb, buffers)
            else:
                loss = F.cross_entropy(task.forward(params, task.constants, xb, buffers), yb)
            total += float(loss.detach()) * len(idx)
            seen += len(idx)
            if task.regularizer is not None:
                loss = loss + task.regularizer(params, task.constants)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            for k, m in keep.items():
                if params[k].grad is not None:
                    params[k].grad.mul_(m)
            opt.step()
            steps += 1
    trained = {k: v.detach() for k, v in params.items()}
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
