"""LG-FedAvg (Liang, Liu, Ziyin, Salakhutdinov, Morency, "Think Locally, Act Globally: Federated Learning with
Local and Global Representations", 2020, Algorithm 1): each device keeps its representation layers (every
parameter outside the model's ``head``, plus batch-norm statistics) local and personal; only the head θ_g is
global. A sampled device trains its whole model (local representation θ_l^k with the global head) for E epochs
and uploads the head only; the server averages the heads by sample count, θ_g ← Σ_k n_k θ_g^k / Σ_k n_k, and sends
the head back (float32 both ways). Evaluation: the device's own representation with the current global head.

Not done: the paper's optional first stage of plain FedAvg on the whole model before the split (Liang et al.
start from a FedAvg-trained model); here every device starts from the shared seeded initialization.
"""

from __future__ import annotations

import torch

from trainer.accounting import tensor_bytes
from trainer.algorithms.base import ALGORITHMS, Algorithm, ClientUpdate, LocalResult, LocalTask
from trainer.aggregation import average_state
from trainer.models import head_names
from trainer.run_dir import ClientState


@ALGORITHMS.register("lg_fedavg")
class LGFedAvg(Algorithm):
    name = "lg_fedavg"

    def setup(self) -> None:
        self.head = [n for n in head_names(self.model)]
        if not self.head:
            raise ValueError(f"lg_fedavg: model {self.cfg.model.name!r} declares no head")
        self.rep = {cid: {k: v.clone() for k, v in self.global_params.items() if k not in self.head}
                    for cid in self.client_ids}
        self.rep_buffers = {cid: {k: v.clone() for k, v in self.global_buffers.items()} for cid in self.client_ids}

    def _global_head(self) -> dict[str, torch.Tensor]:
        return {k: self.global_params[k] for k in self.head}

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.trainable = {**{k: v.clone() for k, v in self.rep[cid].items()},
                          **{k: v.clone() for k, v in self._global_head().items()}}
        task.buffers = self.rep_buffers[cid]
        return task

    def client_update(self, cid: str, rnd: int, result: LocalResult) -> ClientUpdate:
        self.rep[cid] = {k: v for k, v in result.trained.items() if k not in self.head}
        self.rep_buffers[cid] = dict(result.buffers)
        head = {k: result.trained[k] for k in self.head}
        return ClientUpdate(cid, result.num_samples, head, bytes_up=tensor_bytes(head),
                            bytes_down=tensor_bytes(self._global_head()), train_loss=result.loss,
                            samples_seen=result.samples_seen)

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        avg = average_state([u.payload for u in updates], [u.num_samples for u in updates], self.head)
        self.global_params = {**self.global_params, **avg}

    def eval_forward(self, cid: str):
        params = {**self.rep[cid], **self._global_head()}
        return lambda x: self.call(params, self.rep_buffers[cid], x)

    def client_state(self, cid: str) -> ClientState:
        return ClientState(params={**self.rep[cid], **self.rep_buffers[cid]})
