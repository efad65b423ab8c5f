"""The papers' models: VGG16 and ResNet18 (CIFAR variants), FedMask's HAR MLP and character LSTM, FedPeWS's MLP
and CNN, and a tiny MobileNetV2-style net (depthwise conv + inverted residual).

Conventions (see :mod:`edgemask.trainer.models.registry`): named-attribute layers (no numbered ``nn.Sequential`` conv+bn
children), ``head`` (classifier modules), and ``norm_after`` (layer path -> the batch norm right after it): the
trace finds the same pairs by itself (:func:`edgemask.trainer.models.registry.norms_after`); the maps stay as overrides
the trace checks, so a forward edited out of step with its map fails loudly.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from edgemask.trainer.models.registry import MODELS
from edgemask.trainer.models.small import MLP

# VGG16 for 32×32 inputs: 13 conv 3×3 (+BN+ReLU), "M" = 2×2 max pool.
VGG16_CFG = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def _scaled(c: int, width: float) -> int:
    return max(1, int(round(c * width)))


class VGG16(nn.Module):
    """VGG16, CIFAR variant (FedMask's CIFAR-10 model): conv1..conv13 with bn1..bn13, then 512→512→512→classes.

    ``width`` scales every channel count and the classifier's hidden size (``width=1/16`` for fast tests).
    """

    head = ("out",)

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> None:
        super().__init__()
        c, h, w = input_shape
        self.plan: list[tuple[int, bool]] = []  # (conv index, pool after it)
        self.norm_after = {}
        i = 0
        for v in VGG16_CFG:
            if v == "M":
                if h >= 2 and w >= 2:  # a 28×28 input (FEMNIST) reaches 1×1 after four pools: skip the fifth
                    self.plan[-1] = (self.plan[-1][0], True)
                    h, w = h // 2, w // 2
                continue
            i += 1
            out = _scaled(v, width)
            setattr(self, f"conv{i}", nn.Conv2d(c, out, 3, padding=1))
            setattr(self, f"bn{i}", nn.BatchNorm2d(out))
            self.norm_after[f"conv{i}"] = f"bn{i}"
            self.plan.append((i, False))
            c = out
        hidden = _scaled(512, width)
        self.fc1 = nn.Linear(c * h * w, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, pool in self.plan:
            x = torch.relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))  # (B, C_i, H, W)
            if pool:
                x = torch.max_pool2d(x, 2)
        x = x.flatten(1)  # (B, C·H·W); 512·1·1 for 32×32 inputs
        x = torch.relu(self.fc1(x))
        x = torch.relu(self.fc2(x))
        return self.out(x)


@MODELS.register("vgg16")
def vgg16(input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> VGG16:
    return VGG16(tuple(input_shape), num_classes, width)


@MODELS.register("har_mlp")
def har_mlp(input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (256, 128)) -> MLP:
    """FedMask's HAR model: a 3-layer MLP on the 561 UCI-HAR features (561→256→128→6 by default)."""
    return MLP(math.prod(input_shape), tuple(hidden), num_classes)


class CharLSTM(nn.Module):
    """FedMask's next-character model (Shakespeare): embedding (vocab→8), a 2-layer LSTM, three FC layers on the
    last step's hidden state. Input: int64 tokens ``(B, T)`` (T = 80); output: logits over the vocabulary."""

    head = ("out",)

    def __init__(self, seq_len: int, num_classes: int, embed: int = 8, hidden: int = 256, layers: int = 2,
                 fc: tuple[int, ...] = (256, 128), vocab: int | None = None) -> None:
        super().__init__()
        self.seq_len = seq_len
        self.embed = nn.Embedding(vocab or num_classes, embed)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        dims = (hidden, *fc)
        self.depth = len(fc)
        for i in range(self.depth):
            setattr(self, f"fc{i + 1}", nn.Linear(dims[i], dims[i + 1]))
        self.out = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)  # (B, T, E)
        x, _ = self.lstm(x)  # (B, T, H)
        x = x[:, -1]  # (B, H): the last step predicts the next character
        for i in range(self.depth):
            x = torch.relu(getattr(self, f"fc{i + 1}")(x))
        return self.out(x)


@MODELS.register("char_lstm")
def char_lstm(input_shape: tuple[int, ...], num_classes: int, hidden: int = 256, embed: int = 8,
              layers: int = 2, fc: tuple[int, ...] = (256, 128)) -> CharLSTM:
    return CharLSTM(input_shape[0], num_classes, embed, hidden, layers, tuple(fc))


class BasicBlock(nn.Module):
    """ResNet BasicBlock: conv3×3-BN-ReLU-conv3×3-BN (+ identity, or a 1×1 conv + BN projection), ReLU."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.project = stride != 1 or cin != cout
        if self.project:
            self.short_conv = nn.Conv2d(cin, cout, 1, stride, bias=False)
            self.short_bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        s = self.short_bn(self.short_conv(x)) if self.project else x
        return torch.relu(y + s)  # residual add: the coupled layers keep the union of live channels


class ResNet18(nn.Module):
    """ResNet18, CIFAR variant (3×3 stem, no stem pool), four stages of two BasicBlocks, avg pool, FC."""

    head = ("out",)

    def __init__(self, in_channels: int, num_classes: int, width: float = 1.0) -> None:
        super().__init__()
        c = _scaled(64, width)
        self.conv1 = nn.Conv2d(in_channels, c, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.norm_after = {"conv1": "bn1"}
        self.blocks: list[str] = []
        for s, base in enumerate((64, 128, 256, 512)):
            cout = _scaled(base, width)
            for b in range(2):
                name = f"layer{s + 1}_{b}"
                setattr(self, name, BasicBlock(c, cout, 2 if (s > 0 and b == 0) else 1))
                self.norm_after.update({f"{name}.conv1": f"{name}.bn1", f"{name}.conv2": f"{name}.bn2"})
                if getattr(self, name).project:
                    self.norm_after[f"{name}.short_conv"] = f"{name}.short_bn"
                self.blocks.append(name)
                c = cout
        self.out = nn.Linear(c, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn1(self.conv1(x)))
        for name in self.blocks:
            x = getattr(self, name)(x)
        x = x.mean(dim=(2, 3))  # (B, C)
        return self.out(x)


@MODELS.register("resnet18")
def resnet18(input_shape: tuple[int, ...], num_classes: int, width: float = 1.0) -> ResNet18:
    return ResNet18(input_shape[0], num_classes, width)


@MODELS.register("fedpews_mlp")
def fedpews_mlp(input_shape: tuple[int, ...], num_classes: int,
                hidden: tuple[int, ...] = (32, 32, 32, 32)) -> MLP:
    """FedPeWS §5.1: 5 FC layers on the 5-D synthetic input."""
    return MLP(math.prod(input_shape), tuple(hidden), num_classes)


class FedPeWSCNN(nn.Module):
    """FedPeWS's CNN, App. B.1 Table 5 (CIFAR-MNIST and {Path-OCT-Tissue}MNIST): conv 3×3 padding 1 + ReLU +
    max pool 2×2 stride 2 per width (Table 5: 32-64-128, "every convolutional layer is followed by a max pooling
    layer"), flatten, one FC to the classes. On Table 5's input (3, 32, 32): (32, 16, 16) -> (64, 8, 8) ->
    (128, 4, 4) -> flatten 2048 -> FC 2048×20. Pooling is ceil-mode, so a 28×28 input (MedMNIST) ends
    at 4×4 as well (28 -> 14 -> 7 -> 4)."""

    head = ("out",)

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, widths: tuple[int, ...] = (32, 64, 128)
                 ) -> None:
        super().__init__()
        c, h, w = input_shape
        for i, cout in enumerate(widths):
            setattr(self, f"conv{i + 1}", nn.Conv2d(c, cout, 3, padding=1))
            c, h, w = cout, (h + 1) // 2, (w + 1) // 2  # ceil-mode pooling
        self.depth = len(widths)
        self.out = nn.Linear(c * h * w, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.depth):
            x = torch.relu(getattr(self, f"conv{i + 1}")(x))
            x = torch.max_pool2d(x, 2, ceil_mode=True)  # (B, C, ⌈H/2⌉, ⌈W/2⌉)
        return self.out(x.flatten(1))


@MODELS.register("fedpews_cnn")
def fedpews_cnn(input_shape: tuple[int, ...], num_classes: int, widths: tuple[int, ...] = (32, 64, 128)
                ) -> FedPeWSCNN:
    return FedPeWSCNN(tuple(input_shape), num_classes, tuple(widths))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1×1 expand-BN-ReLU6, 3×3 depthwise-BN-ReLU6, 1×1 project-BN (+ x when shapes match)."""

    def __init__(self, cin: int, cout: int, expand: int, stride: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(mid)
        self.dw = nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.project = nn.Conv2d(mid, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.relu6(self.bn1(self.expand(x)))
        y = nn.functional.relu6(self.bn2(self.dw(y)))
        y = self.bn3(self.project(y))
        return x + y if self.residual else y


class TinyMobileNet(nn.Module):
    """Stem conv, two inverted residual blocks (one with the residual add, one strided), avg pool, FC."""

    head = ("out",)

    def __init__(self, in_channels: int, num_classes: int, width: int = 8, expand: int = 4) -> None:
        super().__init__()
        self.stem = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(width)
        self.block1 = InvertedResidual(width, width, expand, 1)
        self.block2 = InvertedResidual(width, 2 * width, expand, 2)
        self.out = nn.Linear(2 * width, num_classes)
        self.norm_after = {"stem": "stem_bn"}
        for b in ("block1", "block2"):
            self.norm_after.update({f"{b}.expand": f"{b}.bn1", f"{b}.dw": f"{b}.bn2", f"{b}.project": f"{b}.bn3"})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.relu6(self.stem_bn(self.stem(x)))
        x = self.block2(self.block1(x))
        return self.out(x.mean(dim=(2, 3)))


@MODELS.register("tiny_mobilenet")
def tiny_mobilenet(input_shape: tuple[int, ...], num_classes: int, width: int = 8, expand: int = 4) -> TinyMobileNet:
    return TinyMobileNet(input_shape[0], num_classes, width, expand)
