"""SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020), Algorithm 1 with option II for the client's control variate:

    client i:  y_i ← x;  K times  y_i ← y_i − η_l (g_i(y_i) − c_i + c)           (the corrected local step)
               c_i⁺ ← c_i − c + (x − y_i) / (K η_l)                               (option II)
               upload (Δy_i, Δc_i) = (y_i − x, c_i⁺ − c_i);  c_i ← c_i⁺
    server:    x ← x + η_g · (1/|S|) Σ_{i∈S} Δy_i
               c ← c + (|S|/N) · (1/|S|) Σ_{i∈S} Δc_i

The corrected gradient g − c_i + c is the gradient of f_i(y) + ⟨y, c − c_i⟩, so the correction is a linear
regularizer of the local task (c and c_i ride in its constants) and both local-training loops run unchanged.
K is the client's number of local optimizer steps (⌈n_i/B⌉ per epoch, the loop's own plan); a client with no step
keeps its c_i. Control variates start at 0; a client's c_i lives in the run's device store (``c_i``) once it has
trained. The averages over S are uniform, as in the paper; batch-norm
buffers are averaged as FedAvg does (they are statistics, not iterates).

Momentum and weight decay: the paper analyses plain SGD. Weight decay is part of g_i here (SCAFFOLD corrects the
decayed objective). With momentum ρ = ``training.momentum`` the correction enters the momentum buffer like the
gradient, and y_i − x is no longer η_l·K times the mean corrected gradient but η_l·‖a‖₁ times a weighted mean,
‖a‖₁ = [K − ρ(1 − ρ^K)/(1 − ρ)]/(1 − ρ) (FedNova's normalizer, :func:`edgemask.trainer.aggregation.momentum_norm`).
Option II then divides by η_l‖a‖₁ instead of η_l K, so c_i⁺ stays an estimate of the local gradient, not one
inflated up to 1/(1 − ρ) times; with ρ = 0 it is exactly the paper's K.

Communication: down x and c, up y_i (sent as the model, like FedAvg) and Δc_i — twice FedAvg's parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgemask.trainer.accounting import state_layout, tensor_bytes
from edgemask.trainer.aggregation import average_buffers, local_steps, momentum_norm, stack_rows
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.records import ClientUpdate, LocalResult, LocalTask
from edgemask.trainer.task_functions import Fn, ModelContext, task_function

C_PREFIX, CI_PREFIX, DC_PREFIX = "scaffold:c:", "scaffold:ci:", "scaffold:dc:"


@dataclass(frozen=True)
class ScaffoldArgs:
    server_lr: float = 1.0  # η_g (the paper's experiments use 1)


def control_variate_term(trainable: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]) -> torch.Tensor:
    """⟨y, c − c_i⟩ summed over the parameters: its gradient c − c_i turns g_i(y) into g_i(y) − c_i + c.
    A function of the task's tensors only (the task function ``scaffold.control_variate``)."""
    total = torch.zeros(())
    for k, y in trainable.items():
        total = total + (y * (constants[C_PREFIX + k] - constants[CI_PREFIX + k])).sum()
    return total


def client_control_update(c_i: torch.Tensor, c: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                          rate: float | torch.Tensor) -> torch.Tensor:
    """Option II: c_i⁺ = c_i − c + (x − y_i)/(K η_l), ``rate`` = K η_l (K = ‖a‖₁ with momentum): a number, or one
    float32 per client broadcast over their stacked rows (the same bits as dividing each client's rows by its own
    number). A client that took no step keeps c_i (its caller's case)."""
    return c_i - c + (x - y) / rate


def server_step(x: dict[str, torch.Tensor], c: dict[str, torch.Tensor], dys: list[dict[str, torch.Tensor]],
                dcs: list[dict[str, torch.Tensor]], num_clients: int, server_lr: float
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """x ← x + η_g mean_S(Δy_i);  c ← c + (|S|/N) mean_S(Δc_i) = c + Σ_S Δc_i / N."""
    s = len(dys)
    new_x = {k: v + server_lr * sum(d[k] for d in dys) / s for k, v in x.items()}
    new_c = {k: v + (s / num_clients) * sum(d[k] for d in dcs) / s for k, v in c.items()}
    return new_x, new_c


@task_function("scaffold.control_variate")
def _control_variate(model: ModelContext):
    return control_variate_term


CONTROL_VARIATE = Fn("scaffold.control_variate")


@ALGORITHMS.register("scaffold")
class Scaffold(Algorithm):
    name = "scaffold"
    Args = ScaffoldArgs

    def client_state_bytes(self) -> int:
        """Its control variate c_i, one per parameter: a record of the device store."""
        return record_bytes(state_layout(self.global_params))

    def setup(self) -> None:
        self.zeros = {k: torch.zeros_like(v) for k, v in self.global_params.items()}
        self.c = dict(self.zeros)  # the server's control variate
        self.c_i = self.store.table("c_i", state_layout(self.global_params))  # the clients' c_i

    def control(self, cid: str) -> dict[str, torch.Tensor]:
        """The client's control variate c_i: 0 (the same zero tensors for all) until it has trained."""
        return self.c_i.get(cid, self.zeros)

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.constants.update({C_PREFIX + k: v for k, v in self.c.items()})
        task.constants.update({CI_PREFIX + k: v for k, v in self.control(cid).items()})
        return task.with_regularizer(CONTROL_VARIATE)  # y ← y − η_l (g − c_i + c)

    def local_steps(self, cid: str) -> float:
        """K of option II (‖a‖₁ under momentum, see the module docstring)."""
        t = self.cfg.training
        return momentum_norm(local_steps(self.dataset.client(cid).num_train, t.batch_size, self.cfg.training.local_epochs),
                             t.momentum)

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Every client's upload at once: option II's c_i⁺ (:func:`client_control_update`) on the clients' stacked
        y_i and c_i, one op per parameter, each client with its own K."""
        if not results:
            return []
        x, lr = self.global_params, self.cfg.training.lr
        steps = [self.local_steps(cid) for cid, _ in results]
        idle = [i for i, k in enumerate(steps) if k <= 0]  # no step: c_i⁺ = c_i
        rate = torch.tensor([k * lr if k > 0 else 1.0 for k in steps])  # K η_l per client
        c_new: dict[str, tuple[torch.Tensor, ...]] = {}
        dc: dict[str, tuple[torch.Tensor, ...]] = {}
        cis = [self.control(cid) for cid, _ in results]  # each read once from the store
        for k, xk in x.items():
            y = stack_rows([res.trained[k] for _, res in results])  # (K, *shape)
            ci = stack_rows([c[k] for c in cis])
            new = client_control_update(ci, self.c[k], xk, y, rate.view(-1, *[1] * xk.dim()))
            if idle:
                new[idle] = ci[idle]
            c_new[k], dc[k] = new.unbind(0), (new - ci).unbind(0)  # Δc_i = c_i⁺ − c_i
        down = tensor_bytes(x) + tensor_bytes(self.c) + tensor_bytes(self.global_buffers)
        out = []
        for i, (cid, res) in enumerate(results):
            self.c_i[cid] = {k: c_new[k][i] for k in x}  # c_i ← c_i⁺ (client-side state)
            payload = {**res.trained, **{DC_PREFIX + k: dc[k][i] for k in x}, **res.buffers}
            out.append(ClientUpdate(cid, res.num_samples, payload,
                                    bytes_up=tensor_bytes(payload),  # y_i, Δc_i and the batch-norm buffers
                                    bytes_down=down, train_loss=res.loss, samples_seen=res.samples_seen))
        return out

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        x = self.global_params
        diff = {k: (stack_rows([u.payload[k] for u in updates]) - v).unbind(0) if updates else () for k, v in x.items()}
        dys = [{k: diff[k][i] for k in x} for i in range(len(updates))]  # Δy_i = y_i − x
        dcs = [{k: u.payload[DC_PREFIX + k] for k in x} for u in updates]
        self.global_params, self.c = server_step(x, self.c, dys, dcs, len(self.client_ids), self.args.server_lr)
        self.global_buffers = average_buffers(self.global_buffers, [u.payload for u in updates],
                                              [u.num_samples for u in updates])
