"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020), Eq. 2: each client
minimizes h_k(w; w_g) = F_k(w) + μ/2 ‖w − w_g‖², so its gradient gains μ(w − w_g). FedAvg plus one regularizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgemask.schema import setting
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.losses import with_proximal
from edgemask.trainer.records import LocalTask


@dataclass(frozen=True)
class FedProxArgs:
    mu: float = setting(0.01, minimum=0)  # μ ≥ 0 (Eq. 2; FedPeWS Table 6 tuned 0.01 from {0.001, 0.01, 0.1, 0.5})


@ALGORITHMS.register("fedprox")
class FedProx(Algorithm):
    name = "fedprox"
    Args = FedProxArgs

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        return with_proximal(super().local_task(cid, rnd), self.global_params, self.args.mu)
