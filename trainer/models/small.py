"""Small models for the embedded datasets (digits 8×8, FedMask's HAR MLP shape)."""

from __future__ import annotations

import math

import torch
from torch import nn

from edgemask.trainer.models.registry import MODELS


class MLP(nn.Module):
    """Fully connected net: input -> hidden... -> classes, ReLU between. ``hidden=(128, 64)`` on digits is the
    64-128-64-10 MLP of the trainer-speed issue; ``hidden=(...)`` of three layers is FedMask's HAR MLP."""

    head = ("out",)

    def __init__(self, in_features: int, hidden: tuple[int, ...], num_classes: int) -> None:
        super().__init__()
        self.depth = len(hidden)
        dims = (in_features, *hidden)
        for i in range(self.depth):
            setattr(self, f"fc{i + 1}", nn.Linear(dims[i], dims[i + 1]))
        self.out = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)  # (B, in_features)
        for i in range(self.depth):
            x = torch.relu(getattr(self, f"fc{i + 1}")(x))
        return self.out(x)  # (B, classes)


@MODELS.register("mlp")
def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (128, 64)) -> MLP:
    return MLP(math.prod(input_shape), tuple(hidden), num_classes)


class SmallCNN(nn.Module):
    """conv(c→16, 3×3) → ReLU → maxpool 2 → conv(16→32, 3×3) → ReLU → global avg pool → linear(32→classes).

    The small CNN of the trainer-speed issue (digits: 1×8×8 input)."""

    head = ("out",)

    def __init__(self, in_channels: int, num_classes: int, widths: tuple[int, int] = (16, 32)) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, padding=1)
        self.conv2 = nn.Conv2d(widths[0], widths[1], 3, padding=1)
        self.out = nn.Linear(widths[1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)  # (B, 16, H/2, W/2)
        x = torch.relu(self.conv2(x)).mean(dim=(2, 3))  # (B, 32)
        return self.out(x)


@MODELS.register("cnn")
def cnn(input_shape: tuple[int, ...], num_classes: int, widths: tuple[int, int] = (16, 32)) -> SmallCNN:
    return SmallCNN(input_shape[0], num_classes, tuple(widths))
