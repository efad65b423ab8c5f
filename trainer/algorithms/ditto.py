"""Ditto (Li et al., "Ditto: Fair and Robust Federated Learning Through Personalization", ICML 2021),
Algorithm 1: each round a client updates the global model w as FedAvg does (phase 0, uploaded and averaged), then
its personal model v_k on min F_k(v) + λ/2 ‖v − w^t‖², w^t the global model it received (phase 1, kept
locally). Clients are evaluated, and exported, with v_k, which lives in the run's device store (``personal``: its
parameters and batch-norm statistics, one record)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemask.trainer.accounting import fedavg_upload, state_layout
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
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
        """Its personal model and batch-norm statistics: a record of the device store."""
        return record_bytes(state_layout(self.global_params, buffers=self.global_buffers))

    def setup(self) -> None:
        self.personal = self.store.table("personal", state_layout(self.global_params, buffers=self.global_buffers))
        self.round_updates: dict[str, LocalResult] = {}  # this round's global-model updates, until uploaded

    def personal_model(self, cid: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """v_k and its batch-norm statistics; the global model's before the client has trained."""
        rec = self.personal.get(cid)
        if rec is None:
            return self.global_params, self.global_buffers
        return {k: rec[k] for k in self.global_params}, {k: rec[k] for k in self.global_buffers}

    def next_phases(self, rnd: int, phase: int, results: list[tuple[str, LocalResult]]) -> list[LocalTask | None]:
        """Phase 1: each client's personal model v after its global-model update (phase 0); then done."""
        return [self._personal_task(cid, res) if phase == 1 else None for cid, res in results]

    def _personal_task(self, cid: str, result: LocalResult) -> LocalTask:
        self.round_updates[cid] = result  # the global-model update (phase 0) is what the client uploads
        v, buffers = self.personal_model(cid)
        task = LocalTask({k: t.clone() for k, t in v.items()}, self.model_spec,
                         buffers={k: t.clone() for k, t in buffers.items()},
                         epochs=(self.args.personal_epochs if self.args.personal_epochs > 0
                                 else self.cfg.training.local_epochs),
                         lr=self.cfg.training.lr)
        return with_proximal(task, self.global_params, self.args.lam)  # λ/2 ‖v − w^t‖²

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Each client keeps its personal model (the last phase) and uploads its global-model update, as FedAvg."""
        out = []
        for cid, result in results:
            self.personal[cid] = {**result.trained, **result.buffers}
            glob = self.round_updates.pop(cid)
            glob.samples_seen = result.samples_seen
            out.append(fedavg_upload(cid, glob, self.dense_bytes))
        return out

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel(*self.personal_model(cid), self.model_context.call) for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        return ClientState(params=self.personal.get(cid, {}))
