"""FedBABU (Oh, Kim and Yun, "FedBABU: Toward Enhanced Representation for Federated Image Classification",
ICLR 2022): during federated training the head stays at its random initialization (frozen, never sent) and only
the body is trained and averaged; after training each client fine-tunes — here its head, ``finetune_epochs``
epochs — and is evaluated with the fine-tuned model (accuracy before and after is reported). The fine-tuned heads
live in the run's device store (``heads``)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemask.trainer.accounting import partial_upload, state_layout
from edgemask.trainer.aggregation import average_buffers, average_state
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.models.registry import head_names
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask
from edgemask.trainer.task_functions import Fn

FROZEN = "frozen:"  # the fine-tuning task's constants: the body, by parameter name


@dataclass(frozen=True)
class FedBABUArgs:
    finetune_epochs: int = 5
    finetune_lr: float = -1.0  # -1: training.lr


@ALGORITHMS.register("fedbabu")
class FedBABU(Algorithm):
    name = "fedbabu"
    Args = FedBABUArgs

    def client_state_bytes(self) -> int:
        """Its fine-tuned head: a record of the device store."""
        return record_bytes(state_layout(self.global_params, list(head_names(self.model))))

    def setup(self) -> None:
        self.head = list(head_names(self.model))
        self.body = [k for k in self.global_params if k not in self.head]
        self.heads = self.store.table("heads", state_layout(self.global_params, self.head))  # after fine-tuning

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.grad_keep = {k: torch.zeros_like(self.global_params[k]) for k in self.head}
        return task

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        return [partial_upload(cid, res, self.body) for cid, res in results]

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        states, n = [u.payload for u in updates], [u.num_samples for u in updates]
        self.global_params = {**self.global_params, **average_state(states, n, self.body)}
        self.global_buffers = average_buffers(self.global_buffers, states, n)

    def finetune_task(self, cid: str) -> LocalTask | None:
        if self.args.finetune_epochs <= 0:
            return None
        lr = self.args.finetune_lr if self.args.finetune_lr > 0 else self.cfg.training.lr
        return LocalTask({k: self.global_params[k].clone() for k in self.head}, self.model_spec,
                         Fn.of("model.frozen", prefix=FROZEN),  # the head over the final body, frozen
                         constants={FROZEN + k: self.global_params[k] for k in self.body},
                         buffers={k: v.clone() for k, v in self.global_buffers.items()},
                         epochs=self.args.finetune_epochs, lr=lr)

    def finetune_result(self, cid: str, result: LocalResult) -> None:
        self.heads[cid] = dict(result.trained)

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel({**self.global_params, **self.heads.get(cid, {})}, self.global_buffers,
                          self.model_context.call)
                for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        return ClientState(params=dict(self.heads.get(cid, {})))
