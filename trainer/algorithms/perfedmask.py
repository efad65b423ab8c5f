"""PerFedMask (Setayesh, Li and Wong, "PerFedMask: Personalized Federated Learning with Optimized Masking
Vectors", ICLR 2023; the poster's equations).

* The model is a global body w_g and a device head φ_n (the model's ``head``). As in FedBABU, which PerFedMask
  builds on, the head stays at its random initialization during training and only the body is trained.
* Device n can train at most ψ_n parameters; a fraction ν of the devices can train the whole body
  (ψ_n = d_w), the others ``budget``·d_w (or per-device fractions ``budgets``).
* Before training the server picks layer-wise masking vectors m̃_n ∈ {0,1}^|Λ| by P^mask:
      min Σ_n ( d_w max_j (k̃_n)_j − Σ_j |π_j| (k̃_n)_j + ε_n )
  — the bias term of the poster's convergence bound, Σ_n (d_w γ_n − Σ_l (k_n)_l), written per layer: the
  poster's printed P^mask has Σ_j (m̃_n)_j, which counts layers whatever their size; we follow the bound
  (see :func:`pmask_objective`)
      s.t. (k̃_n)_j = (m̃_n)_j / Σ_n' (m̃_n')_j,  Σ_j |π_j| (m̃_n)_j = ψ_n − ε_n,  m̃ binary, ε_n ≥ 0,
  solved exactly as a mixed-integer linear program (:func:`solve_pmask`, HiGHS through ``scipy.optimize.milp``).
* Local update: w_n = w_g − η m_n ⊙ Σ ∇f_n — masked parameters are frozen (``grad_keep``), not removed.
* Aggregation: w_g ← Σ_n k_n ⊙ w_n with (k_n)_l = (m_n)_l / Σ_n' (m_n')_l over the round's devices
  (:func:`edgemask.trainer.aggregation.mask_weighted_average`); an element no device trained keeps its value.
* After training every device fine-tunes its head φ_n on its data (``finetune_task``); accuracy is reported
  before and after, with each device's trainable parameters and forward/backward FLOPs (the poster's tables).
  The fine-tuned heads live in the run's device store (``heads``); a device's masks are rebuilt from its P^mask
  row when used (:meth:`PerFedMask.keep`), never kept for every device.

Linearization (ours): with z_jc = 1 ⇔ layer j is trained by exactly c devices (c = 0..N, one-hot),
Σ_n m_nj = Σ_c c z_jc and (k̃_n)_j = m_nj Σ_c z_jc / c, so Σ_n (k̃_n)_j = 1 − z_j0 and the weighted sum is
Σ_j |π_j| (1 − z_j0), linear in z. The max becomes one auxiliary γ_n per device with
γ_n ≥ Σ_{c≥1} z_jc / c + m_nj − 1 for every j (tight when m_nj = 1, vacuous when 0); ε_n is the budget slack.
Layers Λ: every module that owns body parameters (a conv, a linear, a batch norm). Backward FLOPs per sample:
a masked layer costs its weight gradient (= its forward) when trained, and its input gradient (= its forward)
when a trained layer lies before it in definition order (the gradient must flow through it).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from edgemask.errors import ConfigError
from edgemask.schema import setting
from edgemask.trainer.accounting import fedavg_upload, forward_flops, layer_positions, state_layout, tensor_bytes
from edgemask.trainer.aggregation import average_buffers, mask_weighted_average
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.models.registry import head_names
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask
from edgemask.trainer.task_functions import Fn

FROZEN = "frozen:"  # the fine-tuning task's constants: the body, by parameter name


@dataclass(frozen=True)
class PerFedMaskArgs:
    nu: float = 0.5  # ν: fraction of devices that can train the whole body
    budget: float = 0.5  # ψ_n / d_w for the other devices
    budgets: list[float] | None = None  # per-device ψ_n / d_w, in client order (overrides nu and budget)
    finetune_epochs: int = 5  # head fine-tuning after training
    finetune_lr: float = -1.0  # -1: training.lr
    milp_time_limit: float = 60.0  # seconds for P^mask's MILP; past it, HiGHS's best choice so far (warned)
    # P^mask's second term. "bound": Σ_j |π_j| k̃_nj, the convergence bound's Σ_l (k_n)_l written per layer (each
    # layer weighs by its parameter count). "printed": Σ_j k̃_nj, as the poster prints P^mask (every layer weighs
    # 1). docs/fedmask.md measures the choice.
    objective: str = setting("bound", choices=("bound", "printed"), what="value")
    # Where ``budgets`` came from, when they were set from measurements (`edgemask budgets`, issue #39): the
    # results, deadline, device mix, cost model per board and per device its board and predicted local round. Plain
    # data, recorded in summary.json beside each device's budget; None: the budgets are the config's own numbers.
    budget_source: dict[str, Any] | None = None


def layer_groups(names: list[str]) -> dict[str, list[str]]:
    """Λ: parameters grouped by the module that owns them ("layer1.0.conv1.weight" -> "layer1.0.conv1")."""
    out: dict[str, list[str]] = {}
    for n in names:
        out.setdefault(n.rsplit(".", 1)[0] if "." in n else n, []).append(n)
    return out


def pmask_objective(m: np.ndarray, sizes: np.ndarray, psi: np.ndarray, weights: np.ndarray | None = None) -> float:
    """P^mask's objective Σ_n (d_w max_j k̃_nj − Σ_j |π_j| k̃_nj + ε_n) for a binary (N, J) choice ``m`` with
    Σ_j |π_j| m_nj ≤ ψ_n (ε_n the slack); ``sizes`` (J,) = |π_j|, ``psi`` (N,) = ψ_n.

    The poster's bound (Theorem) has the bias term Σ_n (d_w γ_n − Σ_{l=1}^{d_w} (k_n)_l), a sum over the d_w
    parameters; with layer-wise masks every parameter l of layer j has (k_n)_l = k̃_nj, so the sum is
    Σ_j |π_j| k̃_nj: a layer weighs by its parameter count (the poster's P^mask prints Σ_j m̃_nj, which would
    reward covering a bias vector as much as a conv kernel). ``weights`` (J,) replaces |π_j| in that term only
    (ones: the printed P^mask)."""
    d_w = float(sizes.sum())
    count = m.sum(0)  # (J,) devices per layer
    k = np.where(count > 0, m / np.maximum(count, 1), 0.0)  # (N, J)
    eps = psi - m @ sizes
    return float(np.sum(d_w * k.max(1) - k @ (sizes if weights is None else weights) + eps))


@dataclass(frozen=True)
class PmaskSolution:
    """What :func:`solve_pmask` found, and how sure it is."""

    masks: np.ndarray  # (N, J) binary masking vectors m̃
    objective: float  # P^mask's objective at ``masks`` (pmask_objective)
    status: str  # "optimal" | "time_limit" (then ``masks`` are feasible, not proven optimal)
    bound: float  # HiGHS's lower bound on the optimum, in the objective's units
    seconds: float

    @property
    def gap(self) -> float:
        """Relative gap (objective − bound) / |objective|: 0 when optimal; at most this far above the optimum."""
        return max(0.0, self.objective - self.bound) / max(abs(self.objective), 1e-12)

    def summary(self) -> dict:
        """``summary.json``'s ``pmask`` entry (no seconds: a clock, and the summary's digest is held bit for bit)."""
        out = {"status": self.status, "objective": float(self.objective), "bound": float(self.bound),
               "gap": float(self.gap)}
        if self.status != "optimal":
            out["note"] = (f"the masking vectors are a feasible, not an optimal, solution of P^mask: the MILP stopped "
                           f"at its time limit with a relative gap of {self.gap:.1%} "
                           f"(raise algorithm.args.milp_time_limit)")
        return out


def solve_pmask(sizes: list[int], psi: list[float], time_limit: float = 60.0, printed: bool = False
                ) -> PmaskSolution:
    """Solve P^mask (see the module docstring). ``sizes[j]`` = |π_j|, ``psi[n]`` = ψ_n.
    Returns the (N, J) binary masking vectors and their objective value: the optimum, or where the MILP runs
    past ``time_limit`` seconds the best feasible choice HiGHS has found (``status = "time_limit"``), with a
    RuntimeWarning giving its relative gap (the exact solve grows fast with N·J). ``printed``: the poster's printed
    second term, Σ_j k̃_nj (every layer weighs 1), instead of the bound's Σ_j |π_j| k̃_nj.

    One family of rows beyond the problem's own cuts the LP relaxation without changing the optimum (the
    enumeration tests check it on small cases): Σ_n γ_n ≥ 1 − z_j0 for every layer j — a layer trained by c ≥ 1
    devices gives each of them γ_n ≥ 1/c, so those c devices' γ alone sum to ≥ 1. (Ordering the rows of devices
    with equal budgets, which is valid too, found worse choices within the time limit: not used.)"""
    import time

    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import lil_matrix

    s = np.asarray(sizes, dtype=float)
    p = np.asarray(psi, dtype=float)
    N, J, C = len(p), len(s), len(p) + 1
    d_w = s.sum()
    nm, nz = N * J, J * C  # variables: m (N·J), z (J·C), γ (N), ε (N)
    im = lambda n, j: n * J + j  # noqa: E731
    iz = lambda j, c: nm + j * C + c  # noqa: E731
    ig = lambda n: nm + nz + n  # noqa: E731
    ie = lambda n: nm + nz + N + n  # noqa: E731
    nv = nm + nz + 2 * N
    cost = np.zeros(nv)
    for n in range(N):
        cost[ig(n)] = d_w
        cost[ie(n)] = 1.0
    w = np.ones(J) if printed else s  # the second term's layer weights
    for j in range(J):  # −Σ_n Σ_j |π_j| k̃_nj = −Σ_j |π_j| (1 − z_j0) = |π_j| z_j0 − d_w (the constant dropped)
        cost[iz(j, 0)] = w[j]
    rows = N + 2 * J + N * J + J
    A = lil_matrix((rows, nv))
    lo, hi = np.zeros(rows), np.zeros(rows)
    r = 0
    for n in range(N):  # Σ_j |π_j| m_nj + ε_n = ψ_n   (scaled by 1/d_w)
        for j in range(J):
            A[r, im(n, j)] = s[j] / d_w
        A[r, ie(n)] = 1.0 / d_w
        lo[r] = hi[r] = p[n] / d_w
        r += 1
    for j in range(J):  # Σ_n m_nj − Σ_c c z_jc = 0
        for n in range(N):
            A[r, im(n, j)] = 1.0
        for c in range(1, C):
            A[r, iz(j, c)] = -float(c)
        r += 1
    for j in range(J):  # Σ_c z_jc = 1
        for c in range(C):
            A[r, iz(j, c)] = 1.0
        lo[r] = hi[r] = 1.0
        r += 1
    for n in range(N):  # γ_n − Σ_{c≥1} z_jc / c − m_nj ≥ −1
        for j in range(J):
            A[r, ig(n)] = 1.0
            for c in range(1, C):
                A[r, iz(j, c)] = -1.0 / c
            A[r, im(n, j)] = -1.0
            lo[r], hi[r] = -1.0, np.inf
            r += 1
    for j in range(J):  # Σ_n γ_n + z_j0 ≥ 1 (valid: see the docstring)
        for n in range(N):
            A[r, ig(n)] = 1.0
        A[r, iz(j, 0)] = 1.0
        lo[r], hi[r] = 1.0, np.inf
        r += 1
    integrality = np.zeros(nv)
    integrality[: nm + nz] = 1
    ub = np.full(nv, np.inf)
    ub[: nm + nz] = 1.0
    start = time.perf_counter()
    res = milp(cost / d_w, constraints=LinearConstraint(A.tocsr(), lo, hi), integrality=integrality,
               bounds=Bounds(np.zeros(nv), ub), options={"time_limit": time_limit})
    seconds = time.perf_counter() - start
    if res.x is None and res.status == 1:  # the limit came before any feasible choice
        raise ConfigError(f"perfedmask: P^mask's MILP found no feasible masking vectors within its time limit "
                          f"({time_limit:g} s); raise algorithm.args.milp_time_limit")
    if res.x is None or not (res.success or res.status == 1):  # 1: a limit reached, res.x the incumbent
        raise ConfigError(f"perfedmask: P^mask has no solution ({res.message}); check the budgets ψ_n ≥ 0")
    m = np.round(res.x[:nm]).reshape(N, J).astype(np.int64)
    objective = pmask_objective(m, s, p, w if printed else None)
    if res.success:
        sol = PmaskSolution(m, objective, "optimal", objective, seconds)
    else:  # the MILP's cost is the objective / d_w without its constant −Σ_j w_j
        dual = getattr(res, "mip_dual_bound", None)
        bound = d_w * dual - float(w.sum()) if dual is not None and np.isfinite(dual) else -np.inf
        sol = PmaskSolution(m, objective, "time_limit", min(bound, objective), seconds)
        warnings.warn(f"perfedmask: P^mask's MILP stopped at its time limit ({time_limit:g} s) with a relative "
                      f"gap of {sol.gap:.1%} to the optimum; using the best masking vectors found, feasible but "
                      f"not proven optimal. Raise algorithm.args.milp_time_limit for a closer choice",
                      RuntimeWarning, stacklevel=2)
    return sol


@ALGORITHMS.register("perfedmask")
class PerFedMask(Algorithm):
    name = "perfedmask"
    Args = PerFedMaskArgs

    def client_state_bytes(self) -> int:
        """Its fine-tuned head, a record of the device store (the P^mask tensors are shared: :meth:`keep`)."""
        return record_bytes(self._head_layout())

    def _head_layout(self) -> dict:
        return state_layout(self.global_params, sorted(head_names(self.model)))

    def setup(self) -> None:
        self.head = set(head_names(self.model))
        body = [k for k in self.global_params if k not in self.head]
        if not self.head or not body:
            raise ConfigError(f"perfedmask: model {self.cfg.model.name!r} needs a head (its ``head`` attribute) "
                              f"and a body")
        self.layers = layer_groups(body)  # Λ
        sizes = [sum(self.global_params[k].numel() for k in ps) for ps in self.layers.values()]
        d_w = sum(sizes)
        N = len(self.client_ids)
        if self.args.budgets is not None:
            if len(self.args.budgets) != N:
                raise ConfigError(f"perfedmask: algorithm.args.budgets has {len(self.args.budgets)} entries for "
                                  f"{N} clients")
            frac = [float(b) for b in self.args.budgets]
        else:
            rng = np.random.default_rng([self.cfg.run.seed, 0x9F])
            full = set(rng.permutation(N)[: int(round(self.args.nu * N))].tolist())
            frac = [1.0 if i in full else self.args.budget for i in range(N)]
        self.psi = [f * d_w for f in frac]
        self.pmask = solve_pmask(sizes, self.psi, self.args.milp_time_limit,
                                 printed=self.args.objective == "printed")
        m = self.pmask.masks
        names = list(self.layers)
        self.layer_masks = {cid: {names[j]: int(m[i, j]) for j in range(len(names))}
                            for i, cid in enumerate(self.client_ids)}
        self._zeros = {k: torch.zeros_like(v) for k, v in self.global_params.items()}
        self._ones = {k: torch.ones_like(v) for k, v in self.global_params.items()}
        if "heads" not in self.store.tables:  # set up once more by device_task: the same table
            self.store.table("heads", self._head_layout())
        self.heads = self.store.tables["heads"]  # φ_n after fine-tuning
        example = self.dataset.clients[0].train_x[:1]
        positions = layer_positions(self.model, self.sites, example)
        self.fwd = forward_flops(self.model, self.sites, {}, positions)
        per_site = {s.name: forward_flops(self.model, (s,), {}, positions) for s in self.sites}
        self.bwd = {cid: self._backward(cid, per_site) for cid in self.client_ids}

    def keep(self, cid: str) -> dict[str, torch.Tensor]:
        """The device's P^mask row as a 0 / 1 tensor per parameter (1: trained). A layer is trained whole or not
        at all, so every device's masks are the same two tensors per parameter, all-zeros and all-ones, shared
        (stacked as views): the per-device state is ``layer_masks``, one bit a layer."""
        out = dict(self._zeros)  # the head: frozen (FedBABU)
        for layer, on in self.layer_masks[cid].items():
            if on:
                for k in self.layers[layer]:
                    out[k] = self._ones[k]
        return out

    def _backward(self, cid: str, per_site: dict[str, int]) -> int:
        total, below = 0, False
        for s in self.sites:
            trained = bool(self.layer_masks[cid].get(s.name, 0))
            total += per_site[s.name] * (int(trained) + int(below))
            below = below or trained
        return total

    # -- training -------------------------------------------------------------------------------------
    def device_task(self, cid: str | None, state: ClientState) -> LocalTask:
        """The device's step: the body layers P^mask gives it trained (solved again from the run's config: the
        same budgets, the same choice where the MILP was proven optimal, ``summary.json``'s ``pmask.status``), the
        rest frozen; the dense baseline (``cid`` None) trains the whole body. The head stays frozen (FedBABU)."""
        self.setup()
        if cid is None:
            task = super().local_task("dense", 0)
            task.grad_keep = {k: self._zeros[k] if k in self.head else self._ones[k] for k in self.global_params}
            return task
        return self.local_task(cid, 0)

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)
        task.grad_keep = self.keep(cid)
        return task

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """FedAvg's uploads, costed without the frozen layers (they are not sent)."""
        out = []
        for cid, result in results:
            upd = fedavg_upload(cid, result, self.dense_bytes)
            keep = self.keep(cid)
            upd.bytes_up = tensor_bytes({k: v for k, v in result.trained.items() if keep[k].any()})
            out.append(upd)
        return out

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        keeps = [self.keep(u.client_id) for u in updates]
        for k, g in self.global_params.items():
            self.global_params[k] = mask_weighted_average(g, [u.payload[k] for u in updates], [m[k] for m in keeps])
        self.global_buffers = average_buffers(self.global_buffers, [u.payload for u in updates],
                                              [u.num_samples for u in updates])

    def backward_flops(self, cid: str, fwd: int) -> int:
        return self.bwd[cid]

    # -- fine-tuning and evaluation -------------------------------------------------------------------
    def finetune_task(self, cid: str) -> LocalTask | None:
        if self.args.finetune_epochs <= 0:
            return None
        heads = sorted(self.head)
        body = {k: v for k, v in self.global_params.items() if k not in self.head}
        lr = self.args.finetune_lr if self.args.finetune_lr > 0 else self.cfg.training.lr
        return LocalTask(trainable={k: self.global_params[k].clone() for k in heads}, model=self.model_spec,
                         forward=Fn.of("model.frozen", prefix=FROZEN),  # the head over the final body, frozen
                         constants={FROZEN + k: v for k, v in body.items()},
                         buffers={k: v.clone() for k, v in self.global_buffers.items()},
                         epochs=self.args.finetune_epochs, lr=lr)

    def finetune_result(self, cid: str, result: LocalResult) -> None:
        self.heads[cid] = dict(result.trained)

    def personal_params(self, cid: str) -> dict[str, torch.Tensor]:
        return {**self.global_params, **self.heads.get(cid, {})}

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [EvalModel(self.personal_params(cid), self.global_buffers, self.model_context.call) for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        return ClientState(params=dict(self.heads.get(cid, {})))

    def trained_fraction(self, cid: str) -> float:
        """The body's share device ``cid`` trains (the layers P^mask gave it, ≤ ψ_n / d_w): the f of a board's
        measured step line (``edgemask budgets``, :mod:`edgemask.trainer.system`)."""
        keep = {k: m for k, m in self.keep(cid).items() if k not in self.head}
        return sum(int(m.sum()) for m in keep.values()) / max(sum(int(m.numel()) for m in keep.values()), 1)

    def summary_extra(self) -> dict:
        return {"pmask_objective": self.pmask.objective, "pmask": self.pmask.summary(),
                "flops_fwd_per_sample": self.fwd,
                "devices": {cid: {"budget": self.psi[i], "trainable_params": sum(int(m.sum()) for m in self.keep(cid).values()),
                                  "layers_trained": sum(self.layer_masks[cid].values()),
                                  "flops_fwd_per_sample": self.fwd, "flops_bwd_per_sample": self.bwd[cid],
                                  **self._budget_source(cid)}
                            for i, cid in enumerate(self.client_ids)},
                **({"budget_source": {k: v for k, v in self.args.budget_source.items() if k != "devices"}}
                   if self.args.budget_source else {})}

    def _budget_source(self, cid: str) -> dict:
        """Where device ``cid``'s budget came from (``budget_source``'s entry for it), or nothing."""
        src = (self.args.budget_source or {}).get("devices", {}).get(cid)
        return {"budget_from": src} if src else {}
