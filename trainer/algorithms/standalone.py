"""Standalone (FedMask §4.3, Li et al., SenSys 2021): every device trains its own model on its own data only;
nothing is communicated (0 bytes up and down).

Same total training time as the federated runs (§4.3: "the same total training time for Standalone method and
FedMask, i.e., the total number of local training epochs in Standalone method will be greater"): a federated run
takes ``rounds`` rounds of E local epochs on the clock, but a device trains only in the rounds it is sampled
(≈ K·rounds·E epochs). A standalone device needs no server, so it trains E epochs in *every* round of the same
clock: :meth:`round_clients` returns all clients, and each ends with exactly E × rounds local epochs. Every client
starts from the same seeded initial weights; evaluation uses its own model. A device's model lives in the run's
device store (``own``: its parameters and batch-norm statistics, one record), read when it trains or is evaluated.
"""

from __future__ import annotations

import torch

from edgemask.trainer.accounting import state_layout
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask


@ALGORITHMS.register("standalone")
class Standalone(Algorithm):
    name = "standalone"

    def client_state_bytes(self) -> int:
        """Its own model and batch-norm statistics: a record of the device store."""
        return record_bytes(state_layout(self.global_params, buffers=self.global_buffers))

    def setup(self) -> None:
        # each device's model once it has trained; before, the seeded initial one (the server's, which never moves)
        self.own = self.store.table("own", state_layout(self.global_params, buffers=self.global_buffers))

    def model_of(self, cid: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The device's parameters and batch-norm statistics."""
        rec = self.own.get(cid)
        if rec is None:
            return self.global_params, self.global_buffers
        return ({k: rec[k] for k in self.global_params}, {k: rec[k] for k in self.global_buffers})

    def round_clients(self, rnd: int, sampled: list[str]) -> list[str]:
        return list(self.client_ids)  # E epochs per round for everyone: E × rounds in all

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        params, buffers = self.model_of(cid)  # the loops train copies (LocalTask)
        task.trainable, task.buffers = dict(params), dict(buffers)
        return task

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Each client keeps what it trained; nothing crosses the network."""
        out = []
        for cid, result in results:
            self.own[cid] = {**result.trained, **result.buffers}
            out.append(ClientUpdate(cid, result.num_samples, {}, bytes_up=0, bytes_down=0, train_loss=result.loss,
                                    samples_seen=result.samples_seen))
        return out

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        """No server."""

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel(*self.model_of(cid), self.model_context.call) for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        params, buffers = self.model_of(cid)
        return ClientState(params={**params, **buffers})
