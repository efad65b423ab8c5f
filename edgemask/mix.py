"""A device mix: which board each simulated device is. One rule, read by ``edgemask budgets``
(:mod:`edgemask.profiling.budgets`) and by the training loop's deadlines (:mod:`edgemask.trainer.system`), so a
device is the same board in both."""

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
