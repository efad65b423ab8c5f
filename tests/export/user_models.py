"""Two models written the way a user writes them, outside the zoo: their own module names, no ``norm_after`` map,
registered through :data:`edgemask.trainer.models.registry.MODELS` as the registry's docstring describes.

* ``user_resnet``: a ResNet-style network of basic blocks (conv-bn-relu, conv-bn, identity or projection
  shortcut, residual add), global average pool, linear head.
* ``user_mobilenet``: a MobileNetV2-style network of inverted residuals (1×1 widen-bn-relu6, 3×3 depthwise-bn-relu6,
  1×1 narrow-bn, residual add where shapes match), global average pool, linear head.
* ``user_sortnet`` / ``user_sortnet_inline``: linear-relu, a sort, linear; the sort as a layer of its own
  (``SortLast``) or written in the model's forward. A sort along a size-1 axis changes no value, but it is an
  ``aten.sort`` in every exported graph, and ExecuTorch 1.4.1's runtime has no kernel for it (loading the
  ``.pte`` fails: "kernel 'aten::sort.values' not found"): a real layer that a real runtime cannot run.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from edgemask.trainer.models.registry import MODELS


class Residual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.a_norm = nn.BatchNorm2d(cout)
        self.b = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b_norm = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
            if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a_norm(self.a(x)))
        y = self.b_norm(self.b(y))
        return torch.relu(y + self.shortcut(x))


class UserResNet(nn.Module):
    """entry conv-bn-relu (3→8), stage1 (8→8, identity shortcut), stage2 (8→16, stride 2, projection), head."""

    head = ("classifier",)

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.entry = nn.Conv2d(in_channels, 8, 3, 1, 1, bias=False)
        self.entry_norm = nn.BatchNorm2d(8)
        self.stage1 = Residual(8, 8, 1)
        self.stage2 = Residual(8, 16, 2)
        self.classifier = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.entry_norm(self.entry(x)))
        x = self.stage2(self.stage1(x))
        return self.classifier(x.mean(dim=(2, 3)))


class Inverted(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, ratio: int = 4) -> None:
        super().__init__()
        mid = cin * ratio
        self.widen = nn.Conv2d(cin, mid, 1, bias=False)
        self.widen_norm = nn.BatchNorm2d(mid)
        self.spatial = nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False)
        self.spatial_norm = nn.BatchNorm2d(mid)
        self.narrow = nn.Conv2d(mid, cout, 1, bias=False)
        self.narrow_norm = nn.BatchNorm2d(cout)
        self.skip = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.relu6(self.widen_norm(self.widen(x)))
        y = nn.functional.relu6(self.spatial_norm(self.spatial(y)))
        y = self.narrow_norm(self.narrow(y))
        return x + y if self.skip else y


class UserMobileNet(nn.Module):
    """first conv-bn-relu6 (3→8), ir1 (8→8, residual), ir2 (8→16, stride 2), head."""

    head = ("fc",)

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.first = nn.Conv2d(in_channels, 8, 3, 1, 1, bias=False)
        self.first_norm = nn.BatchNorm2d(8)
        self.ir1 = Inverted(8, 8, 1)
        self.ir2 = Inverted(8, 16, 2)
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.relu6(self.first_norm(self.first(x)))
        x = self.ir2(self.ir1(x))
        return self.fc(x.mean(dim=(2, 3)))


def sort_last(x: torch.Tensor) -> torch.Tensor:
    """(B, F) -> (B, F), the same values: each feature's trailing size-1 axis sorted."""
    return x.unsqueeze(-1).sort(dim=-1).values.squeeze(-1)


class SortLast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sort_last(x)


class SortNet(nn.Module):
    """flatten → fc1 (→16) → relu → sort → out; ``inline``: the sort in this forward, not a layer."""

    head = ("out",)

    def __init__(self, in_features: int, num_classes: int, inline: bool = False) -> None:
        super().__init__()
        self.inline = inline
        self.fc1 = nn.Linear(in_features, 16)
        self.sort = SortLast()
        self.out = nn.Linear(16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x.flatten(1)))
        return self.out(sort_last(h) if self.inline else self.sort(h))


if "user_resnet" not in MODELS:
    MODELS.add("user_resnet", lambda input_shape, num_classes: UserResNet(input_shape[0], num_classes))
if "user_mobilenet" not in MODELS:
    MODELS.add("user_mobilenet", lambda input_shape, num_classes: UserMobileNet(input_shape[0], num_classes))
if "user_sortnet" not in MODELS:
    MODELS.add("user_sortnet", lambda input_shape, num_classes: SortNet(math.prod(input_shape), num_classes))
if "user_sortnet_inline" not in MODELS:
    MODELS.add("user_sortnet_inline",
               lambda input_shape, num_classes: SortNet(math.prod(input_shape), num_classes, inline=True))
