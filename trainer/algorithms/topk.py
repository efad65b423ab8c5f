"""Top-k sparsified FedAvg (FedMask §4.3 baseline, after Aji & Heafield, "Sparse Communication for Distributed
Gradient Descent", EMNLP 2017): each client uploads only the k = ``fraction`` (10 %) largest-magnitude elements of
its update Δ_k = w_k − w (flattened over all parameters), as float32 values plus int32 indices (8 bytes each).
The server averages the sparse updates weighted by sample counts, zeros counting where a client sent nothing:
w ← w + Σ_k n_k·sparse(Δ_k) / Σ_k n_k.

Error feedback: Aji & Heafield keep the dropped part as a local residual that is added to the next update
before selection ("gradient dropping" with residual accumulation); the FedMask paper does not say otherwise, so
``error_feedback = true`` by default (Δ_k ← Δ_k + r_k; r_k ← Δ_k − sparse(Δ_k)). The residual never travels; it
lives in the run's device store (``residual``, a flat float32 vector a device), 0 until the device has trained.
Downlink: the dense float32 global model (a client sampled after missing rounds needs all of it). Batch-norm
statistics are averaged densely and costed as float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemask.trainer.accounting import tensor_bytes, topk_bytes
from edgemask.trainer.aggregation import average_buffers, stack_rows
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.records import ClientUpdate, LocalResult


@dataclass(frozen=True)
class TopKArgs:
    fraction: float = 0.1  # k as a fraction of the update's elements (paper: 10 %)
    error_feedback: bool = True


def top_k_sparsify(delta: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 indices, float32 values) of the k largest |delta| entries of a flat vector, or of each row of a
    ``(K, n)`` stack of them; the entries come as a set, in no particular order."""
    idx = torch.topk(delta.abs(), k, dim=-1, sorted=False).indices  # PyTorch selects the same k sorted or not
    return idx.to(torch.int32), delta.gather(-1, idx).float()


@ALGORITHMS.register("topk")
class TopK(Algorithm):
    name = "topk"
    Args = TopKArgs

    def client_state_bytes(self) -> int:
        """Its error-feedback residual, one float32 per parameter: a record of the device store."""
        return record_bytes(self._layout()) if self.args.error_feedback else 0

    def _layout(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        return {"residual": ((sum(v.numel() for v in self.global_params.values()),), torch.float32)}

    def setup(self) -> None:
        self.names = list(self.global_params)
        self.numel = sum(v.numel() for v in self.global_params.values())
        self.k = max(1, int(round(self.args.fraction * self.numel)))
        self.residual = self.store.table("residual", self._layout())  # r_k, {"residual": (numel,)} a device

    def residual_of(self, cid: str) -> torch.Tensor:
        """r_k ``(numel,)``: 0 until the device has trained."""
        rec = self.residual.get(cid)
        return torch.zeros(self.numel) if rec is None else rec["residual"]

    def _flat(self, params: dict[str, torch.Tensor], rows: int | None = None) -> torch.Tensor:
        """All parameters as one float32 vector ``(numel,)``, or ``rows`` clients' stacked ``(rows, numel)``."""
        shape = (-1,) if rows is None else (rows, -1)
        return torch.cat([params[n].reshape(shape).float() for n in self.names], dim=-1)

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Every client's upload at once: the clients' updates Δ_k stacked as rows ``(K, numel)`` (read in place
        from the batched loop's results), one top-k per row (each row's own k largest |Δ|, as it would be
        alone), and the residuals r_k ← Δ_k − sparse(Δ_k) in one scatter."""
        if not results:
            return []
        trained = self._flat({n: stack_rows([res.trained[n] for _, res in results]) for n in self.names},
                             len(results))
        delta = trained - self._flat(self.global_params)  # (K, numel)
        if self.args.error_feedback:
            delta = delta + stack_rows([self.residual_of(cid) for cid, _ in results])
        idx, vals = top_k_sparsify(delta, self.k)  # (K, k) each
        if self.args.error_feedback:
            for (cid, _), r in zip(results, delta.scatter(1, idx.long(), 0.0).unbind(0)):
                self.residual[cid] = {"residual": r}
        down = self.dense_bytes
        return [ClientUpdate(cid, res.num_samples, {"indices": i, "values": v, **res.buffers},
                             bytes_up=topk_bytes(self.k) + tensor_bytes(res.buffers), bytes_down=down,
                             train_loss=res.loss, samples_seen=res.samples_seen)
                for (cid, res), i, v in zip(results, idx.unbind(0), vals.unbind(0))]

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        total = float(sum(u.num_samples for u in updates))
        step = torch.zeros(self.numel)
        if updates:  # Σ_k n_k·sparse(Δ_k) / Σ_k n_k: one index_add over the clients' entries, client by client
            w = torch.tensor([u.num_samples / total for u in updates])
            vals = stack_rows([u.payload["values"] for u in updates]) * w[:, None]  # (K, k)
            step.index_add_(0, stack_rows([u.payload["indices"] for u in updates]).long().flatten(), vals.flatten())
        flat = self._flat(self.global_params) + step
        out, at = {}, 0
        for n in self.names:
            v = self.global_params[n]
            out[n] = flat[at: at + v.numel()].reshape(v.shape)
            at += v.numel()
        self.global_params = out
        self.global_buffers = average_buffers(self.global_buffers, [u.payload for u in updates],
                                              [u.num_samples for u in updates])  # densely, by sample count
