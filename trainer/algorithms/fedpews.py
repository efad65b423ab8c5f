"""FedPeWS and FedPeWS-Fixed (Tastan et al., "FedPeWS: Personalized Warmup via Subnetworks for Enhanced
Heterogeneous Federated Learning"), Algorithm 1.

* Neuron-level mask scores s_i ∈ R^h on the hidden layers only (every masked layer but the head): θ_i = σ(s_i),
  binary neuron masks m̃_i ~ Bernoulli(θ_i) with a straight-through estimator (§4: the gradient passes the
  sampling as if it were the identity), expanded to parameters by 𝒢: a weight is selected when the neurons at
  both of its ends are (inputs and classes always are), a bias when its neuron is. In the forward a neuron's
  mask scales its outgoing weights (:meth:`FedPeWS.masked_params`), so the STE's ∂L/∂m̃ is the loss's
  sensitivity to the neuron for dropped neurons too, not only for the kept ones.
* Each local step k on a minibatch ξ (Alg. 1 lines 11-17):
  Procedure I — weights frozen, s ← s − η_s ∇_s [f_i(x ⊙ 𝒢(s), ξ) − λ ‖σ(s) − θ_{g∖i}‖²] (Eq. 6: the mask
  diversity term is *maximized*, pushing a participant's mask away from the others');
  Procedure II — the new s frozen, x ← x − η_ℓ ∇_x f_i(x ⊙ 𝒢(s), ξ) (Eq. 8), with a fresh sample of 𝒢(s).
* Warmup: rounds t ≤ W = round(τ·T); afterwards m_i = 1 and the base optimizer (FedAvg, or FedProx with μ) runs
  on the full model.
* Server (Alg. 1 line 21): x_g ← x_g − η_g (x_g − Σ_i x_i ⊙ m_i / Σ_i m_i); an element no participant selected
  keeps x_g. The server keeps each participant's latest θ_i; θ_g is their mean and θ_{g∖i} the mean over j ≠ i.
* FedPeWS-Fixed (§4 "Use of fixed subnetworks", App. B.2): no mask learning; the server splits the hidden
  neurons of every layer into N contiguous, disjoint groups covering all of them; participant i keeps group i
  during warmup.

Per device, in the run's device store: its scores s_i (``scores``) and the neuron masks of its last round
(``neuron_masks``, bits; FedPeWS-Fixed's group is computed when used). The server's θ_i of every participant is one
(N, units) matrix per layer in RAM: θ_g and every θ_{g∖i} are means over all of it each round.

Choices the paper leaves open, stated here: s_g^0 = ``init_score`` everywhere (θ = σ(init_score)); θ_g^0 = σ(s_g^0);
the sum over participants is unweighted, as written. In one local step the mask update is taken by the loop's
optimizer through a zero-valued surrogate (s − s̄)·∇_s L_s at rate η_s (``LocalTask.lrs``), so Procedures I and II
both use the same minibatch and x's gradient is taken at the updated s, as in Alg. 1. Only sequential models
(MLP, FedPeWS CNN: each masked layer feeds the next, through pooling or a flatten) are supported.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from edgemask.errors import ConfigError
from edgemask.schema import same_setting, setting
from edgemask.trainer.accounting import mask_bytes, tensor_bytes
from edgemask.trainer.aggregation import average_buffers
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.algorithms.fedprox import FedProxArgs
from edgemask.trainer.device_store import record_bytes
from edgemask.trainer.losses import cross_entropy, with_proximal
from edgemask.trainer.models.masking import MaskSite
from edgemask.trainer.models.registry import head_names
from edgemask.trainer.records import ClientUpdate, LocalResult, LocalTask
from edgemask.trainer.task_functions import Fn, ModelContext, task_function

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class FedPeWSArgs:
    tau: float = 0.125  # τ = W/T, the warmup fraction (Table 2, Synthetic-32K: 0.125)
    warmup_rounds: int = -1  # W; -1: round(τ·T)
    lambda_div: float = 5.0  # λ, the mask diversity weight (Table 2, Synthetic-32K: 5.0)
    mask_lr: float = 0.1  # η_s (§5.2)
    server_lr: float = 1.0  # η_g (Table 2, Synthetic-32K: 1.0)
    init_score: float = 0.0  # s_g^0
    # the optimizer after (and under) the warmup: fedavg | fedprox
    base: str = setting("fedavg", choices=("fedavg", "fedprox"), what="value")
    mu: float = same_setting(FedProxArgs, "mu")  # FedProx's μ when base = "fedprox" (App. C.1: 0.01)


def bernoulli_ste(theta: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """A binary sample m ~ Bernoulli(θ) whose gradient passes to θ unchanged (straight-through: ∂m/∂θ = 1).
    With ``u`` (uniform [0, 1) of θ's shape) the sample is 1[u < θ], a Bernoulli(θ) draw from the caller's stream."""
    sample = torch.bernoulli(theta.detach()) if u is None else (u < theta.detach()).to(theta.dtype)
    return sample + (theta - theta.detach())  # (θ − θ̄) is exactly 0: the value stays binary in float32


def server_update(x_g: torch.Tensor, xs: list[torch.Tensor], masks: list[torch.Tensor | None],
                  server_lr: float) -> torch.Tensor:
    """Alg. 1 line 21: x_g − η_g (x_g − Σ x_i ⊙ m_i / Σ m_i), with x_g kept where Σ m_i = 0. A mask ``None`` is
    all ones (a client that trained the whole model), without a product by it: the same sums, exactly."""
    ones = torch.ones_like(x_g, dtype=torch.float32)
    num = sum(x.float() if m is None else x.float() * m for x, m in zip(xs, masks))  # x · 1 = x, exactly
    den = sum(ones if m is None else m.float() for m in masks)
    avg = torch.where(den > 0, num / den.clamp(min=1e-12), x_g)
    return x_g - server_lr * (x_g - avg)


def masked_params(sites: tuple[MaskSite, ...], params: Tensors, neuron: Tensors) -> Tensors:
    """The forward of x ⊙ 𝒢(s) (Eq. 5): each hidden neuron's mask scales its *outgoing* weights — the columns
    of the next masked layer (a conv channel's columns repeated over the flattened positions where a
    flatten follows) — so a dropped neuron's output reaches nothing and, as its incoming weights and bias
    then receive no gradient either, none of its parameters move (Alg. 1 line 17).

    Why the outgoing side: the straight-through estimator (§4, [49]) passes ∂L/∂m̃ to θ as if the sampling
    were the identity, and ∂L/∂m̃_j must be the loss's sensitivity to switching neuron j on. Scaling the
    outgoing weights gives ∂L/∂m̃_j = Σ_k δ_k W_kj relu(z_j) — the same as masking the activation — for a
    dropped neuron too. Scaling the incoming weights instead gives relu'(m̃_j z_j)·z_j = 0 whenever m̃_j = 0,
    so a dropped neuron's score would only ever learn from the minibatches where it happened to be kept."""
    out = dict(params)
    for prev, s in zip(sites, sites[1:]):
        if prev.name not in neuron:
            continue
        a = neuron[prev.name]
        W = params[s.weights[0]]
        cols = a.repeat_interleave(W.shape[1] // a.numel())
        out[s.weights[0]] = W * cols.reshape(1, -1, *([1] * (W.dim() - 2)))
    return out


def hidden_units(m: ModelContext) -> dict[str, int]:
    """The masked hidden layers (every mask site but the head's) and their neurons, in the sites' order."""
    head = set(m.head)
    return {s.name: int(m.shapes[s.weights[0]][0]) for s in m.sites if s.weights[0] not in head}


@task_function("fedpews.fixed_forward")
def fixed_forward(m: ModelContext):
    """FedPeWS-Fixed's forward: the weights under the client's fixed neuron masks (constants ``m:<unit>``)."""
    units = hidden_units(m)

    def forward(tr: Tensors, c: Tensors, x: torch.Tensor, b: Tensors) -> torch.Tensor:
        return m.call(masked_params(m.sites, tr, {n: c[f"m:{n}"] for n in units}), b, x)

    return forward


@task_function("fedpews.learned_forward")
def learned_forward(m: ModelContext):
    """Inference-style forward of a warmup task: one sample of 𝒢(s) (the step's uniforms ``u1``)."""
    units, weights = hidden_units(m), m.param_names

    def forward(tr: Tensors, c: Tensors, x: torch.Tensor, b: Tensors) -> torch.Tensor:
        a = {n: (c[f"u1:{n}"] < torch.sigmoid(tr[f"s:{n}"].detach())).float() for n in units}
        return m.call(masked_params(m.sites, {w: tr[w] for w in weights}, a), b, x)

    return forward


@task_function("fedpews.learned_loss")
def learned_loss(m: ModelContext, lambda_div: float, mask_lr: float):
    """A warmup step's loss: Procedure I's mask step (Eq. 6) taken through a surrogate, then Procedure II's
    weight loss (Eq. 8); λ = ``lambda_div``, η_s = ``mask_lr``."""
    names, weights, sites = list(hidden_units(m)), list(m.param_names), m.sites
    lam, eta_s = lambda_div, mask_lr

    def loss(tr: Tensors, c: Tensors, x: torch.Tensor, y: torch.Tensor, b: Tensors) -> torch.Tensor:
        s = [tr[f"s:{n}"] for n in names]
        # Procedure I: weights frozen; L_s = f(x ⊙ 𝒢(s)) − λ‖σ(s) − θ_{g∖i}‖² (Eq. 6); the Bernoulli draws use the
        # step's uniforms u1, u2 (LocalTask.noise: the client's own stream, so clients can train stacked)
        frozen = {w: tr[w].detach() for w in weights}

        def procedure_one(sd: Tensors, bufs: Tensors):
            bufs = {k: v.clone() for k, v in bufs.items()}  # its forward's batch-norm updates come back as aux
            a = {n: bernoulli_ste(torch.sigmoid(sd[n]), c[f"u1:{n}"]) for n in names}
            l_s = cross_entropy(m.call(masked_params(sites, frozen, a), bufs, x), y)
            div = sum((torch.sigmoid(sd[n]) - c[f"theta:{n}"]).pow(2).sum() for n in names)
            return l_s - lam * div, bufs

        # ∇_s L_s with torch.func.grad (not autograd.grad), so the batched loop can vmap the step over clients
        g, new_b = torch.func.grad(procedure_one, has_aux=True)({n: si.detach() for n, si in zip(names, s)}, b)
        for k, v in new_b.items():
            b[k].copy_(v)
        grads = [g[n] for n in names]
        # the step s ← s − η_s ∇_s L_s, taken by the optimizer: a surrogate worth 0 whose gradient is ∇_s L_s
        surrogate = sum(((si - si.detach()) * g).sum() for si, g in zip(s, grads))
        # Procedure II: s frozen at its updated value, a fresh sample; L_x = f(x ⊙ 𝒢(s'), ξ) (Eq. 8)
        a2 = {n: (c[f"u2:{n}"] < torch.sigmoid(si.detach() - eta_s * g)).float()
              for n, si, g in zip(names, s, grads)}
        l_x = cross_entropy(m.call(masked_params(sites, {w: tr[w] for w in weights}, a2), b, x), y)
        return l_x + surrogate

    return loss


def fixed_group(units: int, parts: int, i: int) -> torch.Tensor:
    """FedPeWS-Fixed: participant ``i``'s binary mask over ``units`` neurons, the ``i``-th of ``parts`` contiguous
    groups, disjoint, covering all (``numpy.array_split``'s: the first ``units % parts`` one neuron larger)."""
    if parts > units:
        raise ConfigError(f"fedpews_fixed: {parts} participants but a hidden layer has only {units} neurons; "
                          f"every participant needs at least one")
    q, r = divmod(units, parts)
    start = i * q + min(i, r)
    m = torch.zeros(units)
    m[start: start + q + int(i < r)] = 1.0
    return m


def fixed_partition(units: int, parts: int) -> list[torch.Tensor]:
    """FedPeWS-Fixed: ``parts`` binary masks over ``units`` neurons, contiguous groups, disjoint, covering all."""
    return [fixed_group(units, parts, i) for i in range(parts)]


@ALGORITHMS.register("fedpews")
class FedPeWS(Algorithm):
    name = "fedpews"
    Args = FedPeWSArgs
    fixed = False

    def client_state_bytes(self) -> int:
        """Its records in the device store (:meth:`_layouts`: the scores s_i in float32, the last round's neuron
        masks in bits) and its row of the server's θ (float32 per hidden neuron, in RAM)."""
        units = hidden_units(self.model_context)
        return sum(map(record_bytes, self._layouts(units).values())) + 4 * sum(units.values())

    def _layouts(self, units: dict[str, int]) -> dict[str, dict]:
        out = {"neuron_masks": {n: ((h,), torch.bool) for n, h in units.items()}}
        if not self.fixed:
            out["scores"] = {n: ((h,), torch.float32) for n, h in units.items()}
        return out

    def setup(self) -> None:
        head = set(head_names(self.model))
        self.hidden: list[MaskSite] = [s for s in self.sites if s.weights[0] not in head]
        if not self.hidden or any(s.kind == "lstm" for s in self.sites):
            raise ConfigError(f"{self.name}: model {self.cfg.model.name!r} needs hidden linear/conv layers and no LSTM")
        self.units = hidden_units(self.model_context)
        self._check_sequential()
        T = self.cfg.training.rounds
        self.warmup = self.args.warmup_rounds if self.args.warmup_rounds >= 0 else int(round(self.args.tau * T))
        self.s0 = {n: torch.full((h,), self.args.init_score) for n, h in self.units.items()}  # every s_i at first
        N = len(self.client_ids)
        self.index = {cid: i for i, cid in enumerate(self.client_ids)}
        # θ_i of every client, row i of each layer's (N, units): the server's, read whole each round
        self.theta = {n: torch.sigmoid(v).expand(N, -1).clone() for n, v in self.s0.items()}
        layouts = self._layouts(self.units)
        self.neuron_masks = self.store.table("neuron_masks", layouts["neuron_masks"])  # m̃_i of its last round
        if self.fixed:
            for h in self.units.values():  # a layer narrower than the participants is refused here
                fixed_group(h, N, 0)
        else:
            self.scores = self.store.table("scores", layouts["scores"])  # s_i once it has trained

    def _check_sequential(self) -> None:
        prev = None
        for s in self.sites:
            fan_in = int(self.global_params[s.weights[0]].shape[1])
            if prev is not None and fan_in % self.units_or_out(prev):
                raise ConfigError(f"{self.name}: layer {s.name!r} does not follow {prev.name!r} sequentially; "
                                  f"FedPeWS supports sequential MLP/CNN models")
            prev = s

    def units_or_out(self, site: MaskSite) -> int:
        return int(self.global_params[site.weights[0]].shape[0])

    # -- masks ----------------------------------------------------------------------------------------
    def in_warmup(self, rnd: int) -> bool:
        return rnd < self.warmup  # rounds t = rnd + 1 ≤ W

    def theta_excluding(self, cid: str) -> Tensors:
        """θ_{g∖i}: the mean of the other participants' latest θ_j (θ_i itself with one participant)."""
        i = self.index[cid]
        if len(self.client_ids) == 1:
            return {n: t.mean(0) for n, t in self.theta.items()}
        return {n: torch.cat([t[:i], t[i + 1:]]).mean(0) for n, t in self.theta.items()}

    @functools.cached_property
    def theta_bytes(self) -> int:
        """The bytes of θ_g on the wire (its shapes never change; its values are a mean over every client)."""
        return tensor_bytes(self.theta_global)

    @property
    def theta_global(self) -> Tensors:
        return {n: t.mean(0) for n, t in self.theta.items()}

    def fixed_masks(self, cid: str) -> Tensors:
        """FedPeWS-Fixed: the client's group of every hidden layer's neurons (float 0 / 1)."""
        return {n: fixed_group(h, len(self.client_ids), self.index[cid]) for n, h in self.units.items()}

    def last_masks(self, cid: str) -> Tensors:
        """m̃_i of the client's last round (float 0 / 1; empty: dense, or before it has trained)."""
        rec = self.neuron_masks.get(cid) or {}
        return {n: m.float() for n, m in rec.items()}

    def scores_of(self, cid: str) -> Tensors:
        """s_i: s_g^0 until the client has trained."""
        return self.scores.get(cid, self.s0)

    def param_masks(self, neuron: Tensors) -> Tensors:
        """𝒢's last step: neuron masks (units,) -> parameter masks of every masked layer's weight and bias."""
        out: Tensors = {}
        prev = None
        for s in self.sites:
            W = self.global_params[s.weights[0]]
            rows = neuron.get(s.name, torch.ones(W.shape[0]))
            cols = torch.ones(W.shape[1]) if prev is None else prev.repeat_interleave(W.shape[1] // prev.numel())
            m = rows[:, None] * cols[None, :]
            out[s.weights[0]] = m.reshape(W.shape[0], W.shape[1], *([1] * (W.dim() - 2))).expand_as(W).clone()
            for b in s.biases:
                out[b] = rows.clone()
            prev = rows
        return out

    def masked_params(self, params: Tensors, neuron: Tensors) -> Tensors:
        """:func:`masked_params` on this model's sites."""
        return masked_params(self.sites, params, neuron)

    # -- local training -------------------------------------------------------------------------------
    def local_task(self, cid: str, rnd: int) -> LocalTask:
        if not self.in_warmup(rnd):
            task = super().local_task(cid, rnd)
            self.neuron_masks[cid] = {}  # dense
        elif self.fixed:
            task = self._fixed_task(cid)
        else:
            task = self._learned_task(cid)
        if self.args.base == "fedprox":
            task = with_proximal(task, self.global_params, self.args.mu)
        return task

    def _fixed_task(self, cid: str) -> LocalTask:
        masks = self.fixed_masks(cid)
        self.neuron_masks[cid] = {n: m.bool() for n, m in masks.items()}
        constants = {f"m:{n}": m for n, m in masks.items()}
        return LocalTask({k: v.clone() for k, v in self.global_params.items()}, self.model_spec, Fn("fedpews.fixed_forward"), constants=constants,
                         buffers={k: v.clone() for k, v in self.global_buffers.items()},
                         epochs=self.cfg.training.local_epochs, lr=self.cfg.training.lr)

    def _learned_task(self, cid: str) -> LocalTask:
        names = list(self.units)
        s = self.scores_of(cid)
        trainable = {**{k: v.clone() for k, v in self.global_params.items()}, **{f"s:{n}": s[n].clone() for n in names}}
        excl = self.theta_excluding(cid)
        constants = {f"theta:{n}": excl[n] for n in names}
        loss = Fn.of("fedpews.learned_loss", lambda_div=self.args.lambda_div, mask_lr=self.args.mask_lr)
        return LocalTask(trainable, self.model_spec, Fn("fedpews.learned_forward"), constants=constants,
                         buffers={k: v.clone() for k, v in self.global_buffers.items()},
                         epochs=self.cfg.training.local_epochs, lr=self.cfg.training.lr,
                         lrs={f"s:{n}": self.args.mask_lr for n in names}, loss=loss,
                         noise={f"{u}:{n}": (self.units[n],) for u in ("u1", "u2") for n in names})

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        return [self._upload(cid, rnd, res) for cid, res in results]

    def _upload(self, cid: str, rnd: int, result: LocalResult) -> ClientUpdate:
        """The client's selected parameters, its mask and (in the warmup) θ_i; its new masks drawn."""
        x = {k: v for k, v in result.trained.items() if k in self.global_params}
        extra = {}
        if self.in_warmup(rnd) and not self.fixed:
            s = {n: result.trained[f"s:{n}"] for n in self.units}
            self.scores[cid] = s
            theta = {n: torch.sigmoid(v) for n, v in s.items()}
            neuron = {n: torch.bernoulli(t) for n, t in theta.items()}  # m_i^t = 𝒢(s_i^{t,K})
            self.neuron_masks[cid] = {n: m.bool() for n, m in neuron.items()}
            extra["theta"] = theta
        else:  # the round's masks, as its local task set them
            neuron = self.last_masks(cid)
        pmask = self.param_masks(neuron) if neuron else {}
        if pmask:  # only the selected parameters, the mask (1 bit each) and θ_i cross the network
            sent = sum(int(m.sum()) for m in pmask.values()) * 4
            up = sent + mask_bytes(pmask) + tensor_bytes(extra.get("theta", {}))
        else:
            up = tensor_bytes(x)
        return ClientUpdate(cid, result.num_samples, {**x, **result.buffers}, bytes_up=up,
                            bytes_down=tensor_bytes(self.global_params) + self.theta_bytes,
                            train_loss=result.loss, samples_seen=result.samples_seen,
                            extra={**extra, "masks": pmask})

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        for u in updates:
            if "theta" in u.extra:
                for n, t in u.extra["theta"].items():
                    self.theta[n][self.index[u.client_id]] = t
        for k, xg in self.global_params.items():
            masks = [u.extra["masks"].get(k) for u in updates]  # None: the whole tensor
            self.global_params[k] = server_update(xg, [u.payload[k] for u in updates], masks, self.args.server_lr)
        self.global_buffers = average_buffers(self.global_buffers, [u.payload for u in updates],
                                              [1.0] * len(updates))  # unweighted, as Alg. 1 line 21

    def eval_masks(self, cid: str) -> Tensors:
        """The masks of the client's last local training (for its FLOPs); dense after the warmup."""
        neuron = self.last_masks(cid)
        if not neuron:
            return {}
        pm = self.param_masks(neuron)
        return {w: pm[w] for s in self.sites for w in s.weights}

    def summary_extra(self) -> dict:
        return {"warmup_rounds": self.warmup,
                "theta_global_mean": float(torch.cat(list(self.theta_global.values())).mean())}


@ALGORITHMS.register("fedpews_fixed")
class FedPeWSFixed(FedPeWS):
    name = "fedpews_fixed"
    fixed = True
