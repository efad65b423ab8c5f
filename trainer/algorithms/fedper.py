"""FedPer (Arivazhagan et al., "Federated Learning with Personalization Layers", 2019): the base layers are
trained by every client and averaged by sample count (FedAvg); the personalization layers — here the model's
``head`` — stay on each client, trained locally and never averaged. A client's head lives in the run's device
store (``heads``) once it has trained; before, it is the seeded initial head every client starts from."""

from __future__ import annotations

import torch

from edgemask.trainer.accounting import partial_upload, state_layout
from edgemask.trainer.aggregation import average_buffers, average_state
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.models.registry import head_names
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask


@ALGORITHMS.register("fedper")
class FedPer(Algorithm):
    name = "fedper"

    def client_state_bytes(self) -> int:
        """Its personal head (FedRep's too): a record of the device store."""
        return record_bytes(state_layout(self.global_params, list(head_names(self.model))))

    def setup(self) -> None:
        self.head = [k for k in head_names(self.model)]
        self.body = [k for k in self.global_params if k not in self.head]
        self.start_head = {k: self.global_params[k].clone() for k in self.head}  # every client's before it trains
        self.heads = self.store.table("heads", state_layout(self.global_params, self.head))

    def head_of(self, cid: str) -> dict[str, torch.Tensor]:
        """The client's personal head."""
        return self.heads.get(cid, self.start_head)

    def personal_params(self, cid: str) -> dict[str, torch.Tensor]:
        return {**self.global_params, **self.head_of(cid)}

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.trainable = {k: v.clone() for k, v in self.personal_params(cid).items()}
        return task

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Each client keeps its head and uploads its body."""
        for cid, result in results:
            self.heads[cid] = {k: result.trained[k] for k in self.head}
        return [partial_upload(cid, res, self.body) for cid, res in results]

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        states, n = [u.payload for u in updates], [u.num_samples for u in updates]
        self.global_params = {**self.global_params, **average_state(states, n, self.body)}
        self.global_buffers = average_buffers(self.global_buffers, states, n)

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel(self.personal_params(cid), self.global_buffers, self.model_context.call) for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        return ClientState(params=dict(self.head_of(cid)))
