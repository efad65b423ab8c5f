"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated Learning", ICML 2021),
Algorithm 1: each round a client first trains its head for ``head_epochs`` epochs with the body frozen, then the
body for ``training.local_epochs`` epochs with the head frozen; only the body is averaged, the head stays local.
FedPer's bookkeeping plus one extra local phase (``next_phases``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemask.trainer.algorithms.base import ALGORITHMS
from edgemask.trainer.algorithms.fedper import FedPer
from edgemask.trainer.records import LocalResult, LocalTask


@dataclass(frozen=True)
class FedRepArgs:
    head_epochs: int = 10  # τ_h (FedRep's default on CIFAR)


@ALGORITHMS.register("fedrep")
class FedRep(FedPer):
    name = "fedrep"
    Args = FedRepArgs

    def _freeze(self, task: LocalTask, frozen: list[str]) -> LocalTask:
        task.grad_keep = {k: torch.zeros_like(task.trainable[k]) for k in frozen}
        return task

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = self._freeze(super().local_task(cid, rnd), self.body)  # phase 0: the head, body frozen
        task.epochs = self.args.head_epochs
        return task

    def next_phases(self, rnd: int, phase: int, results: list[tuple[str, LocalResult]]) -> list[LocalTask | None]:
        """Phase 1: the body, from the trained head; then done."""
        return [self._body_task(cid, rnd, res) if phase == 1 else None for cid, res in results]

    def _body_task(self, cid: str, rnd: int, result: LocalResult) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.trainable = {k: v.clone() for k, v in result.trained.items()}
        task.buffers = {k: v.clone() for k, v in result.buffers.items()}
        return self._freeze(task, self.head)
