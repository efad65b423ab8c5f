"""Client sampling: one schedule precomputed from the seed, so every algorithm sees the same stream."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def clients_per_round(num_clients: int, participation: float) -> int:
    """How many of ``num_clients`` clients a round samples at ``training.participation`` K: max(⌊N·K⌋, 1)
    (FedMask Alg. 1, line 8: "k ← max(N × K, 1)", which leaves the rounding of N × K open: down, as a count of
    devices that fit in the rate). The one rule: the sampler and the run's disk-room estimate both read it (7
    clients at 0.5: 3, where round() would say 4)."""
    return max(int(num_clients * participation), 1)


def sampling_schedule(client_ids: list[str], rounds: int, participation: float, seed: int,
                      k: int | None = None) -> list[list[str]]:
    """For each round, the sampled clients: :func:`clients_per_round` of N without replacement (FedMask Alg. 1,
    line 8), or ``k`` of them (a round that over-commits, :mod:`edgemask.trainer.system`), in a fixed order.
    Depends only on (client_ids, rounds, participation or k, seed)."""
    rng = np.random.default_rng([seed, 0x5A3])
    n = len(client_ids)
    k = clients_per_round(n, participation) if k is None else k
    return [[client_ids[i] for i in sorted(rng.choice(n, size=k, replace=False))] for _ in range(rounds)]


_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(z: int) -> int:
    """SplitMix64's output function (Steele, Lea & Flood, OOPSLA 2014) on one 64-bit integer."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _mix_array(z: np.ndarray) -> np.ndarray:
    """:func:`_mix` on a uint64 array (numpy's uint64 arithmetic wraps like the masks above)."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _as_u64(values: Sequence[int]) -> np.ndarray:
    """Integers as uint64, each taken mod 2**64 (as ``int(v) & _M64``)."""
    return np.array([int(v) & _M64 for v in values], dtype=np.uint64) if len(values) else np.zeros(0, np.uint64)


def _local_index(counts: np.ndarray) -> np.ndarray:
    """``[0, 1, ..., counts[0]-1, 0, 1, ..., counts[1]-1, ...]``."""
    starts = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(starts, counts)


def batch_orders(sizes: Sequence[int], epochs: Sequence[int], seed: int, round_: int,
                 client_indices: Sequence[int]) -> list[list[np.ndarray]]:
    """For each client ``c``, per local epoch, the permutation of its ``sizes[c]`` samples: the same for every
    algorithm and for the sequential and batched loops, and a function of (seed, round, client index, epoch)
    only — not of which other clients train this round.

    Each sample j draws a 64-bit key SplitMix64(h + (j+1)·γ), h a SplitMix64 hash of (seed, round, client index,
    epoch) and γ the golden-ratio increment (SplitMix64's own stream); the permutation sorts the keys. All
    clients and epochs of a round take one vectorized pass and one sort, instead of a seeded generator each."""
    if not (len(sizes) == len(epochs) == len(client_indices)):
        raise ValueError(f"{len(sizes)} sizes, {len(epochs)} epoch counts and {len(client_indices)} client indices")
    base = _mix(_mix((int(seed) & _M64) ^ 0x5EEDB7) ^ (int(round_) & _M64))
    ep = np.asarray(epochs, dtype=np.int64).reshape(-1)
    with np.errstate(over="ignore"):  # one hash per client, then one per (client, epoch): all in numpy
        hc = _mix_array(np.uint64(base) ^ _as_u64(client_indices))
        seg_hash = _mix_array(np.repeat(hc, ep) ^ _local_index(ep).astype(np.uint64))
    lens = np.repeat(np.asarray(sizes, dtype=np.int64).reshape(-1), ep)  # (segments,) one per (client, epoch)
    nseg = len(lens)
    starts = np.cumsum(lens) - lens
    j = _local_index(lens)  # each sample's index in its segment
    h = np.repeat(seg_hash, lens)
    with np.errstate(over="ignore"):
        keys = _mix_array(h + (j.astype(np.uint64) + np.uint64(1)) * np.uint64(_GOLDEN))
    if nseg == 1:
        perms = [np.argsort(keys, kind="stable")]
    else:  # by segment, then by key: each segment's samples in key order
        order = j[np.lexsort((keys, np.repeat(np.arange(nseg), lens)))]
        ends = (starts + lens).tolist()
        perms = [order[a:b] for a, b in zip(starts.tolist(), ends)]  # np.split, without its per-piece overhead
    out: list[list[np.ndarray]] = []
    pos = 0
    for e in epochs:
        out.append(perms[pos: pos + int(e)])
        pos += int(e)
    return out


def drop_one_sample_batches(orders: list[list[np.ndarray]], batch_size: int) -> list[list[np.ndarray]]:
    """``orders`` (per client, per epoch, a permutation) without each epoch's last sample where it would be a
    minibatch of its own (the epoch's length ≡ 1 mod ``batch_size``): ``training.one_sample_batch = "drop"``, for a
    model whose batch norm sees one value per channel in a one-sample minibatch
    (:func:`edgemask.trainer.models.registry.one_value_norms`). Which sample goes is the permutation's last, so the
    dropped sample changes from epoch to epoch. An order with nothing to drop is the same array."""
    return [[o[:-1] if ends_alone(len(o), batch_size) else o for o in client] for client in orders]


def ends_alone(num_samples: int, batch_size: int) -> bool:
    """Whether an epoch of ``num_samples`` ends in a minibatch of one sample (≡ 1 mod ``batch_size``; never at
    ``batch_size`` 1): the sample ``training.one_sample_batch = "drop"`` leaves out."""
    return int(num_samples) % int(batch_size) == 1


def epoch_samples(num_samples: int, batch_size: int, drop_one_sample: bool) -> int:
    """The samples one local epoch of ``num_samples`` trains on: one fewer where :func:`drop_one_sample_batches`
    leaves the epoch's one-sample last minibatch out (``num_samples`` ≡ 1 mod ``batch_size``), else all."""
    n = int(num_samples)
    return n - 1 if drop_one_sample and ends_alone(n, batch_size) else n


def epoch_steps(num_samples: int, batch_size: int, drop_one_sample: bool) -> int:
    """The minibatches one local epoch of ``num_samples`` takes: ⌈:func:`epoch_samples` / B⌉, the count every
    derived step figure uses (an export's ``steps_per_round``, ``edgemask budgets``, a ``[system]`` round), so
    that under ``training.one_sample_batch = "drop"`` they count the steps the host trained."""
    return math.ceil(epoch_samples(num_samples, batch_size, drop_one_sample) / int(batch_size))


def client_seed(seed: int, round_: int, client_index: int) -> int:
    """A 63-bit seed for a client's own random stream in one round (:attr:`LocalTask.noise`): a SplitMix64 hash
    of (seed, round, client index), independent of the batch orders' keys."""
    return client_seeds(seed, round_, [client_index])[0]


def client_seeds(seed: int, round_: int, client_indices: Sequence[int]) -> list[int]:
    """:func:`client_seed` of each client index, in one numpy pass."""
    base = _mix(_mix((int(seed) & _M64) ^ 0x401CE) ^ (int(round_) & _M64))
    with np.errstate(over="ignore"):
        return (_mix_array(np.uint64(base) ^ _as_u64(client_indices)) >> np.uint64(1)).tolist()


def batch_order(num_samples: int, epochs: int, seed: int, round_: int, client_index: int) -> list[np.ndarray]:
    """Per local epoch, the permutation of one client's samples (:func:`batch_orders` for one client)."""
    return batch_orders([num_samples], [epochs], seed, round_, [client_index])[0]


def step_plan(orders: list[np.ndarray], epochs: int, max_steps: int | None, batch_size: int,
              batches_per_step: int = 1) -> np.ndarray:
    """The client's optimizer steps as sample indices, ``(steps, batches_per_step, batch_size)``, -1 padding a
    partial minibatch (the last of an epoch). The minibatches are the consecutive ``batch_size`` slices of each
    epoch's order, epochs one after another; a step takes the next ``batches_per_step`` of them, a last incomplete
    group wrapping around to the first minibatches; ``max_steps`` keeps the first steps. The one plan of both the
    sequential and the batched loop."""
    rows = []
    for epoch in range(epochs):
        order = np.asarray(orders[epoch % len(orders)], dtype=np.int64)
        nb = -(-len(order) // batch_size)
        padded = np.full(nb * batch_size, -1, dtype=np.int64)
        padded[: len(order)] = order
        rows.append(padded.reshape(nb, batch_size))
    out = np.concatenate(rows) if rows else np.zeros((0, batch_size), dtype=np.int64)
    k = batches_per_step
    if k < 1:
        raise ValueError(f"batches_per_step must be ≥ 1, got {k}")
    steps = -(-len(out) // k)
    out = out[np.arange(steps * k) % max(len(out), 1)] if len(out) else out
    out = out.reshape(steps, k, batch_size)
    return out[:max_steps] if max_steps is not None else out
