"""The model registry: a name -> builder ``(input_shape, num_classes, **args) -> nn.Module``.

Every model is a plain ``nn.Module`` with named-attribute layers (not numbered ``nn.Sequential`` children:
ExecuTorch's XNNPACK lowering trips on those) and three class attributes:

* ``norm_after``: layer path -> the batch norm right after it (its affine params die with the layer's units),
* ``head``: module paths of the classifier head (personal in LG-FedAvg, FedPer, FedRep, PerFedMask),
* ``mask_exclude``: layers never masked.
"""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

from edgemask.registry import Registry
from trainer.models.masking import MaskSite, find_sites

ModelBuilder = Callable[..., nn.Module]
MODELS: Registry[ModelBuilder] = Registry("model")


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int, **args: Any) -> nn.Module:
    """Build and initialize: Kaiming-normal (fan-in, ReLU gain) conv and linear weights, zero biases.

    The scale matters for mask learning (FedMask, FedPeWS): with PyTorch's default uniform init a masked
    network's logits start near zero and mask gradients, which are scaled by W (FedMask Eq. 4), vanish."""
    model = MODELS.get(name)(tuple(input_shape), num_classes, **args)
    for mod in model.modules():
        if isinstance(mod, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            nn.init.kaiming_normal_(mod.weight, mode="fan_in", nonlinearity="relu")
            if mod.bias is not None:
                nn.init.zeros_(mod.bias)
    return model


def model_sites(model: nn.Module) -> tuple[MaskSite, ...]:
    return find_sites(model, getattr(model, "norm_after", {}), tuple(getattr(model, "mask_exclude", ())))


def head_names(model: nn.Module) -> tuple[str, ...]:
    """Parameter names that belong to the classifier head."""
    prefixes = tuple(getattr(model, "head", ()))
    return tuple(n for n, _ in model.named_parameters() if n.split(".")[0] in prefixes or
                 any(n.startswith(p + ".") for p in prefixes))
