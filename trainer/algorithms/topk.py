"""Top-k sparsified FedAvg (FedMask §4.3 baseline, after Aji & Heafield, "Sparse Communication for Distributed
Gradient Descent", EMNLP 2017): each client uploads only the k = ``fraction`` (10 %) largest-magnitude elements of
its update Δ_k = w_k − w (flattened over all parameters), as float32 values plus int32 indices (8 bytes each).
The server averages the sparse updates weighted by sample counts, zeros counting where a client sent nothing:
w ← w + Σ_k n_k·sparse(Δ_k) / Σ_k n_k.

Error feedback: Aji & Heafield keep the dropped part as a local residual that is added to the next update
before selection ("gradient dropping" with residual accumulation); the FedMask paper does not say otherwise, so
``error_feedback = true`` by default (Δ_k ← Δ_k + r_k; r_k ← Δ_k − sparse(Δ_k)). The residual never travels.
Downlink: the dense float32 global model (a client sampled after missing rounds needs all of it). Batch-norm
statistics are averaged densely and costed as float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.accounting import tensor_bytes, topk_bytes
from trainer.aggregation import average_state
from trainer.algorithms.base import ALGORITHMS, Algorithm, ClientUpdate, LocalResult


@dataclass(frozen=True)
class TopKArgs:
    fraction: float = 0.1  # k as a fraction of the update's elements (paper: 10 %)
    error_feedback: bool = True


def top_k_sparsify(delta: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 indices, float32 values) of the k largest |delta| entries of a flat vector."""
    idx = torch.topk(delta.abs(), k).indices
    return idx.to(torch.int32), delta[idx].float()


@ALGORITHMS.register("topk")
class TopK(Algorithm):
    name = "topk"
    Args = TopKArgs

    def setup(self) -> None:
        self.names = list(self.global_params)
        self.numel = sum(v.numel() for v in self.global_params.values())
        self.k = max(1, int(round(self.args.fraction * self.numel)))
        self.residual = {cid: torch.zeros(self.numel) for cid in self.client_ids}

    def _flat(self, params: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([params[n].reshape(-1).float() for n in self.names])

    def client_update(self, cid: str, rnd: int, result: LocalResult) -> ClientUpdate:
        delta = self._flat(result.trained) - self._flat(self.global_params)  # (numel,)
        if self.args.error_feedback:
            delta = delta + self.residual[cid]
        idx, vals = top_k_sparsify(delta, self.k)
        if self.args.error_feedback:
            self.residual[cid] = delta.index_fill(0, idx.long(), 0.0)
        buffers = {k: v for k, v in result.buffers.items()}
        dense_state = {**self.global_params, **self.global_buffers}
        return ClientUpdate(cid, result.num_samples, {"indices": idx, "values": vals, **buffers},
                            bytes_up=topk_bytes(self.k) + tensor_bytes(buffers), bytes_down=tensor_bytes(dense_state),
                            train_loss=result.loss, samples_seen=result.samples_seen)

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        total = float(sum(u.num_samples for u in updates))
        step = torch.zeros(self.numel)
        for u in updates:
            step.index_add_(0, u.payload["indices"].long(), u.payload["values"] * (u.num_samples / total))
        flat = self._flat(self.global_params) + step
        out, at = {}, 0
        for n in self.names:
            v = self.global_params[n]
            out[n] = flat[at: at + v.numel()].reshape(v.shape)
            at += v.numel()
        self.global_params = out
        if self.global_buffers:
            avg = average_state([u.payload for u in updates], [u.num_samples for u in updates],
                                list(self.global_buffers))
            self.global_buffers = {k: v.to(self.global_buffers[k].dtype) for k, v in avg.items()}
