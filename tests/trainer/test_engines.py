"""The engine is chosen once, from ``[training]`` (trainer.engines.engine_for), and is the only thing that says how
clients train: the round loop groups clients by it, evaluates through it, and an algorithm trains outside the rounds
through the one it was built with."""

from __future__ import annotations

import dataclasses
import os
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from torch import nn

from edgemask.trainer.algorithms import ALGORITHMS, Algorithm
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.engines import BatchedEngine, SequentialEngine, engine_for
from edgemask.trainer.local_training import evaluate, local_train
from edgemask.trainer.records import EvalModel
from edgemask.trainer.simulation import build_algorithm, train_clients

from test_batched import _model_task  # a plain model's task


def _cfg(batched: bool) -> TrainConfig:
    return TrainConfig.from_dict({
        "data": {"name": "digits", "num_clients": 3, "samples_per_client": 40},
        "model": {"name": "mlp", "args": {"hidden": [6, 4]}},
        "algorithm": {"name": "fedavg"},
        "training": {"rounds": 1, "lr": 0.1, "batched": batched},
    })


def test_the_config_chooses_the_engine_and_the_engine_the_groups():
    seq, bat = engine_for(_cfg(False).training), engine_for(_cfg(True).training)
    assert type(seq) is SequentialEngine and not seq.together
    assert type(bat) is BatchedEngine and bat.together and bat.device == "cpu"
    assert seq.groups(["a", "b", "c"]) == [["a"], ["b"], ["c"]]  # a client's every phase before the next
    assert bat.groups(["a", "b", "c"]) == [["a", "b", "c"]]
    assert type(build_algorithm(_cfg(False)).engine) is SequentialEngine
    assert type(build_algorithm(_cfg(True)).engine) is BatchedEngine


def test_both_engines_evaluate_as_the_reference():
    """Two clients' models on their own test splits: the batched engine's scores are the one-by-one ones."""
    algo = build_algorithm(_cfg(True))
    data = [(d.test_x, d.test_y) for d in map(algo.dataset.client, algo.client_ids[:2])]
    shifted = {k: v + 0.1 for k, v in algo.global_params.items()}
    models = [EvalModel(algo.global_params, algo.global_buffers, algo.model_context.call),
              EvalModel(shifted, algo.global_buffers, algo.model_context.call)]
    ref = [evaluate(m, x, y) for m, (x, y) in zip(models, data)]
    assert SequentialEngine().evaluate(models, data) == ref
    got = BatchedEngine().evaluate(models, data)
    assert [a for a, _ in got] == [a for a, _ in ref]  # the same correct predictions
    assert [lo for _, lo in got] == pytest.approx([lo for _, lo in ref], rel=1e-6)
    assert ref[0] != ref[1]  # two different models: a mixed-up order would show


def test_the_round_loop_trains_through_the_algorithms_engine():
    """train_clients asks the algorithm's engine for its groups and its training: an engine that records the
    calls sees one call per client (sequential) and the same results as the engine itself gives."""
    calls = []

    class Recording(SequentialEngine):
        def train(self, tasks, data, orders, batch_size, momentum=0.0, weight_decay=0.0):
            calls.append(len(tasks))
            return super().train(tasks, data, orders, batch_size, momentum, weight_decay)

    cfg = _cfg(False)
    algo = build_algorithm(cfg, Recording())
    got = train_clients(algo, list(algo.client_ids), 0)
    assert calls == [1, 1, 1]
    ref = train_clients(build_algorithm(cfg), list(algo.client_ids), 0)
    for (cid, a), (cid2, b) in zip(got, ref):
        assert cid == cid2 and all(torch.equal(a.trained[k], b.trained[k]) for k in a.trained)


@contextmanager
def _threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _bits_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one core: the kernels sum in one order anyway")
def test_the_sequential_engine_steps_on_one_thread_as_a_flower_node():
    """Issue #45: a convolution's weight gradient is summed across threads in chunks of the minibatch, so a step's
    bits depend on the thread count. A Flower node of the simulation engine trains on one torch thread; the
    sequential engine does too (it restores the caller's count after), so a device's step is the same bits in
    ``--sequential`` and on a node, on any host's number of cores."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 16 * 16, 4))
    task = _model_task(model, lr=0.5)
    x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 4, (32,))
    orders = [np.random.default_rng(0).permutation(32)]
    with _threads(1):
        node = local_train(task, x, y, orders, 16, momentum=0.9)  # a node's step (one thread)
    with _threads(2):
        many = local_train(task, x, y, orders, 16, momentum=0.9)
        if _bits_equal(many.trained, node.trained):
            pytest.skip("this host's kernels give the same bits on one thread and two: nothing to tell apart")
        (got,) = SequentialEngine().train([task], [(x, y)], [orders], 16, momentum=0.9)
        assert torch.get_num_threads() == 2  # the caller's count, restored
    assert _bits_equal(got.trained, node.trained)
    assert got.loss == node.loss


def test_an_algorithm_built_without_an_engine_says_how_to_get_one():
    cfg = _cfg(True)
    algo = ALGORITHMS.get("fedavg")(cfg, build_dataset(cfg.data, cfg.run.seed))
    with pytest.raises(RuntimeError, match=r"built without an engine.*engine_for\(cfg.training\)"):
        train_clients(algo, list(algo.client_ids), 0)


def test_asking_for_cuda_without_it_warns_once_when_the_engine_is_chosen():
    t = dataclasses.replace(_cfg(True).training, device="cuda")
    with pytest.warns(RuntimeWarning) if not torch.cuda.is_available() else _no_warning():
        engine = engine_for(t)
    assert engine.device == "cuda"  # as asked: the batched engine resolves it to the CPU when there is none


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_algorithm_base_class_is_its_hooks():
    """Issue 31: ``Algorithm``'s public members are its hooks and its class settings (``name``, ``Args``,
    ``uploads_alone``), nothing else; helpers are free functions in the modules they belong to (accounting,
    aggregation, masks)."""
    public = {n for n in dir(Algorithm) if not n.startswith("_")}
    assert public == {"name", "Args", "setup", "round_clients", "local_task", "next_phases", "client_updates",
                      "aggregate", "eval_models", "eval_masks", "train_masks", "client_state", "shared_state",
                      "finetune_task", "finetune_result", "backward_flops", "summary_extra", "client_state_bytes",
                      "dead_layers", "device_task", "trained_fraction", "setup_bytes", "uploads_alone"}
