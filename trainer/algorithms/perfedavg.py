"""Per-FedAvg, first-order version (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning: A
Meta-Learning Approach", NeurIPS 2020, Algorithm 1 with the FO-MAML gradient of §5 / Eq. 8-9).

Each local step uses two separately drawn minibatches D and D' (Fallah et al. Algorithm 1: at local step t device
i samples D_t^i and D'_t^i independently; the first-order version, Per-FedAvg (FO), drops the Hessian term of the
MAML gradient, so the third batch D''_t^i is not needed):
    w̃ = w − α ∇f(w; D)            (inner step, α = ``alpha``)
    w ← w − β ∇f(w̃; D')           (outer step, β = training.lr)
written as the loss L(w) = f(w − α·stopgrad(∇f(w; D)); D'), whose gradient is exactly ∇f(w̃; D').

Which minibatches: the client's deterministic batch order (``trainer.sampling.batch_order``, a fresh permutation per
epoch and round, the same in the sequential and batched loops) cut into ``batch_size`` minibatches, epochs one after
another, taken as consecutive pairs (D, D') = (B_0, B_1), (B_2, B_3), …: the task sets ``batches_per_step = 2``, so
one local step consumes two minibatches and E local epochs of n samples make ⌈E·⌈n/B⌉ / 2⌉ steps. With an odd
count, the last D is paired with the round's first minibatch B_0 (a different batch, as an independent draw may be;
only a client whose whole round is one minibatch uses it as both D and D'). ``max_steps`` counts such steps.
The server averages like FedAvg. Personalized evaluation: each device adapts the global model with one gradient
step of size α on its whole local training set (full batch), w_i = w − α ∇f(w; D_i^train), and is tested with
w_i; that adapted model is what the run directory stores for the client, kept from its last evaluation in the run's
device store (``personal``). With the batched engine, every client's adaptation step runs at once
(:meth:`PerFedAvg.eval_models`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from edgemask.trainer.accounting import state_layout
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.losses import cross_entropy
from edgemask.trainer.records import ClientState, EvalModel, LocalTask
from edgemask.trainer.task_functions import Fn, ModelContext, task_function


@dataclass(frozen=True)
class PerFedAvgArgs:
    alpha: float = 0.01  # inner (adaptation) step size; the outer step β is training.lr


@dataclass(frozen=True)
class FoMamlLoss:
    """The first-order MAML loss of one step on two minibatches, ``x = (x_D, x_D')``, ``y = (y_D, y_D')``: D for
    the inner step, D' for the outer (a task with ``batches_per_step = 2``). ``call(params, buffers, x)`` is the
    model. A task names it as the task function ``perfedavg.fo_maml`` (setting ``alpha``)."""

    call: Callable
    alpha: float

    def inner(self, q, b, x_d, y_d):  # f(w; D), and the buffers its forward updated (batch norm)
        b = {k: v.clone() for k, v in b.items()}
        return cross_entropy(self.call(q, b, x_d), y_d), b

    def __call__(self, p, c, x, y, b):
        (x_d, x_d2), (y_d, y_d2) = x, y
        # ∇f(w; D) at stopgrad(w): first order. torch.func.grad (not autograd.grad) so that the batched loop can
        # vmap the step over clients; the inner forward's buffer updates come back as aux and are kept.
        grads, new_b = torch.func.grad(self.inner, has_aux=True)({k: v.detach() for k, v in p.items()}, b, x_d, y_d)
        for k, v in new_b.items():
            b[k].copy_(v)
        adapted = {k: v - self.alpha * grads[k] for k, v in p.items()}
        return cross_entropy(self.call(adapted, b, x_d2), y_d2)


@task_function("perfedavg.fo_maml")
def fo_maml_loss(m: ModelContext, alpha: float) -> FoMamlLoss:
    """Per-FedAvg's step loss (:class:`FoMamlLoss`) on the task's model."""
    return FoMamlLoss(m.call, alpha)


def adapt(call: Callable, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
          x: torch.Tensor, y: torch.Tensor, alpha: float) -> dict[str, torch.Tensor]:
    """One gradient step of size α on (x, y): the personalized model."""
    with torch.enable_grad():
        p = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        grads = torch.autograd.grad(cross_entropy(call(p, buffers, x), y), list(p.values()), allow_unused=True)
    return {k: (v - alpha * g if g is not None else v).detach() for (k, v), g in zip(p.items(), grads)}


@ALGORITHMS.register("perfedavg")
class PerFedAvg(Algorithm):
    name = "perfedavg"
    Args = PerFedAvgArgs

    def client_state_bytes(self) -> int:
        """Its adapted model (evaluation's one step): a record of the device store."""
        return record_bytes(state_layout(self.global_params))

    def setup(self) -> None:
        self.personal = self.store.table("personal", state_layout(self.global_params))  # w_i of the last evaluation

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.loss = Fn.of("perfedavg.fo_maml", alpha=self.args.alpha)
        task.batches_per_step = 2  # (D, D'): two consecutive minibatches of the client's order per step
        return task

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        """Each client's model adapted by one gradient step of size α on its whole training set (a client without
        training data takes none). An engine that trains clients together (``self.engine.together``: the batched
        one) takes every client's step at once: a local task of one step of size α (``lr = alpha``, no momentum or
        decay) over one minibatch of all the client's samples is :func:`adapt` up to float rounding; the
        one-after-another reference runs :func:`adapt` itself."""
        if self.engine.together:
            data = [self.dataset.client(cid) for cid in cids]
            tasks = [LocalTask(dict(self.global_params), self.model_spec, buffers=dict(self.global_buffers),
                               lr=self.args.alpha) for _ in cids]
            whole = max([d.num_train for d in data] + [1])
            results = self.engine.train(tasks, [(d.train_x, d.train_y) for d in data],
                                        [[np.arange(d.num_train)] for d in data], whole)
            adapted = [res.trained for res in results]
        else:
            adapted = [self._adapted(cid) for cid in cids]
        for cid, w in zip(cids, adapted):
            self.personal[cid] = w
        return [EvalModel(w, self.global_buffers, self.model_context.call) for w in adapted]

    def _adapted(self, cid: str) -> dict[str, torch.Tensor]:
        d = self.dataset.client(cid)
        if not len(d.train_y):
            return dict(self.global_params)
        return adapt(self.model_context.call, self.global_params, self.global_buffers, d.train_x, d.train_y,
                     self.args.alpha)

    def client_state(self, cid: str) -> ClientState:
        w = self.personal.get(cid)
        if w is None:
            w = self.personal[cid] = self._adapted(cid)
        return ClientState(params=dict(w))
