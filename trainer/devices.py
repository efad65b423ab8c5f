"""The training device: ``training.device``'s valid values, declared once (the setting's check, the command line's
``--device`` and the engines all use :func:`device_problem`), and the torch device a name trains on."""

from __future__ import annotations

import re

import torch

from edgemask.errors import ConfigError


def device_problem(device: str) -> str | None:
    """What is wrong with a ``training.device`` (``"…; …"``), or None: ``cpu``, ``cuda`` or ``cuda:N``. A CUDA device
    on a host without one is not wrong: training falls back to the CPU (:func:`resolve_device`)."""
    if re.fullmatch(r"cpu|cuda(:\d+)?", device):
        return None
    return f"unknown device {device!r}; valid: 'cpu', 'cuda', 'cuda:N'"


def resolve_device(device: str | torch.device) -> torch.device:
    """``cuda`` (or ``cuda:N``) when asked for and available, the CPU otherwise."""
    why = device_problem(str(device))
    if why is not None:
        raise ConfigError(f"training.device: {why}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        return torch.device("cpu")
    return dev
