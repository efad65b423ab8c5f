"""Shared helpers: the registered models at test sizes, and seeded random structured masks."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgemask.trainer.models import MaskedModel, build_model, model_sites

# name -> (input_shape, num_classes, args): small widths so every model compacts in about a second
MODEL_CASES = {
    "mlp": ((64,), 10, {}),
    "cnn": ((1, 8, 8), 10, {}),
    "vgg16": ((3, 32, 32), 10, {"width": 1 / 16}),
    "resnet18": ((3, 32, 32), 10, {"width": 1 / 16}),
    "har_mlp": ((561,), 6, {"hidden": (32, 16)}),
    "char_lstm": ((80,), 80, {"hidden": 16, "fc": (16, 12)}),
    "fedpews_mlp": ((5,), 4, {}),
    "fedpews_cnn": ((1, 28, 28), 10, {"widths": (8, 8, 8)}),
    "tiny_mobilenet": ((3, 16, 16), 10, {}),
}


def randomize_norms(model: nn.Module, seed: int = 0) -> None:
    """Give batch norms non-trivial statistics and affine params (a β leak would show)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.copy_(torch.rand(m.num_features, generator=g) * 2 - 1)
            m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.rand(m.num_features, generator=g) * 2 - 1)


def random_masks(model: nn.Module, kill: float, seed: int, keep: float = 0.7,
                 skip: tuple[str, ...] = ("out",)) -> dict[str, torch.Tensor]:
    """Unstructured binary masks (``keep`` density) plus whole dead units (fraction ``kill``) per masked layer."""
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    masks = {}
    for s in model_sites(model):
        if s.name in skip:
            continue
        for w in s.weights:
            masks[w] = (torch.rand(s.mask_shape(params[w]), generator=g) < keep).float()
        if s.kind == "lstm":
            h = s.hidden
            for layer in range(len(s.weights) // 2):
                dead = torch.rand(h, generator=g) < kill
                for w in s.weights[2 * layer: 2 * layer + 2]:
                    masks[w][2 * h: 3 * h][dead] = 0
        else:
            w = s.weights[0]
            masks[w][torch.rand(masks[w].shape[0], generator=g) < kill] = 0
    return masks


def sample_input(name: str, n: int = 8, seed: int = 0) -> torch.Tensor:
    shape, classes, _ = MODEL_CASES[name]
    g = torch.Generator().manual_seed(seed)
    if name == "char_lstm":
        return torch.randint(0, classes, (n, *shape), generator=g)
    return torch.randn(n, *shape, generator=g)


def masked_case(name: str, kill: float = 0.4, seed: int = 1) -> MaskedModel:
    shape, classes, args = MODEL_CASES[name]
    torch.manual_seed(seed)
    model = build_model(name, shape, classes, **args).eval()
    randomize_norms(model, seed)
    return MaskedModel(model, model_sites(model), random_masks(model, kill, seed))


@pytest.fixture
def masked_factory():
    return masked_case
