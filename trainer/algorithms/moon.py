"""MOON (Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021), Eq. 3-4 and Algorithm 1: each client
minimizes, per minibatch,

    ℓ = ℓ_sup(w; (x, y)) + μ · ℓ_con(w; w^t, w_i^{t−1}; x)                                             (Eq. 4)
    ℓ_con = −log [ exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ]           (Eq. 3)

with sim the cosine similarity and z, z_glob, z_prev the representations of x under the local model being trained
w, the global model w^t the client received, and the client's own model from its previous participation
w_i^{t−1} (the global model at its first participation). The server averages as FedAvg; clients are evaluated
with the global model.

Choices the paper leaves to its architecture: MOON's networks end in base encoder → projection head → output
layer and take z after the projection head; our registered models have no projection head, so z is the input
of the model's classifier head (the ``head`` the personalization baselines split off, FedPer/FedRep), taken
with a forward pre-hook during a stateless call of the model (``trainer.models.stateless``) — any registered model
works, under ``vmap`` too. As in the authors' code the global and previous models are frozen and run in eval
mode (batch norm uses their running statistics and does not update them). ℓ_con is averaged over the minibatch
like the cross-entropy; the history's ``train_loss`` is the whole objective ℓ. w_i^{t−1} lives in the run's device
store (``previous``: its parameters and buffers, one record a device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from edgemask.errors import ConfigError
from edgemask.trainer.accounting import state_layout
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.losses import cross_entropy
from edgemask.trainer.models.stateless import stateless_call
from edgemask.trainer.records import ClientUpdate, LocalResult, LocalTask
from edgemask.trainer.task_functions import Fn, ModelContext, task_function

GLOBAL, PREV = "moon:glob:", "moon:prev:"  # the constants' prefixes: w^t and w_i^{t−1} (parameters and buffers)


@dataclass(frozen=True)
class MoonArgs:
    mu: float = 1.0  # μ (the paper uses 1 or 5; 5 on CIFAR-10)
    tau: float = 0.5  # τ, the temperature


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 3, averaged over the batch: z, z_glob, z_prev ``(B, d)``. −log(e^{s₊}/(e^{s₊} + e^{s₋})) is
    logaddexp(s₊, s₋) − s₊ (no overflow at small τ); log 2 when z_glob = z_prev."""
    pos = F.cosine_similarity(z, z_glob, dim=-1) / tau  # (B,)
    neg = F.cosine_similarity(z, z_prev, dim=-1) / tau  # (B,)
    return (torch.logaddexp(pos, neg) - pos).mean()


def representation_call(model: nn.Module, head: str, tensors: dict[str, torch.Tensor],
                        x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(z, logits) of ``model`` with ``tensors`` (parameters and buffers): z ``(B, d)`` is the input of the
    module ``head``, logits ``(B, classes)``. The hook lives for this call only; it stores what flows through,
    so it works under ``vmap`` (z is then a per-client batched tensor, like the logits)."""
    seen: list[torch.Tensor] = []
    handle = model.get_submodule(head).register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    try:
        logits = stateless_call(model, tensors, (x,))
    finally:
        handle.remove()
    return seen[0].flatten(1), logits


@task_function("moon.loss")
def moon_loss(m: ModelContext, head: str, mu: float, tau: float):
    """The task's loss, Eq. 4: ℓ_sup + μ·ℓ_con, z the input of the module ``head``; w^t and w_i^{t−1} (with
    their buffers) in the constants ``GLOBAL`` / ``PREV`` + name."""
    model = m.model
    n_glob, n_prev = len(GLOBAL), len(PREV)

    def loss(trainable, constants, x, y, buffers):  # everything per client arrives in the arguments
        z, logits = representation_call(model, head, {**trainable, **buffers}, x)
        glob = {k[n_glob:]: v for k, v in constants.items() if k.startswith(GLOBAL)}
        prev = {k[n_prev:]: v for k, v in constants.items() if k.startswith(PREV)}
        was_training = model.training
        model.eval()  # frozen anchors: running statistics, not updated
        try:
            with torch.no_grad():
                z_glob = representation_call(model, head, glob, x)[0]
                z_prev = representation_call(model, head, prev, x)[0]
        finally:
            model.train(was_training)
        return cross_entropy(logits, y) + mu * contrastive_loss(z, z_glob, z_prev, tau)  # Eq. 4

    return loss


@ALGORITHMS.register("moon")
class Moon(Algorithm):
    name = "moon"
    Args = MoonArgs

    def client_state_bytes(self) -> int:
        """Its previous local model w_i^{t−1} with its buffers: a record of the device store."""
        return record_bytes(state_layout(self.global_params, buffers=self.global_buffers))

    def setup(self) -> None:
        heads = tuple(getattr(self.model, "head", ()))
        if len(heads) != 1:
            raise ConfigError(f"moon: model {self.cfg.model.name!r} must name one classifier head module "
                              f"(its input is MOON's representation z), it names {heads or 'none'}; "
                              f"set the model class's ``head`` attribute")
        self.head = heads[0]
        # w_i^{t−1} with its buffers, per client (the global model's at its first participation)
        self.previous = self.store.table("previous", state_layout(self.global_params, buffers=self.global_buffers))
        self.loss = Fn.of("moon.loss", head=self.head, mu=self.args.mu, tau=self.args.tau)

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        glob = {**self.global_params, **self.global_buffers}
        task.constants.update({GLOBAL + k: v for k, v in glob.items()})
        task.constants.update({PREV + k: v for k, v in self.previous.get(cid, glob).items()})
        task.loss = self.loss
        return task

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        for cid, result in results:  # z_prev's model at the client's next participation
            self.previous[cid] = {**result.trained, **result.buffers}
        return super().client_updates(rnd, results)
