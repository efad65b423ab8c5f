"""BNN-FedAvg (FedMask §4.3 baseline): FedAvg on a binarized neural network (Hubara, Courbariaux, Soudry,
El-Yaniv, Bengio, "Binarized Neural Networks", NeurIPS 2016).

* Forward with binary weights W_b = α·sign(W) for every conv, linear and LSTM weight (Hubara et al. Eq. 1,
  sign(0) = +1); α = mean|W| per layer when ``scale = true`` (the XNOR-Net scale, so that a model without batch
  norm after each layer — our MLPs — keeps activations of sane size), α = 1 otherwise (pure ±1, as in [25]).
  Biases, batch norm and embeddings stay real-valued.
* Backward: straight-through estimator with the saturation of Hubara et al. (§1.3): ∂L/∂W = ∂L/∂W_b · 1_{|W|≤1};
  the optimizer updates real-valued shadow weights W locally.
* Shadow weights are clipped to [−1, 1] after every update (Hubara et al., Algorithm 1, "parameters update":
  W_k^{t+1} ← clip(update(W_k^t, η, g_{W_k}), −1, 1); §1.3: otherwise the real-valued weights would grow very
  large without any impact on the binary weights). Done by the task's ``project`` hook, which the one local loop
  (sequential and batched alike) applies after each optimizer step; biases and norms are updated unclipped, as
  θ_k in their Algorithm 1.
* Communication (paper: "map the real-value parameters to the binary ones before transmit ... and convert them
  back after receiving the updated binary parameters"): a client uploads sign(W) packed 1 bit per element plus
  α (4 bytes per layer when ``scale``), and the real-valued biases / norms / buffers as float32. The server takes
  the sample-weighted majority vote sign(Σ n_k sign(W_k)) and the weighted mean of α, and sends the same format
  back; the device converts it back to shadow weights W = α·sign.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from edgemask.trainer.accounting import FLOAT_BYTES, mask_bytes, tensor_bytes
from edgemask.trainer.aggregation import average_buffers, average_state, stack_rows, weighted_average
from edgemask.trainer.algorithms.base import ALGORITHMS, Algorithm
from edgemask.trainer.records import ClientUpdate, LocalResult, LocalTask
from edgemask.trainer.task_functions import Fn, ModelContext, task_function


@dataclass(frozen=True)
class BNNArgs:
    scale: bool = True  # per-layer α = mean|W|; false: pure ±1 weights


def sign(w: torch.Tensor) -> torch.Tensor:
    return torch.where(w >= 0, 1.0, -1.0).to(w.dtype)


def binarize_ste(w: torch.Tensor, scale: bool) -> torch.Tensor:
    """Forward α·sign(w); backward the gradient times 1_{|w|≤1} (Hubara et al.'s straight-through estimator)."""
    alpha = w.detach().abs().mean() if scale else 1.0
    clipped = w.clamp(-1.0, 1.0)
    return clipped + (alpha * sign(w.detach()) - clipped).detach()


def binary_weights(m: ModelContext) -> list[str]:
    """The binarized weights: every conv, linear and LSTM weight (the mask sites')."""
    return [w for s in m.sites for w in s.weights]


@task_function("bnn.forward")
def binarized_forward(m: ModelContext, scale: bool):
    """The task's forward: the model on the binarized shadow weights (Eq. 1)."""
    binary = binary_weights(m)

    def forward(params: dict[str, torch.Tensor], constants: dict[str, torch.Tensor], x: torch.Tensor,
                buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        return m.call({**params, **{w: binarize_ste(params[w], scale) for w in binary}}, buffers, x)

    return forward


@task_function("bnn.clip")
def clip(m: ModelContext):
    """Hubara et al. Algorithm 1: the binarized layers' shadow weights clipped to [−1, 1] after each update."""
    binary = binary_weights(m)

    def project(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {w: params[w].clamp(-1.0, 1.0) for w in binary}

    return project


CLIP = Fn("bnn.clip")


@ALGORITHMS.register("bnn_fedavg")
class BNNFedAvg(Algorithm):
    name = "bnn_fedavg"
    Args = BNNArgs

    def setup(self) -> None:
        self.binary = binary_weights(self.model_context)
        with torch.no_grad():  # the shared model is binary from the start
            for w in self.binary:
                self.global_params[w] = binarize_ste(self.global_params[w], self.args.scale)

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        task = super().local_task(cid, rnd)  # shadow weights start at the received α·sign (converted back)
        task.forward = Fn.of("bnn.forward", scale=self.args.scale)
        task.project = CLIP
        return task

    @functools.cached_property
    def _binary_bytes(self) -> int:
        """sign(W) packed 1 bit per element, plus α per layer with ``scale``: fixed shapes, counted once."""
        bits = mask_bytes({w: self.global_params[w] for w in self.binary})
        return bits + (FLOAT_BYTES * len(self.binary) if self.args.scale else 0)

    def _wire_bytes(self, real: dict[str, torch.Tensor]) -> int:
        return self._binary_bytes + tensor_bytes(real)

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """Every client's upload at once: sign(W_k) and α_k = mean|W_k| of each binarized layer computed on the
        clients' stacked shadow weights (read in place from the batched loop's results), one op per layer."""
        if not results:
            return []
        K = len(results)
        signs, scales = {}, {}
        for w in self.binary:
            shadow = stack_rows([res.trained[w] for _, res in results])  # (K, *shape)
            signs[w] = sign(shadow).unbind(0)  # 1 bit per element on the wire
            scales[w] = (shadow.abs().flatten(1).mean(1) if self.args.scale else torch.ones(K)).unbind(0)
        down = self._wire_bytes({k: v for k, v in {**self.global_params, **self.global_buffers}.items()
                                 if k not in self.binary})
        out = []
        for i, (cid, res) in enumerate(results):
            real = {k: v for k, v in res.trained.items() if k not in self.binary}
            payload = {**real, **res.buffers}
            for w in self.binary:
                payload[w] = signs[w][i]
                payload[f"scale:{w}"] = scales[w][i]
            out.append(ClientUpdate(cid, res.num_samples, payload, bytes_up=self._wire_bytes({**real, **res.buffers}),
                                    bytes_down=down, train_loss=res.loss, samples_seen=res.samples_seen))
        return out

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        weights = [u.num_samples for u in updates]
        real = [k for k in self.global_params if k not in self.binary]
        new = average_state([u.payload for u in updates], weights, real)
        for w in self.binary:
            vote = weighted_average([u.payload[w] for u in updates], weights)  # in [-1, 1]
            alpha = weighted_average([u.payload[f"scale:{w}"] for u in updates], weights)
            new[w] = alpha * sign(vote)
        self.global_params = new
        self.global_buffers = average_buffers(self.global_buffers, [u.payload for u in updates],
                                              [u.num_samples for u in updates])
