"""Masks held as bits (trainer.masks: pack_rows / unpack_rows, BitMasks, packed_masked_model): the layout is
np.packbits', a stored client's masks read back exactly, and a masked model from packed bits computes what the
float mask computes, under vmap too."""

import math

import numpy as np
import pytest
import torch

from edgemask.trainer.batched import evaluate_many
from edgemask.trainer.local_training import evaluate
from edgemask.trainer.masks import (THRESHOLD, BitMasks, _least_at_threshold, count_ones, masked_model, pack_bits,
                                    pack_rows, packed_masked_model, sigmoid_at_least, unpack_rows)
from edgemask.trainer.models import build_model, model_sites
from edgemask.trainer.task_functions import ModelSpec, model_context


def test_pack_rows_is_packbits_layout_with_a_padded_last_byte():
    m = torch.tensor([[1, 0, 1, 1, 0, 0, 0, 1, 1]], dtype=torch.float32)  # 9 elements -> 2 bytes
    assert pack_rows(m).tolist() == [0b10110001, 0b10000000]
    g = torch.Generator().manual_seed(0)
    rows = (torch.rand(5, 3, 7, generator=g) < 0.4).float()  # 21 bits a row: 3 bytes, 3 padding bits
    packed = pack_rows(rows, 1)
    assert packed.shape == (5, 3) and packed.dtype == torch.uint8
    for i in range(5):
        assert packed[i].tolist() == pack_bits(rows[i]).tolist() == np.packbits(rows[i].reshape(-1).numpy().astype(
            np.uint8)).tolist()
    assert torch.equal(unpack_rows(packed, (3, 7)), rows)
    assert [count_ones(p) for p in packed] == rows.reshape(5, -1).sum(1).int().tolist()


def test_bit_masks_hold_one_bit_an_element_and_read_back_exactly():
    shapes = {"a": (64, 33), "b": (10,)}
    ones = {"b": torch.ones(10)}
    store = BitMasks(shapes, ones)
    a = (torch.rand(64, 33) < 0.3).float()
    store["c0"] = {"a": a}
    assert set(store["c0"]) == {"a", "b"} and store["c0"]["b"] is ones["b"]  # unstored: the shared tensor
    assert torch.equal(store["c0"]["a"], a) and store["c0"]["a"].dtype == torch.float32
    assert store.nbytes() == (64 * 33 + 7) // 8  # 264 bytes, not 64·33·4
    assert store.count("c0") == int(a.sum()) + 10
    assert "c0" in store and "c1" not in store and list(store) == ["c0"]


def test_unit_liveness_read_from_bits_is_the_unpacked_masks():
    # a CNN's conv2 rows are 16·3·3 = 144 bits (whole bytes: read packed), conv1's 3·3·3 = 27 (unpacked): either
    # way, the live units and the dead layers are those of the float masks
    from edgemask.trainer.models.masking import dead_layers, unit_alive

    model = build_model("cnn", (3, 8, 8), 4, widths=(16, 32))
    sites = model_sites(model)
    shapes = {w: tuple(model.get_parameter(w).shape) for s in sites for w in s.weights}
    torch.manual_seed(0)
    masks = {w: (torch.rand(shape) < 0.02).float() for w, shape in shapes.items()}
    conv2 = next(s for s in sites if math.prod(shapes[s.weights[0]][1:]) % 8 == 0 and s.kind == "conv")
    masks[conv2.weights[0]][3] = 0  # one dead unit in a byte-aligned layer
    masks[conv2.weights[0]][5, -1, -1, -1] = 1  # a unit alive by its last bit only
    store = BitMasks(shapes, {})
    store["c0"] = masks
    for site in sites:
        got, want = store.unit_alive("c0", site), unit_alive(site, masks)
        assert torch.equal(got, want), site.name
    assert not store.unit_alive("c0", conv2)[3] and store.unit_alive("c0", conv2)[5]
    masks[conv2.weights[0]][:] = 0
    store["c0"] = masks
    alive = lambda site: store.unit_alive("c0", site)  # noqa: E731
    assert dead_layers(sites, shapes, alive) == dead_layers(sites, masks) == [conv2.name]


def test_packed_masked_model_computes_the_float_masks_model_alone_and_stacked():
    torch.manual_seed(0)
    model = build_model("cnn", (1, 8, 8), 10)
    spec = ModelSpec.of("cnn", (1, 8, 8), 10, {}, 0)
    ctx = model_context(spec, model)
    sites = model_sites(model)
    weights = {k: v.detach() for k, v in model.named_parameters()}
    buffers = {k: v.detach() for k, v in model.named_buffers()}
    x, y = torch.randn(40, 1, 8, 8), torch.randint(0, 10, (40,))
    floats, packed = [], []
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        masks = {w: (torch.rand(s.mask_shape(weights[w]), generator=g) < 0.5).float() for s in sites
                 for w in s.weights}
        floats.append(masked_model(ctx, weights, masks, buffers))
        packed.append(packed_masked_model(ctx, weights, {w: pack_rows(m) for w, m in masks.items()}, buffers))
    want = [evaluate(m, x, y) for m in floats]
    assert [evaluate(m, x, y) for m in packed] == want
    got = evaluate_many(packed, [(x, y)] * 3)  # stacked: unpacked inside vmap
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert len({a for a, _ in want}) > 1  # the masks matter


def _shift_pack(x, lead):
    """pack_rows' torch formula (the one CUDA runs), written out: the reference for the CPU's numpy path."""
    head = x.shape[:lead]
    flat = x.reshape(*head, -1).to(torch.uint8)
    n = flat.shape[-1]
    if n % 8:
        flat = torch.nn.functional.pad(flat, (0, 8 - n % 8))
    shifts = torch.arange(7, -1, -1, dtype=torch.uint8)
    return (flat.view(*head, -1, 8) << shifts).sum(-1, dtype=torch.uint8)


@pytest.mark.parametrize("shape,lead", [((3, 4, 13), 1), ((2, 3, 3, 7), 1), ((5, 16), 1), ((13,), 0), ((1, 0), 1)])
def test_pack_rows_on_the_cpu_is_the_shift_formula_bit_for_bit(shape, lead):
    bits = torch.rand(shape, generator=torch.Generator().manual_seed(3)) < 0.4
    for x in (bits, bits.float(), bits.to(torch.uint8)):
        got = pack_rows(x, lead)
        assert got.dtype == torch.uint8 and torch.equal(got, _shift_pack(x, lead))
    assert pack_rows(torch.tensor([1, 0, 1, 1, 0, 0, 0, 0, 1], dtype=torch.bool)).tolist() == [0b10110000, 0b10000000]


def test_sigmoid_at_least_is_torchs_sigmoid_compared_at_the_threshold():
    x0 = _least_at_threshold()
    assert -1e-6 < x0 < 0  # σ rounds to 0.5 a little below 0: "scores >= 0" would not be Eq. 3 as torch computes it
    below = float(np.nextafter(np.float32(x0), np.float32(-1)))
    probe = torch.tensor([x0, below, 0.0, -0.0, 1e-30, -1e-30, 3.0, -3.0, float("inf"), float("-inf")])
    wide = torch.cat([probe, torch.randn(100_000) * 1e-6, torch.randn(1000)])
    assert torch.equal(sigmoid_at_least(wide), torch.sigmoid(wide) >= THRESHOLD)
    assert sigmoid_at_least(probe[:2]).tolist() == [True, False]
    doubles = wide.double()  # another dtype: σ is computed
    assert torch.equal(sigmoid_at_least(doubles), torch.sigmoid(doubles) >= THRESHOLD)
