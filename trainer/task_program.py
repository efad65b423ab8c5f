"""What each :class:`~edgemask.trainer.records.LocalTask` field means to local training, written once for both engines
(the one-client loop :func:`edgemask.trainer.local_training.local_train` and the stacked one,
:mod:`edgemask.trainer.batched`); a new field is given its meaning here.

One step of a task, per client:

1. the step's minibatches: ``batches_per_step`` k consecutive minibatches of the client's batch order
   (:func:`edgemask.trainer.sampling.step_plan`, ``epochs`` and ``max_steps`` included);
2. the constants: ``constants`` with fresh uniform draws for ``noise`` from the client's own stream
   (:func:`noise_generator`, :func:`draw_noise`; a client draws only on the steps it takes);
3. the loss: the data loss — ``loss`` on the step's minibatches (a tuple of k when k > 1, :meth:`TaskProgram.own_loss`),
   else the mean cross-entropy of ``forward`` over the step's real samples (each engine writes that mean its own
   way: eagerly, or weighted over padded, stacked batches) — plus the ``regularizers``, summed in order
   (:attr:`TaskProgram.regularizer`); the history's loss is the data loss, weighted by the step's samples;
4. SGD's direction ``d = (∇ + wd·p) ⊙ grad_keep`` (:func:`direction`: weight decay before the keep mask, so frozen
   elements never move, momentum included), at the tensor's rate :func:`tensor_rate` (``lrs``, else ``lr``);
5. ``project``: its returned tensors replace the trainable ones it names (:attr:`TaskProgram.project`).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable

import torch

from edgemask.trainer.records import LocalTask
from edgemask.trainer.task_functions import Fn, ModelSpec, model_context, resolve

Tensors = dict[str, torch.Tensor]


class TaskProgram:
    """A kind of task's functions, resolved (:func:`~edgemask.trainer.task_functions.resolve`): one object per kind
    (:func:`program`), so the engines' caches keyed by it hold across rounds."""

    def __init__(self, model: ModelSpec, forward: Fn, regularizers: tuple[Fn, ...], loss: Fn | None,
                 project: Fn | None, batches_per_step: int) -> None:
        if batches_per_step > 1 and loss is None:
            raise ValueError(f"batches_per_step = {batches_per_step} needs the task's own loss (it receives the "
                             f"{batches_per_step} minibatches)")
        self.batches_per_step = batches_per_step
        self.forward: Callable = resolve(forward, model)  # (trainable, constants, x, buffers) -> logits
        self.loss: Callable | None = resolve(loss, model) if loss is not None else None
        self.project: Callable | None = resolve(project, model) if project is not None else None
        regs = [resolve(r, model) for r in regularizers]
        self.regularizer: Callable | None = regs[0] if len(regs) == 1 else (_summed(tuple(regs)) if regs else None)

    def own_loss(self, trainable: Tensors, constants: Tensors, xs: tuple[torch.Tensor, ...],
                 ys: tuple[torch.Tensor, ...], buffers: Tensors) -> torch.Tensor:
        """The task's own data loss of a step's minibatches ``xs``, ``ys`` (k of them; one is passed as it is)."""
        if self.batches_per_step > 1:
            return self.loss(trainable, constants, xs, ys, buffers)
        return self.loss(trainable, constants, xs[0], ys[0], buffers)


def _summed(regs: tuple[Callable, ...]) -> Callable:
    """``regs[0](p, c) + regs[1](p, c) + …``, left to right."""

    def regularizer(trainable: Tensors, constants: Tensors) -> torch.Tensor:
        total = regs[0](trainable, constants)
        for r in regs[1:]:
            total = total + r(trainable, constants)
        return total

    return regularizer


def kind(task: LocalTask) -> tuple[Hashable, ...]:
    """What makes two tasks the same function of their tensors: the model, the function names and settings, the
    minibatches per step and the noise they draw (the tensor layouts are the engines' to compare)."""
    return (task.model, task.forward, task.regularizers, task.loss, task.project, task.batches_per_step,
            tuple(task.noise.items()))


def program(task: LocalTask) -> TaskProgram:
    """The task's :class:`TaskProgram`, one per kind while its model context lasts."""
    cache = model_context(task.model).cache
    key = ("program", task.forward, task.regularizers, task.loss, task.project, task.batches_per_step)
    prog = cache.get(key)
    if prog is None:
        prog = cache[key] = TaskProgram(task.model, task.forward, task.regularizers, task.loss, task.project,
                                        task.batches_per_step)
    return prog


def tensor_rate(task: LocalTask, name: str) -> float:
    """The learning rate of the trainable tensor ``name``: its entry in ``lrs``, else ``lr``."""
    return task.lrs.get(name, task.lr)


def direction(grad: torch.Tensor, param: torch.Tensor, keep: torch.Tensor | None, weight_decay: float) -> torch.Tensor:
    """SGD's direction ``(∇ + wd·p) ⊙ keep`` (any shape, stacked clients too): weight decay is added *before*
    the elements where ``keep`` is 0 are zeroed, so frozen elements take no decay (unlike ``torch.optim.SGD``'s own
    ``weight_decay``, which adds wd·p inside ``step()``)."""
    if weight_decay:
        grad = grad.add(param, alpha=weight_decay)
    if keep is not None:
        grad = grad * keep
    return grad


def noise_generator(task: LocalTask) -> torch.Generator | None:
    """The client's own random stream for :attr:`LocalTask.noise` (``None`` when the task draws nothing)."""
    return torch.Generator().manual_seed(task.seed) if task.noise else None


def draw_noise(task: LocalTask, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One step's uniform [0, 1) tensors, in the task's order of names (the same in both engines)."""
    return {name: torch.rand(shape, generator=gen) for name, shape in task.noise.items()}


def step_constants(task: LocalTask, gen: torch.Generator | None) -> dict[str, Any]:
    """The constants one step's functions receive: the task's, with the step's fresh draws when it has noise."""
    return task.constants if gen is None else {**task.constants, **draw_noise(task, gen)}
