"""Loss math written once for the engines and the algorithms that share it: the cross-entropy both engines and
the algorithms' own losses use (:func:`cross_entropy`), and FedProx's proximal term (FedProx itself, Ditto's
personal model, FedPeWS's optional μ), registered as the task function ``proximal``."""

from __future__ import annotations

from typing import Callable

import torch

from edgemask.trainer.records import LocalTask
from edgemask.trainer.task_functions import Fn, ModelContext, task_function

Tensors = dict[str, torch.Tensor]


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


def proximal_term(mu: float, prefix: str = "g:") -> Callable[[Tensors, Tensors], torch.Tensor]:
    """FedProx's term μ/2 Σ ‖w − w_g‖² (Li et al., MLSys 2020, Eq. 2) over every trainable ``w`` whose anchor
    ``constants[prefix + name]`` exists: a regularizer ``(trainable, constants) -> scalar``."""

    def proximal(trainable: Tensors, constants: Tensors) -> torch.Tensor:
        total = torch.zeros(())
        for k, w in trainable.items():
            anchor = constants.get(prefix + k)
            if anchor is not None:
                total = total + (w - anchor).pow(2).sum()
        return 0.5 * mu * total

    return proximal


@task_function("proximal")
def _proximal(model: ModelContext, mu: float, prefix: str = "g:") -> Callable[[Tensors, Tensors], torch.Tensor]:
    """The registered task function ``proximal`` (settings ``mu``, ``prefix``): :func:`proximal_term`."""
    return proximal_term(mu, prefix)


def with_proximal(task: LocalTask, anchor: dict[str, torch.Tensor], mu: float) -> LocalTask:
    """``task`` with FedProx's term toward ``anchor`` added to its regularizers (anchors go in its constants)."""
    task.constants.update({f"g:{k}": v.detach().clone() for k, v in anchor.items() if k in task.trainable})
    return task.with_regularizer(Fn.of("proximal", mu=mu))
