"""FedNova (Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in Heterogeneous Federated
Optimization", NeurIPS 2020): normalized averaging. Clients that take more local steps move further, and FedAvg's
plain average of their models drifts toward their objectives; FedNova averages each client's update *per unit of
local work* and rescales by the round's effective number of steps. In the paper's general update rule
x^{t+1} − x^t = −τ_eff Σ_i w_i η d_i with d_i = G_i a_i / ‖a_i‖₁, FedNova takes w_i = p_i and τ_eff = Σ_i p_i ‖a_i‖₁:

    d_i = (x − y_i) / ‖a_i‖₁                 the normalized update (x: global model, y_i: client i's trained model)
    x ← x − τ_eff Σ_i p_i d_i,   τ_eff = Σ_i p_i ‖a_i‖₁,   p_i = n_i / Σ_j n_j over the round's clients

``a_i`` holds the weights with which client i's τ_i local gradients enter y_i − x (= η Σ_k a_{i,k} g_k). Plain
SGD: a_i = [1, …, 1], ‖a_i‖₁ = τ_i. Local SGD with momentum ρ (the paper's momentum variant; PyTorch's
buf ← ρ·buf + g, y ← y − η·buf): the k-th of τ gradients enters with (1 − ρ^{τ−k+1}) / (1 − ρ), so

    ‖a_i‖₁ = [τ_i − ρ(1 − ρ^{τ_i}) / (1 − ρ)] / (1 − ρ).

τ_i is the client's number of local optimizer steps (⌈n_i/B⌉ per epoch, the loop's own plan, partial last
minibatch included; the paper writes ⌊E n_i/B⌋ for loops that drop it). p_i is normalized over the round's sampled
clients. With every τ_i equal, τ_eff = ‖a‖₁ and the update is FedAvg's Σ p_i y_i. Weight decay is part of the local
gradient. Batch-norm buffers are averaged as FedAvg does. The client sends y_i and the scalar ‖a_i‖₁ (4 bytes more
than FedAvg); the server's rate is 1 (no server momentum).
"""

from __future__ import annotations

import torch

from edgemask.trainer.accounting import fedavg_upload, tensor_bytes
from edgemask.trainer.aggregation import average_buffers, local_steps, momentum_norm, stack_rows
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.records import ClientUpdate, LocalResult

NORM_KEY = "fednova:a_norm"  # the upload's ‖a_i‖₁ (a float32 scalar)


def normalized_average(x: dict[str, torch.Tensor], ys: list[dict[str, torch.Tensor]], norms: list[float],
                       num_samples: list[int]) -> dict[str, torch.Tensor]:
    """FedNova's server step: x − τ_eff Σ p_i (x − y_i)/‖a_i‖₁ with p_i = n_i/Σn and τ_eff = Σ p_i ‖a_i‖₁. A client
    that took no step (‖a_i‖₁ = 0) has d_i = 0."""
    if not ys:  # no client: nothing moves
        return dict(x)
    total = float(sum(num_samples))
    p = [n / total for n in num_samples]
    tau_eff = sum(pi * a for pi, a in zip(p, norms))
    c = torch.tensor([pi / a if a > 0 else 0.0 for pi, a in zip(p, norms)])  # (K,) p_i / ‖a_i‖₁
    out = {}
    for k, xk in x.items():  # Σ p_i d_i = Σ c_i (x − y_i): the clients' tensors stacked, one contraction
        d = torch.tensordot(c.to(xk.device, xk.dtype), xk - stack_rows([y[k] for y in ys]), dims=1)
        out[k] = xk - tau_eff * d
    return out


@ALGORITHMS.register("fednova")
class FedNova(Algorithm):
    name = "fednova"

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """y_i and the batch-norm buffers, as FedAvg, and the client's ‖a_i‖₁."""
        t = self.cfg.training
        out = []
        for cid, result in results:
            upd = fedavg_upload(cid, result, self.dense_bytes)
            tau = local_steps(self.dataset.client(cid).num_train, t.batch_size, self.cfg.training.local_epochs)
            norm = torch.tensor(momentum_norm(tau, t.momentum), dtype=torch.float32)
            upd.payload[NORM_KEY] = norm
            upd.bytes_up += tensor_bytes([norm])
            out.append(upd)
        return out

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        norms = [float(u.payload[NORM_KEY]) for u in updates]
        self.global_params = normalized_average(self.global_params, [u.payload for u in updates], norms,
                                                [u.num_samples for u in updates])
        self.global_buffers = average_buffers(self.global_buffers, [u.payload for u in updates],
                                              [u.num_samples for u in updates])
