"""A device mix: which board each simulated device is. One rule, read by ``edgemask budgets``
(:mod:`edgemask.profiling.budgets`) and by the training loop's deadlines (:mod:`edgemask.trainer.system`), so a
device is the same board in both; or, with a device trace (FedScale's, :mod:`edgemask.fedscale`), which trace client
each device is."""

from __future__ import annotations

import math

import numpy as np

from edgemask.errors import ConfigError


def assign_boards(client_ids: list[str], mix: dict[str, float], seed: int) -> dict[str, str]:
    """Each simulated device's board: ``round(share · N)`` devices per board (the last board takes the rest), in a
    seeded random order of the devices, so a mix of 30 % / 70 % over 10 devices is 3 and 7 whatever their names."""
    total = sum(mix.values())
    if not mix or any(not v >= 0 for v in mix.values()) or not math.isclose(total, 1.0, abs_tol=1e-6):
        raise ConfigError(f"--mix: the shares must be non-negative and sum to 1, got "
                          f"{', '.join(f'{k}={v:g}' for k, v in mix.items()) or 'none'}")
    n = len(client_ids)
    order = np.random.default_rng([seed, 0x39]).permutation(n)
    boards, start = {}, 0
    names = list(mix)
    for i, b in enumerate(names):
        k = n - start if i == len(names) - 1 else int(round(mix[b] * n))
        for j in order[start: start + k]:
            boards[client_ids[int(j)]] = b
        start += k
    return boards


def assign_trace_clients(client_ids: list[str], trace_ids: list[int], seed: int, stream: int,
                         where: str) -> dict[str, int]:
    """Each simulated device's client of a device trace: a seeded draw of ``len(client_ids)`` distinct trace clients
    (``stream`` tells two traces' draws apart), so a device is the same trace client in every run of the seed.
    A trace of fewer clients than devices is refused naming ``where`` (the file and field)."""
    n, ids = len(client_ids), sorted(trace_ids)
    check_trace_size(n, len(ids), where)
    order = np.random.default_rng([seed, 0x46, stream]).permutation(len(ids))[:n]
    return {cid: ids[int(j)] for cid, j in zip(client_ids, order)}


def check_trace_size(devices: int, clients: int, where: str) -> None:
    """Refuse, naming ``where``, a trace of fewer ``clients`` than the run's ``devices``."""
    if clients < devices:
        raise ConfigError(f"{where}: {clients} client(s), fewer than the run's {devices} devices; each device takes "
                          f"a trace client of its own: give a trace of at least {devices} clients, or train fewer "
                          f"devices")
