"""The batched engine's results are plain dicts of views of its stacked tensors' rows (trainer.batched._rows): the
server's average reads consecutive rows as the one tensor they lie in (trainer.aggregation.stack_rows, no copy),
and gets what it gets from any other dicts."""

from __future__ import annotations

import pytest
import torch

from edgemask.trainer.aggregation import stack_rows
from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.batched import _rows, local_train_batched
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.records import LocalResult
from edgemask.trainer.sampling import batch_orders


def _fedavg(clients: int = 4):
    cfg = TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": clients, "samples_per_client": 40},
        "model": {"name": "mlp", "args": {"hidden": [6, 4]}},
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 2, "lr": 0.1},
    })
    algo = ALGORITHMS.get("fedavg")(cfg, build_dataset(cfg.data, cfg.run.seed))
    algo.setup()
    return algo


def _stacked(algo, counts: list[int], buffers: list[dict] | None = None) -> list[tuple[str, LocalResult]]:
    """Hand-made results: client i's every tensor filled with i + 1, as rows of one stack (as the engine's)."""
    C = len(counts)
    stack = {k: torch.stack([torch.full_like(v, i + 1.0) for i in range(C)]) for k, v in algo.global_params.items()}
    buffers = buffers or [{} for _ in range(C)]
    return [(cid, LocalResult(tr, bu, 0.0, n, n))
            for cid, tr, bu, n in zip(algo.client_ids, _rows(stack, C), buffers, counts)]


def test_rows_are_views_of_the_stack_read_back_without_a_copy():
    stack = {"w": torch.arange(12.0).view(3, 2, 2), "b": torch.arange(6.0).view(3, 2)}
    rows = _rows(stack, 3)
    assert [list(r) for r in rows] == [["w", "b"]] * 3
    assert torch.equal(rows[1]["w"], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    assert rows[1]["w"].data_ptr() == stack["w"][1].data_ptr()  # a view: nothing copied
    again = stack_rows([r["w"] for r in rows])
    assert again.data_ptr() == stack["w"].data_ptr() and torch.equal(again, stack["w"])  # the stack itself
    assert _rows({}, 2) == [{}, {}]


def test_fedavg_averages_the_rows_by_hand():
    """Clients hold 1, 2, 3, 4 everywhere, with 10, 20, 30, 40 samples: Σ n_k x_k / Σ n_k = 3 everywhere."""
    algo = _fedavg()
    updates = algo.client_updates(0, _stacked(algo, [10, 20, 30, 40]))
    dense = sum(v.nbytes for v in algo.global_params.values())
    assert [u.bytes_up for u in updates] == [dense] * 4
    algo.aggregate(0, updates)
    for k, v in algo.global_params.items():
        assert torch.allclose(v, torch.full_like(v, 3.0)), k


def test_buffers_after_the_rows_are_averaged():
    """Batch-norm style buffers travel with the rows: clients hold n = 0, 10, 20, 30 with 10, 20, 30, 40
    samples, so the buffer's mean is (0·10 + 10·20 + 20·30 + 30·40) / 100 = 20; the weights' mean is 3 as above.
    Each upload costs its weights and its buffer."""
    algo = _fedavg()
    algo.global_buffers = {"n": torch.zeros(2)}
    results = _stacked(algo, [10, 20, 30, 40], [{"n": torch.full((2,), 10.0 * i)} for i in range(4)])
    updates = algo.client_updates(0, results)
    dense = sum(v.nbytes for v in algo.global_params.values())
    assert [u.bytes_up for u in updates] == [dense + 8] * 4
    algo.aggregate(0, updates)
    assert torch.equal(algo.global_buffers["n"], torch.full((2,), 20.0))
    for k, v in algo.global_params.items():
        assert torch.allclose(v, torch.full_like(v, 3.0)), k


def test_a_changed_upload_is_averaged_as_changed():
    """An algorithm may change an upload (FedNova adds to it); the server averages it with the change, and the
    unchanged rows give bit for bit what separate tensors give."""
    algo, ref = _fedavg(), _fedavg()
    updates = algo.client_updates(0, _stacked(algo, [1, 1, 1, 1]))
    ref_updates = ref.client_updates(0, _stacked(ref, [1] * 4))
    for u in ref_updates:  # separate tensors, not rows of one stack
        u.payload = {k: v.clone() for k, v in u.payload.items()}
    k = next(iter(algo.global_params))
    algo.aggregate(0, updates)
    ref.aggregate(0, ref_updates)
    assert all(torch.equal(algo.global_params[n], ref.global_params[n]) for n in algo.global_params)
    changed = _fedavg()
    ups = changed.client_updates(0, _stacked(changed, [1, 1, 1, 1]))
    ups[0].payload[k] = ups[0].payload[k] + 4.0  # client 0 now uploads 5: the mean is (5 + 2 + 3 + 4) / 4
    changed.aggregate(0, ups)
    assert torch.allclose(changed.global_params[k], torch.full_like(changed.global_params[k], 3.5))


@pytest.mark.parametrize("order", ["in order", "reversed"])
def test_uploads_not_in_the_stacks_order_are_averaged_from_their_rows(order):
    algo = _fedavg()
    results = _stacked(algo, [10, 20, 30, 40])
    if order == "reversed":
        results = results[::-1]
    algo.aggregate(0, algo.client_updates(0, results))
    for v in algo.global_params.values():
        assert torch.allclose(v, torch.full_like(v, 3.0))


def test_the_batched_loop_hands_back_rows_of_one_stack():
    algo = _fedavg()
    cids = list(algo.client_ids)
    tasks = [algo.local_task(cid, 0) for cid in cids]
    data = [algo.dataset.client(cid) for cid in cids]
    orders = batch_orders([d.num_train for d in data], [1] * len(cids), 0, 0, range(len(cids)))
    got = local_train_batched(tasks, [(d.train_x, d.train_y) for d in data], orders, 8)
    for k in got[0].trained:
        rows = [r.trained[k] for r in got]
        stacked = stack_rows(rows)
        assert stacked.data_ptr() == rows[0].data_ptr()  # consecutive rows of one tensor: read as it lies
        assert all(torch.equal(stacked[i], rows[i]) for i in range(len(cids)))
