"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020), Eq. 2: each client
minimizes h_k(w; w_g) = F_k(w) + μ/2 ‖w − w_g‖², so its gradient gains μ(w − w_g). FedAvg plus one regularizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer.algorithms.base import ALGORITHMS, Algorithm
from trainer.records import LocalTask


@dataclass(frozen=True)
class FedProxArgs:
    mu: float = 0.01  # μ (FedPeWS Table 6 tuned 0.01 from {0.001, 0.01, 0.1, 0.5})


def proximal_term(mu: float, prefix: str = "g:"):
    """μ/2 Σ ‖w − w_g‖² over every trainable ``w`` whose anchor ``constants[prefix + name]`` exists."""
    def reg(trainable: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]) -> torch.Tensor:
        total = torch.zeros(())
        for k, w in trainable.items():
            anchor = constants.get(prefix + k)
            if anchor is not None:
                total = total + (w - anchor).pow(2).sum()
        return 0.5 * mu * total
    return reg


def with_proximal(task: LocalTask, anchor: dict[str, torch.Tensor], mu: float) -> LocalTask:
    """``task`` with FedProx's term toward ``anchor`` added to its regularizer (anchors go in its constants)."""
    task.constants.update({f"g:{k}": v.detach().clone() for k, v in anchor.items() if k in task.trainable})
    prox, base = proximal_term(mu), task.regularizer
    task.regularizer = prox if base is None else (lambda tr, c: base(tr, c) + prox(tr, c))
    return task


@ALGORITHMS.register("fedprox")
class FedProx(Algorithm):
    name = "fedprox"
    Args = FedProxArgs

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        return with_proximal(super().local_task(cid, rnd), self.global_params, self.args.mu)
