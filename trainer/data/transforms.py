"""Image array helpers shared by the image loaders. Arrays are numpy, channels first ``(N, C, H, W)``."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)


def normalize(images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> np.ndarray:
    """uint8 ``(N, C, H, W)`` -> float32 ``(pixel / 255 - mean[c]) / std[c]``; one (mean, std) broadcasts to all C."""
    x = images.astype(np.float32) / np.float32(255.0)
    m = np.asarray(mean, dtype=np.float32).reshape(1, -1, 1, 1)
    s = np.asarray(std, dtype=np.float32).reshape(1, -1, 1, 1)
    x -= m
    x /= s
    return x


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """float32 ``(N, C, H, W)`` -> ``(N, C, size, size)`` by bilinear interpolation (no-op at the same size)."""
    if images.shape[-2:] == (size, size):
        return images
    out = F.interpolate(torch.from_numpy(np.ascontiguousarray(images)), size=(size, size), mode="bilinear",
                        align_corners=False)
    return out.numpy()


def to_channels(images: np.ndarray, channels: int) -> np.ndarray:
    """Replicate a single channel ``(N, 1, H, W)`` to ``(N, channels, H, W)``."""
    if images.shape[1] == channels:
        return images
    return np.repeat(images, channels, axis=1)
