"""Client sampling: one schedule precomputed from the seed, so every algorithm sees the same stream."""

from __future__ import annotations

import numpy as np


def sampling_schedule(client_ids: list[str], rounds: int, participation: float, seed: int) -> list[list[str]]:
    """For each round, the sampled clients: max(⌊N·K⌋, 1) of N without replacement (FedMask Alg. 1, line 8),
    in a fixed order. Depends only on (client_ids, rounds, participation, seed)."""
    rng = np.random.default_rng([seed, 0x5A3])
    n = len(client_ids)
    k = max(int(n * participation), 1)
    return [[client_ids[i] for i in sorted(rng.choice(n, size=k, replace=False))] for _ in range(rounds)]


def batch_order(num_samples: int, epochs: int, seed: int, round_: int, client_index: int) -> list[np.ndarray]:
    """Per local epoch, the permutation of a client's samples; the same for every algorithm and for the
    sequential and batched loops."""
    rng = np.random.default_rng([seed, round_, client_index, 0xB7])
    return [rng.permutation(num_samples) for _ in range(epochs)]
