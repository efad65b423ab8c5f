"""Forward FLOPs with masks, exact: zero weights, dead output units and dead input units cost nothing."""

from __future__ import annotations

import torch

import pytest

from edgemask.trainer.accounting import (ForwardFlops, dense_reference, forward_flops, forward_flops_many,
                                forward_flops_split, forward_flops_split_many, kept_counts, layer_positions)
from edgemask.trainer.models import build_model, model_sites
from edgemask.trainer.models.masking import all_ones_masks


def test_a_column_fed_by_a_dead_unit_costs_nothing():
    model = build_model("mlp", (1, 8, 8), 10, hidden=(4, 3))  # 64 -> 4 -> 3 -> 10
    sites = model_sites(model)
    pos = layer_positions(model, sites, torch.zeros(1, 1, 8, 8))
    masks = all_ones_masks(model, sites)
    assert forward_flops(model, sites, masks, pos) == 2 * (64 * 4 + 4 * 3 + 3 * 10)
    masks["fc1.weight"][1] = 0  # fc1 unit 1 dead: its row, and column 1 of fc2, do no work
    masks["fc1.weight"][0, :10] = 0
    assert forward_flops(model, sites, masks, pos) == 2 * (64 * 3 - 10 + 3 * 3 + 3 * 10)
    masks["fc2.weight"][2] = 0  # fc2 unit 2 dead: column 2 of out is free too
    assert forward_flops(model, sites, masks, pos) == 2 * (64 * 3 - 10 + 2 * 3 + 2 * 10)


def test_dead_conv_filters_free_the_next_conv_and_the_head():
    model = build_model("cnn", (1, 8, 8), 10)  # conv1 16×1×3×3 at 8×8, pool, conv2 32×16×3×3 at 4×4, out 10×32
    sites = model_sites(model)
    pos = layer_positions(model, sites, torch.zeros(1, 1, 8, 8))
    assert dict(pos) == {"conv1": 64, "conv2": 16, "out": 1}
    masks = all_ones_masks(model, sites)
    masks["conv1.weight"][:4] = 0
    masks["conv2.weight"][:8] = 0
    expect = 2 * (12 * 9 * 64 + 24 * 12 * 9 * 16 + 10 * 24)
    assert forward_flops(model, sites, masks, pos) == expect
    assert dense_reference(model, sites, pos)["flops_fwd"] == 2 * (16 * 9 * 64 + 32 * 16 * 9 * 16 + 320)


def test_dead_lstm_hidden_units_cost_nothing_anywhere():
    model = build_model("char_lstm", (5,), 7, hidden=4, embed=3, fc=(6,))  # lstm 2 layers, fc1 4->6, out 6->7
    sites = model_sites(model)
    pos = layer_positions(model, sites, torch.zeros(1, 5, dtype=torch.long))
    masks = all_ones_masks(model, sites)
    dense = forward_flops(model, sites, masks, pos)
    assert dense == 2 * 5 * (16 * 3 + 16 * 4 + 16 * 4 + 16 * 4) + 2 * (4 * 6 + 6 * 7)
    for w in ("lstm.weight_ih_l1", "lstm.weight_hh_l1"):  # layer-2 hidden unit 0: g rows zero -> dead
        masks[w][8] = 0
    # layer 2 keeps 3 units: 4 gates × 3 rows × (4 inputs + 3 live recurrent columns); fc1 loses a column
    expect = 2 * 5 * (16 * 3 + 16 * 4 + 12 * 4 + 12 * 3) + 2 * (3 * 6 + 6 * 7)
    assert forward_flops(model, sites, masks, pos) == expect


def test_structured_flops_count_only_whole_dead_units():
    # 64 -> 4 -> 3 -> 10. fc1 unit 1 dead (its row), 10 scattered zeros in fc1 row 0, 1 in fc2 (row 0, column 0).
    model = build_model("mlp", (1, 8, 8), 10, hidden=(4, 3))
    sites = model_sites(model)
    pos = layer_positions(model, sites, torch.zeros(1, 1, 8, 8))
    masks = all_ones_masks(model, sites)
    masks["fc1.weight"][1] = 0
    masks["fc1.weight"][0, :10] = 0
    masks["fc2.weight"][0, 0] = 0
    # element: fc1 3·64 − 10, fc2 3 rows × 3 live columns − 1, out 10 × 3
    # structured: fc1 3 live rows × 64, fc2 3 × 3 (the scattered zero still runs), out 10 × 3
    assert forward_flops_split(model, sites, masks, pos) == ForwardFlops(2 * (182 + 8 + 30), 2 * (192 + 9 + 30))
    masks["fc2.weight"][2] = 0  # fc2 unit 2 dead too: its row and column 2 of out go in both counts
    assert forward_flops_split(model, sites, masks, pos) == ForwardFlops(2 * (182 + 5 + 20), 2 * (192 + 6 + 20))
    dense = 2 * (64 * 4 + 4 * 3 + 3 * 10)
    assert forward_flops_split(model, sites, all_ones_masks(model, sites), pos) == ForwardFlops(dense, dense)


def test_structured_flops_of_conv_filters_and_lstm_units():
    model = build_model("cnn", (1, 8, 8), 10)  # conv1 16×1×3×3 at 8×8, pool, conv2 32×16×3×3 at 4×4, out 10×32
    sites = model_sites(model)
    pos = layer_positions(model, sites, torch.zeros(1, 1, 8, 8))
    masks = all_ones_masks(model, sites)
    masks["conv1.weight"][:4] = 0  # 4 dead filters
    masks["conv2.weight"][:8] = 0  # 8 dead filters
    masks["conv1.weight"][5, 0, 0, 0] = 0  # scattered zeros in live filters over live channels
    masks["conv2.weight"][10, 5, 1, 1] = 0
    structured = 2 * (12 * 9 * 64 + 24 * 12 * 9 * 16 + 10 * 24)
    assert forward_flops_split(model, sites, masks, pos) == ForwardFlops(structured - 2 * (64 + 16), structured)
    lstm = build_model("char_lstm", (5,), 7, hidden=4, embed=3, fc=(6,))
    sites = model_sites(lstm)
    pos = layer_positions(lstm, sites, torch.zeros(1, 5, dtype=torch.long))
    masks = all_ones_masks(lstm, sites)
    for w in ("lstm.weight_ih_l1", "lstm.weight_hh_l1"):  # layer-2 hidden unit 0 dead
        masks[w][8] = 0
    masks["lstm.weight_hh_l0"][0, 0] = 0  # scattered: an i-gate element of a live unit
    # 5 steps × 4 gates × units × (inputs + units): layer 1 4 × (3 + 4), layer 2 3 × (4 + 3); fc1 3 × 6, out 6 × 7
    structured = 2 * 5 * (16 * 7 + 12 * 7) + 2 * (3 * 6 + 6 * 7)
    assert forward_flops_split(lstm, sites, masks, pos) == ForwardFlops(structured - 2 * 5, structured)


MANY = [("mlp", (1, 8, 8), {"hidden": (16, 12)}), ("cnn", (1, 8, 8), {"widths": (4, 6)}),
        ("tiny_mobilenet", (1, 8, 8), {"width": 4, "expand": 2}),  # depthwise convs, batch norm, residuals
        ("char_lstm", (5,), {"hidden": 4, "embed": 3, "fc": (6,)})]  # no vmap rule: one client after another


@pytest.mark.parametrize(("name", "shape", "args"), MANY)
def test_many_clients_at_once_count_what_each_counts_alone(name, shape, args):
    model = build_model(name, shape, 7, **args)
    sites = model_sites(model)
    example = torch.zeros(1, *shape, dtype=torch.long if name == "char_lstm" else torch.float32)
    pos = layer_positions(model, sites, example)
    g = torch.Generator().manual_seed(0)
    masks = []
    for keep in (0.9, 0.6, 0.2, 0.03):  # from nearly dense to most units dead
        m = all_ones_masks(model, sites)
        masks.append({k: (torch.rand(v.shape, generator=g) < keep).float() for k, v in m.items()})
    dead = all_ones_masks(model, sites)
    dead[sites[0].weights[0]][: 2] = 0  # two whole units of the first layer dead: their columns downstream too
    masks += [dead, {}]  # {}: the dense model
    alone = [forward_flops(model, sites, m, pos) for m in masks]
    assert len(set(alone)) == len(alone)  # the cases differ, so a mix-up between clients would show
    assert forward_flops_many(model, sites, masks, pos) == alone
    split = [forward_flops_split(model, sites, m, pos) for m in masks]
    assert forward_flops_split_many(model, sites, masks, pos) == split
    assert all(f.element <= f.structured for f in split)
    assert forward_flops_many(model, sites, masks, pos, memory_budget=1) == alone  # one client per chunk
    assert forward_flops_many(model, sites, [], pos) == []


def test_measuring_positions_leaves_the_model_in_its_mode_so_round_0_trains_in_training_mode():
    # simulate() measures layer positions before round 0; it once left the model in eval mode, so round 0 trained
    # with batch norm's running statistics (never updated) instead of each batch's
    from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
    from edgemask.trainer.data import DataConfig
    from edgemask.trainer.simulation import simulate

    model = build_model("tiny_mobilenet", (1, 8, 8), 10, width=4, expand=2)
    sites = model_sites(model)
    for training in (True, False):
        model.train(training)
        layer_positions(model, sites, torch.zeros(1, 1, 8, 8))
        assert model.training is training
    cfg = TrainConfig(run=RunConfig(seed=0), data=DataConfig(name="digits", num_clients=2, samples_per_client=40),
                      model=ModelConfig("tiny_mobilenet", {"width": 4, "expand": 2}),
                      algorithm=AlgorithmConfig("fedavg"), training=TrainingConfig(rounds=1, batch_size=8))
    bufs = simulate(cfg).algorithm.global_buffers
    means = [v for k, v in bufs.items() if k.endswith("running_mean")]
    assert means and all(v.abs().sum() > 0 for v in means)  # initialized to 0: moved only in training mode


def test_kept_counts_of_many_clients_by_hand():
    rows = torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0, 1.0, 1.0]])  # three clients' masks: rows of one
    masks = [{"a": rows[i], "b": torch.ones(2, 2) * (i % 2)} for i in range(3)]
    masks.append({"a": torch.ones(5)})  # another layout: a group of its own
    assert kept_counts(masks) == [2.0, 1.0 + 4.0, 3.0, 5.0]
    assert kept_counts(masks) == [sum(float(m.sum()) for m in ms.values()) for ms in masks]
    assert kept_counts([]) == []


def test_units_nobody_reads_cost_nothing_as_in_the_compacted_model():
    # #38: export removes a unit whose every outgoing column is zero (the unread-column rule, to a fixed point);
    # the training FLOPs count what the compacted model computes. MLP 64 -> 4 -> 3 -> 10, every unit's row live.
    from edgemask.export.compact import compact
    from edgemask.trainer.models.masking import MaskedModel

    model = build_model("mlp", (1, 8, 8), 10, hidden=(4, 3))
    sites = model_sites(model)
    pos = layer_positions(model, sites, torch.zeros(1, 1, 8, 8))
    masks = all_ones_masks(model, sites)
    masks["out.weight"][:, 0] = 0  # nobody reads fc2 unit 0: it goes
    masks["fc2.weight"][1:, 3] = 0  # fc1 unit 3 is read only by fc2 row 0, which goes: fc1 unit 3 goes too
    # old count (dead rows only): element fc1 4·64 + fc2 (3·4 − 2) + out (10·3 − 10) = 256 + 10 + 20 = 286,
    # structured 256 + 3·4 + 10·3 = 298. What runs: fc1 3 rows × 64 = 192, fc2 rows 1, 2 × fc1 units 0-2 = 6,
    # out 10 × fc2 units 1, 2 = 20: 218 in both counts (no zero is left in what stays)
    assert forward_flops_split(model, sites, masks, pos) == ForwardFlops(2 * 218, 2 * 218)
    kept = compact(MaskedModel(model, sites, masks), torch.zeros(1, 1, 8, 8)).kept_units
    assert kept["fc1"].tolist() == [0, 1, 2] and kept["fc2"].tolist() == [1, 2]  # the compactor agrees

    # a layer nobody reads keeps its first live unit, whose row keeps reading: a second, seeded pass counts it.
    # MLP 64 -> 4 -> 3 -> 3 -> 10: the head reads only fc3 unit 0, which is dead, so fc3 keeps unit 1 (the model's
    # output is its biases: collapsed, yet export writes it)
    model = build_model("mlp", (1, 8, 8), 10, hidden=(4, 3, 3))
    sites = model_sites(model)
    masks = all_ones_masks(model, sites)
    masks["out.weight"][:, 1:] = 0
    masks["fc3.weight"][0] = 0
    masks["fc3.weight"][1, :2] = 0  # fc3 row 1 reads only fc2 unit 2: fc2 units 0, 1 go; fc2 row 2 reads all fc1
    # structured: fc1 4 × 64 + fc2 1 row × 4 + fc3 1 row × 1 + out 10 rows × 1 (fc3 unit 1) = 271; element: the
    # same but out's column over fc3 unit 1, which is zero: 261. The old count: element 256 + 3·4 + 2·3 − 2 + 0,
    # structured 256 + 12 + 2·3 + 0 (the head's rows read only a dead unit; compaction keeps them all the same)
    assert forward_flops_split(model, sites, masks, pos) == ForwardFlops(2 * 261, 2 * 271)
    kept = compact(MaskedModel(model, sites, masks), torch.zeros(1, 1, 8, 8)).kept_units
    assert kept["fc1"].tolist() == [0, 1, 2, 3] and kept["fc2"].tolist() == [2] and kept["fc3"].tolist() == [1]
    assert forward_flops_split_many(model, sites, [masks, {}], pos) == [  # the vmap path hands it on
        ForwardFlops(2 * 261, 2 * 271), forward_flops_split(model, sites, {}, pos)]


def test_conv_filters_nobody_reads_cost_nothing():
    model = build_model("cnn", (1, 8, 8), 10)  # conv1 16×1×3×3 at 8×8, pool, conv2 32×16×3×3 at 4×4, out 10×32
    sites = model_sites(model)
    pos = layer_positions(model, sites, torch.zeros(1, 1, 8, 8))
    masks = all_ones_masks(model, sites)
    masks["conv2.weight"][:, :4] = 0  # conv1 filters 0-3: no conv2 filter reads them
    masks["out.weight"][:, :8] = 0  # conv2 filters 0-7: the head reads none
    # conv1 12 filters × 9 × 64 positions, conv2 24 filters × 12 channels × 9 × 16, out 10 × 24 (no zero stays)
    expect = 2 * (12 * 9 * 64 + 24 * 12 * 9 * 16 + 10 * 24)
    assert forward_flops_split(model, sites, masks, pos) == ForwardFlops(expect, expect)


def test_removed_units_is_the_compactors_rule():
    from edgemask.trainer.models.liveness import removed_units

    t = lambda *b: torch.tensor(b, dtype=torch.bool)  # noqa: E731
    assert removed_units(t(1, 0, 0), t(0, 0, 1)).tolist() == [True, False, True]
    assert removed_units(t(1, 0, 0), t(0, 1, 1)).tolist() == [True, False, True]  # all go: unit 1 stays
    assert removed_units(t(1, 1, 1), t(0, 0, 0)).tolist() == [True, True, True]  # all dead: export refuses
