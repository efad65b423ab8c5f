"""Client sampling and the per-client batch orders (trainer.sampling)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgemask.trainer.aggregation import weighted_average
from edgemask.trainer.sampling import _mix, _mix_array, batch_order, batch_orders, clients_per_round, sampling_schedule


def test_splitmix64_matches_the_published_first_outputs():
    # SplitMix64 seeded with 0 (state += γ, then the output function): the reference C code's first outputs
    gamma = 0x9E3779B97F4A7C15
    assert [_mix((k * gamma) & ((1 << 64) - 1)) for k in (1, 2, 3)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    z = np.array([gamma, 2 * gamma % (1 << 64)], dtype=np.uint64)
    with np.errstate(over="ignore"):
        assert _mix_array(z).tolist() == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


def test_one_pass_orders_are_each_clients_own_and_ignore_the_others():
    sizes, epochs, idx = [7, 0, 12, 3], [2, 1, 1, 3], [5, 0, 9, 2]
    together = batch_orders(sizes, epochs, seed=3, round_=4, client_indices=idx)
    for n, e, i, got in zip(sizes, epochs, idx, together):
        alone = batch_order(n, e, 3, 4, i)
        assert len(got) == e and all(np.array_equal(a, b) for a, b in zip(got, alone))
        assert all(sorted(p.tolist()) == list(range(n)) for p in got)  # permutations of the client's samples
    # the same client in a different company, or alone, gets the same orders
    other = batch_orders([12], [1], 3, 4, [9])[0]
    assert np.array_equal(other[0], together[2][0])


def test_orders_differ_by_epoch_round_client_and_seed():
    base = batch_order(50, 2, 0, 0, 0)
    assert not np.array_equal(base[0], base[1])
    for args in [(50, 1, 0, 1, 0), (50, 1, 0, 0, 1), (50, 1, 1, 0, 0)]:
        assert not np.array_equal(batch_order(*args)[0], base[0])
    assert np.array_equal(batch_order(50, 1, 0, 0, 0)[0], base[0])  # deterministic


def test_orders_are_uniform_over_positions():
    # where sample 0 lands, over 20,000 clients of 5 samples: each position ≈ 1/5 (±4σ of a binomial)
    orders = batch_orders([5] * 20_000, [1] * 20_000, 0, 0, range(20_000))
    pos = np.array([int(np.nonzero(o[0] == 0)[0][0]) for o in orders])
    freq = np.bincount(pos, minlength=5) / len(pos)
    assert np.all(np.abs(freq - 0.2) < 4 * np.sqrt(0.2 * 0.8 / len(pos)))


def test_sampling_schedule_draws_k_distinct_clients_per_round():
    ids = [f"c{i}" for i in range(10)]
    sched = sampling_schedule(ids, rounds=5, participation=0.3, seed=0)
    assert all(len(r) == 3 == len(set(r)) for r in sched)
    assert sched == sampling_schedule(ids, 5, 0.3, 0)


@pytest.mark.parametrize("n, k, per_round", [
    (4, 0.7, 2),  # N·K = 2.8: rounded down (round() says 3)
    (7, 0.5, 3),  # 3.5: down (round() says 4)
    (10, 0.25, 2), (10, 0.3, 3), (10, 1.0, 10),
    (10, 0.05, 1), (3, 0.1, 1),  # below one client: at least one (FedMask Alg. 1 line 8, max(N × K, 1))
])
def test_clients_per_round_rounds_down_and_takes_at_least_one(n, k, per_round):
    assert clients_per_round(n, k) == per_round
    assert all(len(r) == per_round for r in sampling_schedule([f"c{i}" for i in range(n)], 3, k, seed=1))


def test_the_disk_room_check_counts_the_clients_the_sampler_draws(tmp_path, monkeypatch):
    """The room check's history estimate takes the sampler's count: 4 clients at participation 0.7 train 2 a
    round, so 3 rounds are 3 × (2·12 + 2·4 + 4) = 108 rows (with round(): 3 clients a round, 144 rows)."""
    import edgemask.trainer.simulation as simulation
    from edgemask.trainer.config import TrainConfig

    cfg = TrainConfig.from_dict({"data": {"name": "digits", "num_clients": 4, "samples_per_client": 20},
                                 "model": {"name": "mlp", "args": {"hidden": [8]}},
                                 "training": {"rounds": 3, "participation": 0.7}})
    seen = []
    monkeypatch.setattr(simulation, "check_room", lambda path, shared, one, n, rows, store: seen.append((n, rows)))
    simulation.room_check(cfg, tmp_path / "run")(simulation.build_algorithm(cfg))
    assert seen == [(4, 108)]
    sched = sampling_schedule([f"c{i}" for i in range(4)], 3, 0.7, cfg.run.seed)
    assert [len(r) for r in sched] == [2, 2, 2]


@pytest.mark.parametrize("n", [3, 40])
def test_weighted_average_by_hand_in_chunks(n, monkeypatch):
    import edgemask.trainer.aggregation as agg

    monkeypatch.setattr(agg, "STACK_ELEMENTS", 8)  # 4-element tensors: two clients per chunk
    ts = [torch.full((2, 2), float(i)) for i in range(n)]
    w = [float(i + 1) for i in range(n)]
    expect = sum(i * (i + 1) for i in range(n)) / sum(w)  # Σ w_k x_k / Σ w_k
    assert torch.allclose(weighted_average(ts, w), torch.full((2, 2), expect))


def test_weighted_average_of_rows_of_one_stacked_tensor_reads_them_in_place():
    from edgemask.trainer.aggregation import _as_stacked

    stacked = torch.arange(24, dtype=torch.float32).view(4, 3, 2)  # four clients' (3, 2) tensors, one storage
    rows = list(stacked.unbind(0))
    w = [1.0, 2.0, 3.0, 4.0]
    expect = sum(wk * r for wk, r in zip(w, rows)) / sum(w)
    assert torch.allclose(weighted_average(rows, w), expect)
    view = _as_stacked(rows)
    assert view is not None and view.data_ptr() == stacked.data_ptr() and torch.equal(view, stacked)
    # not one after another (reversed, or every other row): stacked by copying, the same average
    assert _as_stacked(rows[::-1]) is None and _as_stacked(rows[::2]) is None
    assert torch.allclose(weighted_average(rows[::-1], w[::-1]), expect)
    assert _as_stacked([torch.zeros(3, 2), torch.zeros(3, 2)]) is None  # separate storages
    # at the right addresses but laid out otherwise (transposed, flattened), or past the first one's storage
    flat = stacked.view(4, 6)
    assert _as_stacked([rows[0], stacked.view(4, 2, 3)[1].t(), *rows[2:]]) is None  # (3, 2), strides (1, 3)
    assert _as_stacked([rows[0], flat[1], *rows[2:]]) is None
    assert _as_stacked([stacked[3], torch.zeros(3, 2)]) is None
    as_int = stacked.view(torch.int32)  # the same memory read as another dtype
    assert _as_stacked([rows[0], as_int[1], *rows[2:]]) is None
    assert torch.equal(_as_stacked(rows[1:3]), stacked[1:3])
