"""Loss math written once for the engines and the algorithms that share it: the cross-entropy both engines and
the algorithms' own losses use (:func:`cross_entropy`), and FedProx's proximal term (FedProx itself, Ditto's
personal model, FedPeWS's optional μ)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from trainer.records import LocalTask


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """``F.cross_entropy(logits, y)`` over a batch ``(B, classes)`` written out: log-softmax, the target's entry,
    and for ``"mean"`` the sum over the batch divided by B. Under ``vmap`` PyTorch computes exactly these ops (its
    decomposition of ``nll_loss``, which has no batching rule: the same bits, tested), but through slow Python
    machinery on every call, and its first call imports sympy. Per sample (``"none"``) this is
    F.cross_entropy's bits; the eager mean (a cascaded sum) can differ in the last bit, so a task's own loss uses
    this in both loops."""
    per_sample = -logits.log_softmax(-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
    if reduction == "none":
        return per_sample
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    return per_sample.sum() / y.shape[-1]


@dataclass(frozen=True)
class Proximal:
    """FedProx's term μ/2 Σ ‖w − w_g‖² over every trainable ``w`` whose anchor ``constants[prefix + name]``
    exists, as a :attr:`~trainer.records.LocalTask.regularizer`. A value: two equal terms compare equal, so the
    tasks holding them are one kind of task to the batched engine."""

    mu: float
    prefix: str = "g:"

    def __call__(self, trainable: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]) -> torch.Tensor:
        total = torch.zeros(())
        for k, w in trainable.items():
            anchor = constants.get(self.prefix + k)
            if anchor is not None:
                total = total + (w - anchor).pow(2).sum()
        return 0.5 * self.mu * total


@dataclass(frozen=True)
class RegularizerSum:
    """``first(trainable, constants) + second(trainable, constants)``, as a value (equal parts: equal sums)."""

    first: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], torch.Tensor]
    second: Callable[[dict[str, torch.Tensor], dict[str, torch.Tensor]], torch.Tensor]

    def __call__(self, trainable: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.first(trainable, constants) + self.second(trainable, constants)


def proximal_term(mu: float, prefix: str = "g:") -> Proximal:
    """μ/2 Σ ‖w − w_g‖² (:class:`Proximal`)."""
    return Proximal(mu, prefix)


def with_proximal(task: LocalTask, anchor: dict[str, torch.Tensor], mu: float) -> LocalTask:
    """``task`` with FedProx's term toward ``anchor`` added to its regularizer (anchors go in its constants)."""
    task.constants.update({f"g:{k}": v.detach().clone() for k, v in anchor.items() if k in task.trainable})
    prox, base = Proximal(mu), task.regularizer
    task.regularizer = prox if base is None else RegularizerSum(base, prox)
    return task
