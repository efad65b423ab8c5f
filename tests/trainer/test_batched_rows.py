"""trainer.batched_rows: the batched loop's results and FedAvg's uploads stay rows of one stack until their
dicts are read; the server then averages the stack itself, and gets what it gets from the dicts."""

from __future__ import annotations

import pytest
import torch

from trainer.algorithms import ALGORITHMS
from trainer.batched import local_train_batched
from trainer.batched_rows import Row, StackedRows, stacked_uploads
from trainer.config import TrainConfig
from trainer.data import build_dataset
from trainer.records import LocalResult
from trainer.sampling import batch_orders


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


def _rows(algo, counts: list[int]) -> list[tuple[str, LocalResult]]:
    """Hand-made results: client i's every tensor filled with i + 1, as rows of one stack."""
    C = len(counts)
    stack = StackedRows({k: torch.stack([torch.full_like(v, i + 1.0) for i in range(C)])
                         for k, v in algo.global_params.items()}, C)
    return [(cid, LocalResult(Row(stack, i), {}, 0.0, n, n)) for i, (cid, n) in enumerate(zip(algo.client_ids,
                                                                                              counts))]


def test_a_row_is_made_once_into_views_of_the_stack():
    stack = StackedRows({"w": torch.arange(12.0).view(3, 2, 2), "b": torch.arange(6.0).view(3, 2)}, 3)
    assert stack.row_bytes == (4 + 2) * 4  # one client's float32 tensors on the wire
    res = LocalResult(Row(stack, 1), {"n": torch.tensor(5)}, 0.5, 8, 8)
    assert res.row() is not None
    trained = res.trained
    assert res.row() is None and res.trained is trained  # made once, then the dict
    assert list(trained) == ["w", "b"] and torch.equal(trained["w"], stack.tensors["w"][1])
    assert trained["w"].data_ptr() == stack.tensors["w"][1].data_ptr()  # a view: nothing copied
    assert Row(stack, 1, {"n": torch.tensor(5)}).made().keys() == {"w", "b", "n"}


def test_fedavg_averages_the_stack_itself_by_hand():
    """Clients hold 1, 2, 3, 4 everywhere, with 10, 20, 30, 40 samples: Σ n_k x_k / Σ n_k = 3 everywhere."""
    algo = _fedavg()
    results = _rows(algo, [10, 20, 30, 40])
    updates = algo.client_updates(0, results)
    assert stacked_uploads(updates) is results[0][1].row().stack  # nothing was read: the server reads the stack
    dense = sum(v.nbytes for v in algo.global_params.values())
    assert [u.bytes_up for u in updates] == [dense] * 4
    algo.aggregate(0, updates)
    for k, v in algo.global_params.items():
        assert torch.allclose(v, torch.full_like(v, 3.0)), k


def test_buffers_after_the_rows_are_averaged_without_making_a_payload():
    """Batch-norm style buffers travel after the rows: clients hold n = 0, 10, 20, 30 with 10, 20, 30, 40
    samples, so the buffer's mean is (0·10 + 10·20 + 20·30 + 30·40) / 100 = 20; the weights' mean is 3 as above,
    read from the stack, and no upload is made into a dict. Each upload costs its weights and its buffer."""
    algo = _fedavg()
    algo.global_buffers = {"n": torch.zeros(2)}
    results = [(cid, LocalResult(Row(r.row().stack, r.row().index), {"n": torch.full((2,), 10.0 * i)}, 0.0, n, n))
               for i, (cid, r), n in zip(range(4), _rows(algo, [10, 20, 30, 40]), [10, 20, 30, 40])]
    updates = algo.client_updates(0, results)
    dense = sum(v.nbytes for v in algo.global_params.values())
    assert [u.bytes_up for u in updates] == [dense + 8] * 4
    assert stacked_uploads(updates) is results[0][1].row().stack
    algo.aggregate(0, updates)
    assert all(u.row() is not None for u in updates)  # nothing was made: the server read the stack and the rests
    assert torch.equal(algo.global_buffers["n"], torch.full((2,), 20.0))
    for k, v in algo.global_params.items():
        assert torch.allclose(v, torch.full_like(v, 3.0)), k


def test_a_read_and_changed_upload_is_averaged_as_changed():
    """Reading a payload makes it a dict the algorithm may change (FedNova adds to it); the server then averages
    the dicts, with the change, bit for bit what the stack gives when nothing changed."""
    algo, ref = _fedavg(), _fedavg()
    updates, ref_updates = algo.client_updates(0, _rows(algo, [1, 1, 1, 1])), ref.client_updates(0, _rows(ref, [1] * 4))
    for u in ref_updates:
        u.payload  # read: the dicts' path
    assert stacked_uploads(ref_updates) is None
    k = next(iter(algo.global_params))
    algo.aggregate(0, updates)
    ref.aggregate(0, ref_updates)
    assert all(torch.equal(algo.global_params[n], ref.global_params[n]) for n in algo.global_params)
    changed = _fedavg()
    ups = changed.client_updates(0, _rows(changed, [1, 1, 1, 1]))
    ups[0].payload[k] = ups[0].payload[k] + 4.0  # client 0 now uploads 5: the mean is (5 + 2 + 3 + 4) / 4
    assert stacked_uploads(ups) is None
    changed.aggregate(0, ups)
    assert torch.allclose(changed.global_params[k], torch.full_like(changed.global_params[k], 3.5))


@pytest.mark.parametrize("order", ["in order", "reversed"])
def test_uploads_not_in_the_stacks_order_are_averaged_from_their_rows(order):
    algo = _fedavg()
    results = _rows(algo, [10, 20, 30, 40])
    if order == "reversed":
        results = results[::-1]
    updates = algo.client_updates(0, results)
    assert (stacked_uploads(updates) is None) == (order == "reversed")
    algo.aggregate(0, updates)
    for v in algo.global_params.values():
        assert torch.allclose(v, torch.full_like(v, 3.0))


def test_the_batched_loop_hands_back_rows_equal_to_their_dicts():
    algo = _fedavg()
    cids = list(algo.client_ids)
    tasks = [algo.local_task(cid, 0) for cid in cids]
    data = [algo.client_data(cid) for cid in cids]
    orders = batch_orders([d.num_train for d in data], [1] * len(cids), 0, 0, range(len(cids)))
    got = local_train_batched(tasks, [(d.train_x, d.train_y) for d in data], orders, 8)
    stack = got[0].row().stack
    assert [r.row().index for r in got] == list(range(len(cids))) and all(r.row().stack is stack for r in got)
    for i, r in enumerate(got):
        for k, v in r.trained.items():
            assert torch.equal(v, stack.tensors[k][i])
