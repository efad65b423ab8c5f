"""LG-FedAvg (Liang, Liu, Ziyin, Salakhutdinov, Morency, "Think Locally, Act Globally: Federated Learning with
Local and Global Representations", 2020, Algorithm 1), in its two stages (as FedMask §2 describes it: "In the
first step, each participating device optimizes and share the whole model with the central server like FedAvg.
In the second step, each device still updates the whole model but only the global parameters will be
communicated"):

1. Rounds t < W (``warmup_rounds``): plain FedAvg on the whole model — a sampled device downloads the global model,
   trains it for E epochs and uploads all of it (parameters and batch-norm statistics, float32 both ways); the
   server averages everything by sample count. Liang et al. start their second stage from such a FedAvg model
   (their released reproduction: ``main_fed.py`` then ``main_lg.py --load_fed best_400.pt`` on MNIST, i.e. 400
   FedAvg rounds before 100 LG-FedAvg rounds; CIFAR-10: 1200 before 200). At the switch every device's local
   representation is the final FedAvg model's.
2. Rounds t ≥ W: each device keeps its representation layers (every parameter outside the model's ``head``, plus
   batch-norm statistics) local and personal; only the head θ_g is global. A sampled device trains its whole model
   (local representation θ_l^k with the global head) for E epochs and uploads the head only; the server averages
   the heads by sample count, θ_g ← Σ_k n_k θ_g^k / Σ_k n_k, and sends the head back (float32 both ways). A device's
   first round of this stage also downloads the representation of the final FedAvg model once (it holds only its
   own last upload otherwise): bytes_down is then the whole model, the head alone after.

``warmup_rounds = -1`` (default): W = ⌊``warmup_fraction``·T⌋ of the run's T rounds, ``warmup_fraction = 0.8`` the
ratio of Liang et al.'s MNIST reproduction (400 of 500 rounds; FedMask Fig. 2's 1.30× saving of LG-FedAvg over
FedAvg on VGG16 likewise puts about 77 % of the traffic in the first stage). ``warmup_rounds = 0``: no first
stage, every device starts from the shared seeded initialization. Evaluation: the device's own representation with
the current global head (during the first stage, the global FedAvg model). A device's representation lives in the
run's device store (``rep``: its parameters and batch-norm statistics, one record) once it has trained locally.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemask.schema import setting
from edgemask.trainer.accounting import fedavg_upload, state_layout, tensor_bytes
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.aggregation import average_state
from edgemask.trainer.models import head_names
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask


@dataclass(frozen=True)
class LGFedAvgArgs:
    # W rounds of plain FedAvg on the whole model first; -1: ⌊warmup_fraction·T⌋
    warmup_rounds: int = setting(-1, minimum=-1)
    # Liang et al.'s MNIST reproduction: 400 FedAvg rounds, then 100 LG-FedAvg
    warmup_fraction: float = setting(0.8, minimum=0, maximum=1)


@ALGORITHMS.register("lg_fedavg")
class LGFedAvg(Algorithm):
    name = "lg_fedavg"
    Args = LGFedAvgArgs

    def client_state_bytes(self) -> int:
        """Its local representation (every parameter but the head) and batch-norm statistics: a record of the
        device store."""
        return record_bytes(self._layout())

    def _layout(self) -> dict:
        head = set(head_names(self.model))
        return state_layout(self.global_params, [k for k in self.global_params if k not in head], self.global_buffers)

    def setup(self) -> None:
        self.head = [n for n in head_names(self.model)]
        if not self.head:
            raise ValueError(f"lg_fedavg: model {self.cfg.model.name!r} declares no head")
        a, T = self.args, self.cfg.training.rounds
        self.warmup = a.warmup_rounds if a.warmup_rounds >= 0 else int(a.warmup_fraction * T)
        # a device's personal representation once it has trained in the local stage; before, the global model's
        # (the seeded init, or the FedAvg stage's: the local stage never changes the global representation)
        self.rep = self.store.table("rep", self._layout())

    def in_warmup(self, rnd: int) -> bool:
        return rnd < self.warmup

    def representation(self, cid: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The device's representation parameters and batch-norm statistics."""
        rec = self.rep.get(cid)
        if rec is None:
            return {k: v for k, v in self.global_params.items() if k not in self.head}, self.global_buffers
        return ({k: v for k, v in rec.items() if k in self.global_params},
                {k: v for k, v in rec.items() if k in self.global_buffers})

    def _global_head(self) -> dict[str, torch.Tensor]:
        return {k: self.global_params[k] for k in self.head}

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)  # first stage: the whole global model, as FedAvg
        if not self.in_warmup(rnd):
            rep, buffers = self.representation(cid)
            task.trainable = {**{k: v.clone() for k, v in rep.items()},
                              **{k: v.clone() for k, v in self._global_head().items()}}
            task.buffers = {k: v.clone() for k, v in buffers.items()}
        return task

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        return [self._upload(cid, rnd, res) for cid, res in results]

    def _upload(self, cid: str, rnd: int, result: LocalResult) -> ClientUpdate:
        """In the warmup FedAvg's upload; then the client keeps its representation and uploads its head."""
        if self.in_warmup(rnd):  # FedAvg: the whole model both ways
            return fedavg_upload(cid, result, self.dense_bytes)
        # a device's first local-stage round downloads the FedAvg model's representation once (without a first
        # stage every device holds the shared seed's already)
        first = self.warmup > 0 and cid not in self.rep
        self.rep[cid] = {**{k: v for k, v in result.trained.items() if k not in self.head}, **result.buffers}
        head = {k: result.trained[k] for k in self.head}
        down = {**self.global_params, **self.global_buffers} if first else self._global_head()
        return ClientUpdate(cid, result.num_samples, head, bytes_up=tensor_bytes(head),
                            bytes_down=tensor_bytes(down), train_loss=result.loss,
                            samples_seen=result.samples_seen)

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        if self.in_warmup(rnd):
            super().aggregate(rnd, updates)  # until the switch, every device's model is the global one
            return
        avg = average_state([u.payload for u in updates], [u.num_samples for u in updates], self.head)
        self.global_params = {**self.global_params, **avg}

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel({**rep, **self._global_head()}, buffers, self.model_context.call)
                for rep, buffers in map(self.representation, cids)]

    def client_state(self, cid: str) -> ClientState:
        rep, buffers = self.representation(cid)
        return ClientState(params={**rep, **buffers})

    def summary_extra(self) -> dict:
        return {"warmup_rounds": self.warmup}
