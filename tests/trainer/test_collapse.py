"""Collapse is said when it happens (issue #38): a client whose masked model has a layer with no live unit and
gives every input the same output is named in one warning line per evaluation and in summary.json's
``collapse``; a dead layer that a residual branch bypasses is no collapse; the digits MLP runs collapse nowhere."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.masks import masked_model, pack_rows
from edgemask.trainer.models.masking import dead_layers
from edgemask.trainer.simulation import CollapseWatch, build_algorithm, output_varies, simulate

# issue #38's case made small: FedMask on tiny_mobilenet (batch norm, depthwise convolutions), the digits config's
# settings with λ_R 10× theirs (0.02), 4 clients of 60 samples: two clients' models have collapsed at round 1,
# all four at round 2 (λ_R = 0.002, the config's, takes 8 rounds of 8 clients: docs/fedmask.md, "Collapse")
DATA = DataConfig(name="digits", num_clients=4, partition="pathological", classes_per_client=2,
                  samples_per_client=60)
TRAINING = TrainingConfig(rounds=2, local_epochs=2, batch_size=16, lr=100.0, momentum=0.9)


def fedmask(lambda_r: float, rounds: int = 2, model: str = "tiny_mobilenet") -> TrainConfig:
    return TrainConfig(run=RunConfig(seed=5, run_id="collapse"), data=DATA, model=ModelConfig(model),
                       algorithm=AlgorithmConfig("fedmask", {"prune_rate": 0.2, "prune_last": 2,
                                                             "lambda_r": lambda_r}),
                       training=TrainingConfig(**{**TRAINING.__dict__, "rounds": rounds}))


def collapse_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if "collapsed" in str(w.message)]


def test_tiny_mobilenet_collapse_is_warned_and_summarized():
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = simulate(fedmask(0.02))
    lines = collapse_warnings(record)
    line = re.compile(r"round (\d): (\d) client\(s\) collapsed \((\d) of 4 now\): (client-00\d)'s model has no "
                      r"live unit in '([\w.]+)'.* gives every test input the same output; it depends on "
                      r"\[algorithm.args\] lambda_r = 0.02, prune_rate = 0.2 \(docs/fedmask.md, \"Collapse\"\)$")
    found = [line.match(w) for w in lines]
    assert lines and all(found), lines
    rounds = [int(m[1]) for m in found]
    assert rounds == sorted(set(rounds)), rounds  # at most one line per evaluation
    assert int(found[-1][3]) == 4  # the last line: every client

    collapse = res.summary["collapse"]
    assert collapse["all_collapsed"] is True
    assert sorted(collapse["clients"]) == res.algorithm.client_ids
    assert collapse["settings"] == {"lambda_r": 0.02, "prune_rate": 0.2}
    sites = [s.name for s in res.algorithm.sites]
    for cid, entry in collapse["clients"].items():
        assert entry["round"] in rounds and entry["layers"] and set(entry["layers"]) <= set(sites)
        assert entry["layers"] == dead_layers(res.algorithm.sites, res.algorithm.eval_masks(cid))
    # the example named in a line is that client's first dead layer then
    assert found[0][5] in sites
    # a constant output: the accuracy of one class on a client with two is at most one half
    assert all(c["accuracy"] <= 0.5 for c in res.summary["clients"].values())


def test_some_clients_collapsed_is_not_all():
    # the same run stopped after its first round: two clients of four have collapsed, two still learn
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = simulate(fedmask(0.02, rounds=1))
    collapse = res.summary["collapse"]
    assert 0 < len(collapse["clients"]) < 4 and collapse["all_collapsed"] is False
    assert len(collapse_warnings(record)) == 1


@pytest.fixture(scope="module")
def algo():
    a = build_algorithm(fedmask(0.02))
    a.model.eval()  # as the loop evaluates
    return a


def ones(algo) -> dict[str, torch.Tensor]:
    return {w: torch.ones(s.mask_shape(algo.global_params[w]), dtype=torch.bool) for s in algo.sites
            for w in s.weights}


def test_dead_layers_by_hand(algo):
    masks = ones(algo)
    assert dead_layers(algo.sites, masks) == []
    masks["block2.project.weight"][:] = False
    masks["stem.weight"][1:] = False  # one unit of the stem lives: not dead
    assert dead_layers(algo.sites, masks) == ["block2.project"]
    masks["stem.weight"][0] = False  # and now that one too
    assert dead_layers(algo.sites, masks) == ["stem", "block2.project"]
    assert dead_layers(algo.sites, {}) == []  # no masks: dense, nothing dead


def watch_on(algo, masks: dict[str, torch.Tensor]) -> tuple[CollapseWatch, list[str]]:
    """A watch over ``algo`` whose every client's mask is ``masks``, after the first round's evaluation."""
    cids = list(algo.client_ids)
    for cid in cids:  # as FedMask holds them: packed bits (the fixture's algorithm is this module's alone)
        algo.local.set_packed(cid, {w: pack_rows(m) for w, m in masks.items()})
    models = [masked_model(algo.model_context, algo.global_params, masks, algo.global_buffers)] * len(cids)
    tests = [(d.test_x, d.test_y) for d in map(algo.dataset.client, cids)]
    watch = CollapseWatch(algo)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        watch.check(0, cids, models, tests)
    return watch, collapse_warnings(record)


def test_a_dead_residual_branch_is_no_collapse(algo):
    # block1 adds its input back (x + project(...)): with project dead the block passes x through unchanged
    masks = ones(algo)
    masks["block1.project.weight"][:] = False
    assert dead_layers(algo.sites, masks) == ["block1.project"]
    x = algo.dataset.client(algo.client_ids[0]).test_x
    assert output_varies(masked_model(algo.model_context, algo.global_params, masks, algo.global_buffers), x)
    watch, lines = watch_on(algo, masks)
    assert lines == [] and watch.summary()["clients"] == {}


def test_a_dead_layer_on_the_only_path_is_a_collapse(algo):
    # block2 is strided, no residual: with project dead the head sees zeros, the logits are its bias for every input
    masks = ones(algo)
    masks["block2.project.weight"][:] = False
    x = algo.dataset.client(algo.client_ids[0]).test_x
    assert output_varies(masked_model(algo.model_context, algo.global_params, masks, algo.global_buffers), x) is False
    watch, lines = watch_on(algo, masks)
    assert len(lines) == 1, lines  # one line for the evaluation, not one per client
    assert lines[0].startswith("round 1: 4 client(s) collapsed (4 of 4 now): client-000's model has no live unit "
                               "in 'block2.project' and gives every test input the same output; it depends on "
                               "[algorithm.args] lambda_r = 0.02, prune_rate = 0.2")
    summary = watch.summary()
    assert summary["all_collapsed"] is True
    assert summary["clients"]["client-003"] == {"round": 1, "layers": ["block2.project"]}
    # a second evaluation that finds no new client says nothing; the round stays the first one's
    cids = list(algo.client_ids)
    models = [masked_model(algo.model_context, algo.global_params, masks, algo.global_buffers)] * len(cids)
    tests = [(d.test_x, d.test_y) for d in map(algo.dataset.client, cids)]
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        watch.check(1, cids, models, tests)
    assert collapse_warnings(record) == [] and watch.summary()["clients"]["client-000"]["round"] == 1


def test_output_varies_needs_two_different_inputs(algo):
    model = masked_model(algo.model_context, algo.global_params, ones(algo), algo.global_buffers)
    x = algo.dataset.client(algo.client_ids[0]).test_x
    assert output_varies(model, x) is True
    assert output_varies(model, x[:1]) is None
    assert output_varies(model, x[:1].expand(4, *x.shape[1:])) is None


def test_no_collapse_on_the_digits_mlp():
    cfg = TrainConfig.load("configs/digits-fedmask.toml")
    cfg = cfg.replace(training=TrainingConfig(**{**cfg.training.__dict__, "rounds": 3}))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = simulate(cfg)
    assert collapse_warnings(record) == []
    assert res.summary["collapse"] == {"clients": {}, "all_collapsed": False,
                                       "settings": {"lambda_r": 0.002, "prune_rate": 0.2}}


def test_an_algorithm_without_masks_never_collapses():
    cfg = TrainConfig(data=DataConfig(num_clients=2, samples_per_client=40), model=ModelConfig("mlp", {"hidden": [8]}),
                      algorithm=AlgorithmConfig("fedavg"), training=TrainingConfig(rounds=1, batch_size=64))
    assert simulate(cfg).summary["collapse"] == {"clients": {}, "all_collapsed": False, "settings": {}}


@pytest.mark.slow
@pytest.mark.parametrize("config", ["configs/digits-fedmask.toml", "cli/configs/demo-fedmask.toml",
                                    "cli/configs/demo-fedavg.toml"])
def test_no_collapse_on_the_demo_runs(config):
    # the runs the demo and the README train, at their full rounds: no warning, no collapsed client
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        res = simulate(TrainConfig.load(config))
    assert collapse_warnings(record) == [] and res.summary["collapse"]["clients"] == {}
