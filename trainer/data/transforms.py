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


class NormalizedPool:
    """A uint8 image pool ``(N, C, H, W)`` read as :func:`normalize` of it, normalizing only the images indexed:
    the clients' parts of CIFAR-10's 60,000 images are a fraction of them (FedMask's IC-CIFAR10: 13,200), so the
    pool stays 1 byte a pixel (184 MB) instead of 4 (737 MB). The same float32 operations, element by element, as
    normalizing the whole pool."""

    def __init__(self, images: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.images, self.mean, self.std = images, mean, std
        self.shape = images.shape

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, idx) -> np.ndarray:
        return normalize(self.images[idx], self.mean, self.std)


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
