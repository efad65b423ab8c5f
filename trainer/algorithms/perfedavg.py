"""Per-FedAvg, first-order version (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning: A
Meta-Learning Approach", NeurIPS 2020, Algorithm 1 with the FO-MAML gradient of §5 / Eq. 8-9).

Local step on two independent batches D, D' (here the two halves of each minibatch of the one local loop, whose
order is a fresh random permutation, so they are independent draws):
    w̃ = w − α ∇f(w; D)            (inner step, α = ``alpha``)
    w ← w − β ∇f(w̃; D')           (outer step, β = training.lr; first order: the Hessian term is dropped)
written as the loss L(w) = f(w − α·stopgrad(∇f(w; D)); D'), whose gradient is exactly ∇f(w̃; D'). The server
averages like FedAvg. Personalized evaluation: each device adapts the global model with one gradient step of size
α on its whole local training set (full batch), w_i = w − α ∇f(w; D_i^train), and is tested with w_i; that
adapted model is what the run directory stores for the client.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from trainer.algorithms.base import ALGORITHMS, Algorithm, LocalTask
from trainer.run_dir import ClientState


@dataclass(frozen=True)
class PerFedAvgArgs:
    alpha: float = 0.01  # inner (adaptation) step size; the outer step β is training.lr


def fo_maml_loss(call: Callable, alpha: float) -> Callable:
    """The first-order MAML loss of one minibatch: first half D for the inner step, second half D' for the outer."""
    def loss(p, c, x, y, b):
        h = (len(y) + 1) // 2
        if len(y) < 2:
            return F.cross_entropy(call(p, b, x), y)
        inner = F.cross_entropy(call(p, b, x[:h]), y[:h])
        grads = torch.autograd.grad(inner, list(p.values()), allow_unused=True)  # no create_graph: first order
        adapted = {k: v - alpha * g if g is not None else v for (k, v), g in zip(p.items(), grads)}
        return F.cross_entropy(call(adapted, b, x[h:]), y[h:])
    return loss


def adapt(call: Callable, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
          x: torch.Tensor, y: torch.Tensor, alpha: float) -> dict[str, torch.Tensor]:
    """One gradient step of size α on (x, y): the personalized model."""
    with torch.enable_grad():
        p = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
        grads = torch.autograd.grad(F.cross_entropy(call(p, buffers, x), y), list(p.values()), allow_unused=True)
    return {k: (v - alpha * g if g is not None else v).detach() for (k, v), g in zip(p.items(), grads)}


@ALGORITHMS.register("perfedavg")
class PerFedAvg(Algorithm):
    name = "perfedavg"
    Args = PerFedAvgArgs

    def setup(self) -> None:
        self.personal: dict[str, dict[str, torch.Tensor]] = {}

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.loss = fo_maml_loss(self.call, self.args.alpha)
        return task

    def eval_forward(self, cid: str):
        d = self.client_data(cid)
        if len(d.train_y):
            self.personal[cid] = adapt(self.call, self.global_params, self.global_buffers,
                                       d.train_x, d.train_y, self.args.alpha)
        else:
            self.personal[cid] = dict(self.global_params)
        params = self.personal[cid]
        return lambda x: self.call(params, self.global_buffers, x)

    def client_state(self, cid: str) -> ClientState:
        if cid not in self.personal:
            self.eval_forward(cid)
        return ClientState(params=dict(self.personal[cid]))
