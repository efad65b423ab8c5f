"""HeteroFL (Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient Federated Learning for
Heterogeneous Clients", ICLR 2021): client k, of capability r_k, trains the width-scaled submodel made of the
first ⌈r_k·C⌉ channels / units of every hidden layer (inputs and classes always whole); the server averages each
element over the clients that hold it (Σ_k m_k ⊙ w_k / Σ_k m_k, an element nobody holds keeps its value).

The submodel is the full model with the other units masked out through :func:`effective_params` — a dead unit
outputs exactly zero, its bias and batch-norm affine parameters gated — which computes what the sliced dense
submodel computes, and is what export compacts back into a small dense network. Capabilities: ``rates``
assigned to clients round-robin in client order (HeteroFL's levels a-e are 1, 1/2, 1/4, 1/8, 1/16). Batch-norm
running statistics are averaged over all clients. HeteroFL's static BN and output scaler are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from edgemask.trainer.aggregation import average_buffers, mask_weighted_average
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.masks import masked_model
from edgemask.trainer.models.masking import MaskSite, effective_params
from edgemask.trainer.models.registry import head_names
from edgemask.trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask
from edgemask.trainer.task_functions import Fn, ModelContext, task_function


@dataclass(frozen=True)
class HeteroFLArgs:
    rates: list[float] | None = None  # capability r per level; default [1.0, 0.5, 0.25]


def width_masks(params: dict[str, torch.Tensor], sites: tuple[MaskSite, ...], head: set[str], rate: float
                ) -> dict[str, torch.Tensor]:
    """Prefix masks of the width-``rate`` submodel for every site's weight (out rows ⌈r·out⌉, input columns
    ⌈r·in⌉ — for a linear fed by a flattened conv, ⌈r·C⌉ channels × H·W — inputs of the first layer and outputs
    of the head whole)."""
    out, prev = {}, None
    for i, s in enumerate(sites):
        if s.kind == "lstm":
            raise ValueError("heterofl: LSTM layers are not supported")
        W = params[s.weights[0]]
        n_out, n_in = W.shape[0], W.shape[1]
        rows = n_out if s.weights[0] in head else math.ceil(rate * n_out)
        if i == 0:
            cols = n_in
        elif s.kind == "linear" and prev is not None and prev.kind == "conv" and n_in % params[prev.weights[0]].shape[0] == 0:
            c = params[prev.weights[0]].shape[0]
            cols = math.ceil(rate * c) * (n_in // c)
        else:
            cols = math.ceil(rate * n_in)
        m = torch.zeros(W.shape)
        m[:rows, :cols] = 1.0
        out[s.weights[0]] = m
        prev = s
    return out


def holder_masks(params: dict[str, torch.Tensor], sites: tuple[MaskSite, ...], masks: dict[str, torch.Tensor]
                 ) -> dict[str, torch.Tensor]:
    """Which elements of every parameter a client holds: its weight masks, its live units' biases and batch-norm
    parameters, and everything else whole."""
    hold = {k: torch.ones_like(v) for k, v in params.items()}
    for s in sites:
        m = masks[s.weights[0]]
        hold[s.weights[0]] = m
        alive = m.reshape(m.shape[0], -1).amax(1)
        for b in s.biases:
            hold[b] = alive.clone()
        if s.norm is not None:
            for p in (f"{s.norm}.weight", f"{s.norm}.bias"):
                if p in hold:
                    hold[p] = alive.clone()
    return hold


@task_function("heterofl.submodel")
def submodel_forward(m: ModelContext):
    """The task's forward: the client's submodel, the global weights under its width masks (the constants)."""

    def forward(params: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], x: torch.Tensor,
                buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        return m.call(effective_params(params, masks, m.sites), buffers, x)

    return forward


SUBMODEL = Fn("heterofl.submodel")


@ALGORITHMS.register("heterofl")
class HeteroFL(Algorithm):
    name = "heterofl"
    Args = HeteroFLArgs

    def setup(self) -> None:
        rates = [float(r) for r in (self.args.rates or [1.0, 0.5, 0.25])]
        head = set(head_names(self.model))
        self.rate = {cid: rates[i % len(rates)] for i, cid in enumerate(self.client_ids)}
        # a client's masks are its rate's: built once per rate, the same tensors for all its clients (nothing
        # model-sized per client; stacked as views)
        self.rate_masks = {r: width_masks(self.global_params, self.sites, head, r)
                           for r in sorted(set(self.rate.values()))}
        self.rate_hold = {r: holder_masks(self.global_params, self.sites, m) for r, m in self.rate_masks.items()}
        self.rate_held = {r: sum(int(h.sum()) for h in hold.values()) for r, hold in self.rate_hold.items()}  # elements

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        r = self.rate[cid]
        # the global tensors themselves: the loops train copies (LocalTask)
        return LocalTask(dict(self.global_params), self.model_spec, SUBMODEL,
                         constants=dict(self.rate_masks[r]), buffers=dict(self.global_buffers),
                         epochs=self.cfg.training.local_epochs, lr=self.cfg.training.lr, grad_keep=dict(self.rate_hold[r]))

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """The trained submodel; its float32 elements cost the same both ways."""
        out = []
        for cid, res in results:
            held = self.rate_held[self.rate[cid]]
            out.append(ClientUpdate(cid, res.num_samples, {**res.trained, **res.buffers}, bytes_up=held * 4,
                                    bytes_down=held * 4, train_loss=res.loss, samples_seen=res.samples_seen))
        return out

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        for k, g in self.global_params.items():
            self.global_params[k] = mask_weighted_average(g, [u.payload[k] for u in updates],
                                                          [self.rate_hold[self.rate[u.client_id]][k] for u in updates])
        self.global_buffers = average_buffers(self.global_buffers, [u.payload for u in updates],
                                              [u.num_samples for u in updates])

    def eval_masks(self, cid: str) -> dict[str, torch.Tensor]:
        return self.rate_masks[self.rate[cid]]

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        return [masked_model(self.model_context, self.global_params, self.eval_masks(cid), self.global_buffers)
                for cid in cids]

    def client_state(self, cid: str) -> ClientState:
        return ClientState(masks=dict(self.eval_masks(cid)))

    def summary_extra(self) -> dict:
        return {"rates": self.rate}
