"""The engine is chosen once, from ``[training]`` (trainer.engines.engine_for), and is the only thing that says how
clients train: the round loop groups clients by it, evaluates through it, and an algorithm trains outside the rounds
through the one it was built with."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edgemask.trainer.algorithms import ALGORITHMS, Algorithm
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.engines import BatchedEngine, SequentialEngine, engine_for
from edgemask.trainer.local_training import evaluate
from edgemask.trainer.records import EvalModel
from edgemask.trainer.simulation import build_algorithm, train_clients


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
    """Issue 31: ``Algorithm``'s public members are its hooks and its two class settings, nothing else; helpers are
    free functions in the modules they belong to (accounting, aggregation, masks)."""
    public = {n for n in dir(Algorithm) if not n.startswith("_")}
    assert public == {"name", "Args", "setup", "round_clients", "local_task", "next_phases", "client_updates",
                      "aggregate", "eval_models", "eval_masks", "train_masks", "client_state", "shared_state",
                      "finetune_task", "finetune_result", "backward_flops", "summary_extra", "client_state_bytes",
                      "dead_layers", "device_task", "trained_fraction", "setup_bytes"}
