"""Standalone (FedMask §4.3, Li et al., SenSys 2021): every device trains its own model on its own data only;
nothing is communicated (0 bytes up and down).

Same total training time as the federated runs (§4.3: "the same total training time for Standalone method and
FedMask, i.e., the total number of local training epochs in Standalone method will be greater"): a federated run
takes ``rounds`` rounds of E local epochs on the clock, but a device trains only in the rounds it is sampled
(≈ K·rounds·E epochs). A standalone device needs no server, so it trains E epochs in *every* round of the same
clock: :meth:`round_clients` returns all clients, and each ends with exactly E × rounds local epochs. Every client
starts from the same seeded initial weights; evaluation uses its own model.
"""

from __future__ import annotations

from edgemask.trainer.accounting import copy_bytes
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask


@ALGORITHMS.register("standalone")
class Standalone(Algorithm):
    name = "standalone"

    def client_state_bytes(self) -> int:
        """Its own model and batch-norm statistics."""
        return copy_bytes(self.global_params, buffers=self.global_buffers)

    def setup(self) -> None:
        self.own = {cid: {k: v.clone() for k, v in self.global_params.items()} for cid in self.client_ids}
        self.own_buffers = {cid: {k: v.clone() for k, v in self.global_buffers.items()} for cid in self.client_ids}

    def round_clients(self, rnd: int, sampled: list[str]) -> list[str]:
        return list(self.client_ids)  # E epochs per round for everyone: E × rounds in all

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.trainable, task.buffers = self.own[cid], self.own_buffers[cid]
        return task

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Each client keeps what it trained; nothing crosses the network."""
        out = []
        for cid, result in results:
            self.own[cid], self.own_buffers[cid] = dict(result.trained), dict(result.buffers)
            out.append(ClientUpdate(cid, result.num_samples, {}, bytes_up=0, bytes_down=0, train_loss=result.loss,
                                    samples_seen=result.samples_seen))
        return out

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        """No server."""

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel(self.own[cid], self.own_buffers[cid], self.model_context.call) for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        return ClientState(params={**self.own[cid], **self.own_buffers[cid]})
