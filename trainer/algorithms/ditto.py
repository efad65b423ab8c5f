"""Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021),
Algorithm 1: each round a client updates the global model w as FedAvg does (phase 0, uploaded and averaged), then
its personal model v_k on min F_k(v) + λ/2 ‖v − w^t‖², w^t the global model it received (phase 1, kept
locally). Clients are evaluated, and exported, with v_k."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemask.trainer.accounting import copy_bytes, fedavg_upload
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.losses import with_proximal
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask


@dataclass(frozen=True)
class DittoArgs:
    lam: float = 0.1  # λ
    personal_epochs: int = -1  # -1: training.local_epochs


@ALGORITHMS.register("ditto")
class Ditto(Algorithm):
    name = "ditto"
    Args = DittoArgs

    def client_state_bytes(self) -> int:
        """Its personal model and batch-norm statistics."""
        return copy_bytes(self.global_params, buffers=self.global_buffers)

    def setup(self) -> None:
        self.personal: dict[str, dict[str, torch.Tensor]] = {}
        self.personal_buffers: dict[str, dict[str, torch.Tensor]] = {}
        self.round_updates: dict[str, LocalResult] = {}

    def next_phases(self, rnd: int, phase: int, results: list[tuple[str, LocalResult]]) -> list[LocalTask | None]:
        """Phase 1: each client's personal model v after its global-model update (phase 0); then done."""
        return [self._personal_task(cid, res) if phase == 1 else None for cid, res in results]

    def _personal_task(self, cid: str, result: LocalResult) -> LocalTask:
        self.round_updates[cid] = result  # the global-model update (phase 0) is what the client uploads
        v = self.personal.get(cid, self.global_params)
        task = LocalTask({k: t.clone() for k, t in v.items()}, self.model_spec,
                         buffers={k: t.clone() for k, t in self.personal_buffers.get(cid, self.global_buffers).items()},
                         epochs=(self.args.personal_epochs if self.args.personal_epochs > 0
                                 else self.cfg.training.local_epochs),
                         lr=self.cfg.training.lr)
        return with_proximal(task, self.global_params, self.args.lam)  # λ/2 ‖v − w^t‖²

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Each client keeps its personal model (the last phase) and uploads its global-model update, as FedAvg."""
        out = []
        for cid, result in results:
            self.personal[cid], self.personal_buffers[cid] = result.trained, result.buffers
            glob = self.round_updates.pop(cid)
            glob.samples_seen = result.samples_seen
            out.append(fedavg_upload(cid, glob, self.dense_bytes))
        return out

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel(self.personal.get(cid, self.global_params),
                          self.personal_buffers.get(cid, self.global_buffers), self.model_context.call) for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        return ClientState(params={**self.personal.get(cid, {}), **self.personal_buffers.get(cid, {})})
