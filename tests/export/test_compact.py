"""Compaction: compacted output equals masked output, with fewer parameters, on every model and hard case."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgemask.export.compact import AllDeadLayerError, UnsupportedLayerError, compact, count_flops
from edgemask.export.verify import VerificationError, verify_compaction
from export_helpers import MODEL_CASES, masked_case, random_masks, randomize_norms, sample_input
from edgemask.trainer.models import MaskedModel, build_model, model_sites
from edgemask.trainer.models.masking import all_ones_masks


def _max_diff(a, b) -> float:
    return float((a - b).detach().abs().max())


@pytest.mark.parametrize("name", sorted(MODEL_CASES))
@pytest.mark.parametrize("seed", [1, 2])
def test_every_model_compacts_exactly(name, seed):
    masked = masked_case(name, kill=0.4, seed=seed)
    x = sample_input(name, 8, seed)
    res = compact(masked, x[:1])
    with torch.no_grad():
        assert _max_diff(res.module(x), masked(x)) <= 1e-5
    assert res.params_compacted < res.params_dense
    assert res.flops_compacted < res.flops_dense
    assert any(s.kept < s.total for s in res.layers)
    assert verify_compaction(masked, res, x) <= 1e-5
    # the network's final outputs are never removed
    out = [s for s in res.layers if s.name == "out"][0]
    assert out.kept == out.total


def test_compaction_leaves_the_masked_model_untouched():
    masked = masked_case("resnet18")
    before = {k: v.clone() for k, v in masked.base.state_dict().items()}
    compact(masked, sample_input("resnet18", 1))
    assert all(torch.equal(before[k], v) for k, v in masked.base.state_dict().items())


class Block(nn.Module):
    """conv1 -> bn1, plus a projection shortcut (sconv -> sbn), added; then a head."""

    norm_after = {"conv1": "bn1", "sconv": "sbn"}
    head = ("out",)

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.conv1 = nn.Conv2d(4, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.sconv = nn.Conv2d(4, 8, 1)
        self.sbn = nn.BatchNorm2d(8)
        self.out = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        y = torch.relu(self.bn1(self.conv1(x)) + self.sbn(self.sconv(x)))
        return self.out(y.mean(dim=(2, 3)))


def _kill(model, masks, layer, units):
    for u in units:
        masks[f"{layer}.weight"][u] = 0


def test_residual_keeps_the_union_of_live_channels():
    torch.manual_seed(0)
    model = Block().eval()
    randomize_norms(model)
    sites = model_sites(model)
    masks = {k: v for k, v in all_ones_masks(model, sites).items() if not k.startswith("out")}
    _kill(model, masks, "conv1", [3, 5])  # conv1 kills 3 and 5
    _kill(model, masks, "sconv", [5])  # the shortcut keeps 3, kills 5
    masked = MaskedModel(model, sites, masks)
    x = torch.randn(4, 3, 6, 6)
    res = compact(masked, x[:1])
    kept = {s.name: s.kept for s in res.layers}
    assert kept["conv1"] == kept["sconv"] == 7  # 3 stays (live in the shortcut), 5 goes
    assert res.kept_units["conv1"].tolist() == [0, 1, 2, 3, 4, 6, 7]
    assert _max_diff(res.module(x), masked(x)) <= 1e-5
    # the wrong rule (remove by one layer's dead set) would change the output: check that it matters here
    assert float(masked.baked().sbn(masked.baked().sconv(torch.relu(model.stem(x))))[:, 3].abs().max()) > 0


def test_two_layer_lstm_with_different_dead_sets():
    masked = masked_case("char_lstm", kill=0.0)
    h = masked.base.lstm.hidden_size
    for layer, dead in ((0, [0, 1, 2, 3, 4]), (1, [7, 9])):
        for k in ("ih", "hh"):
            masked.masks[f"lstm.weight_{k}_l{layer}"][2 * h: 3 * h][dead] = 0
    x = sample_input("char_lstm", 6)
    res = compact(masked, x[:1])
    kept = {s.name: (s.kept, s.total) for s in res.layers}
    assert kept["lstm.layer0"] == (h - 5, h) and kept["lstm.layer1"] == (h - 2, h)
    assert res.module.lstm.layer0.hidden_size == h - 5 and res.module.lstm.layer1.input_size == h - 5
    assert res.module.fc1.in_features == h - 2
    assert _max_diff(res.module(x), masked(x)) <= 1e-5


def test_depthwise_dead_outputs_go_even_where_expand_is_alive():
    masked = masked_case("tiny_mobilenet", kill=0.0)
    masked.masks["block1.dw.weight"][[1, 4, 9]] = 0  # depthwise filters dead; expand conv fully alive
    x = sample_input("tiny_mobilenet", 4)
    res = compact(masked, x[:1])
    kept = {s.name: s.kept for s in res.layers}
    assert kept["block1.dw"] == 29 and kept["block1.expand"] == 29
    assert res.module.block1.dw.groups == 29
    assert _max_diff(res.module(x), masked(x)) <= 1e-5


def test_all_dead_layer_is_a_clear_error():
    masked = masked_case("mlp", kill=0.0)
    masked.masks["fc2.weight"].zero_()
    with pytest.raises(AllDeadLayerError, match="fc2"):
        compact(masked, sample_input("mlp", 1))


def test_dead_conv_with_batch_norm_shift_outputs_zero_and_compacts():
    masked = masked_case("vgg16", kill=0.0)
    masked.masks["conv2.weight"][[0, 2]] = 0
    bn = masked.base.bn2
    assert float(bn.bias[0]) != 0 and float(bn.running_mean[0]) != 0  # β and μ would leak if not gated
    x = sample_input("vgg16", 2)
    acts = {}
    masked.base.bn2.register_forward_hook(lambda m, i, o: acts.__setitem__("bn2", o))
    with torch.no_grad():
        masked(x)
    assert torch.equal(acts["bn2"][:, [0, 2]], torch.zeros_like(acts["bn2"][:, [0, 2]]))
    res = compact(masked, x[:1])
    assert {s.name: s.kept for s in res.layers}["conv2"] == 2
    assert _max_diff(res.module(x), masked(x)) <= 1e-5


def test_grouped_conv_is_refused():
    class G(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, groups=2)
            self.out = nn.Linear(8, 2)

        def forward(self, x):
            return self.out(self.conv(x).mean(dim=(2, 3)))

    m = G().eval()
    masked = MaskedModel(m, model_sites(m), {})
    with pytest.raises(UnsupportedLayerError, match="grouped"):
        compact(masked, torch.randn(1, 4, 5, 5))


def test_verification_names_the_first_layer_that_parts():
    masked = masked_case("fedpews_cnn")
    x = sample_input("fedpews_cnn", 4)
    res = compact(masked, x[:1])
    with torch.no_grad():
        res.module.conv2.bias[0] += 0.5
    with pytest.raises(VerificationError, match="conv2"):
        verify_compaction(masked, res, x)


def test_verification_names_the_first_layer_that_gives_nan():
    # NaN compares false with everything: a check written `d > limit` would pass it by
    masked = masked_case("fedpews_cnn")
    x = sample_input("fedpews_cnn", 4)
    res = compact(masked, x[:1])
    with torch.no_grad():
        res.module.conv2.bias[0] = float("nan")
    with pytest.raises(VerificationError, match="by nan where the limit there is .* first at layer 'conv2'"):
        verify_compaction(masked, res, x)


def test_flop_counter_by_hand():
    m = nn.Sequential()
    m.add_module("conv", nn.Conv2d(2, 3, 3, padding=1))  # 3·8·8 outputs × 2·3·3 MACs = 3456
    m.add_module("flat", nn.Flatten())
    m.add_module("fc", nn.Linear(192, 4))  # 4 × 192 = 768
    assert count_flops(m, (torch.randn(1, 2, 8, 8),)) == 2 * (3456 + 768)
    lstm = nn.LSTM(5, 7, num_layers=2, batch_first=True)  # 10 steps × 4·7·(5+7) + 10 × 4·7·(7+7)
    assert count_flops(lstm, (torch.randn(1, 10, 5),)) == 2 * (10 * 4 * 7 * 12 + 10 * 4 * 7 * 14)


# -- the column rule: a unit no consumer reads goes, whatever its row and bias ------------------------------

def _ones_case(model: nn.Module) -> MaskedModel:
    """``model`` with all-ones masks on every layer, the head included (FedMask masks and prunes it), and
    non-zero biases (a removed unit's bias must not matter)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Linear, nn.Conv2d)) and m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape))
    sites = model_sites(model)
    return MaskedModel(model, sites, all_ones_masks(model, sites))


def test_unit_read_by_no_consumer_is_removed_with_its_row_alive():
    torch.manual_seed(0)
    masked = _ones_case(build_model("mlp", (64,), 10).eval())  # 64-128-64-10
    masked.masks["fc2.weight"][:, 5] = 0  # fc1's unit 5: row and bias live, never read by fc2 (its only consumer)
    assert float(masked.base.fc1.bias[5].detach()) != 0 and bool(masked.baked().fc1.weight[5].ne(0).all())
    x = sample_input("mlp", 8)
    res = compact(masked, x[:1])
    assert res.kept_units["fc1"].tolist() == [u for u in range(128) if u != 5]
    assert res.module.fc1.out_features == 127 and res.module.fc2.in_features == 127
    # fc1's row (64 weights + 1 bias) and fc2's column (64 weights); MACs 64 (fc1) + 64 (fc2), FLOPs = 2 x MACs
    assert res.params_dense - res.params_compacted == 64 + 1 + 64
    assert res.flops_dense - res.flops_compacted == 2 * (64 + 64)
    assert _max_diff(res.module(x), masked(x)) <= 1e-5
    assert verify_compaction(masked, res, x) <= 1e-5


def test_rows_a_removal_drops_leave_their_inputs_unread():
    """The head's column k is dead, so fc2's unit k goes; fc1's unit j is read only by that row of fc2, so it
    goes too (the rule runs to a fixed point)."""
    torch.manual_seed(0)
    masked = _ones_case(build_model("mlp", (64,), 10).eval())
    j, k = 7, 3
    masked.masks["out.weight"][:, k] = 0
    masked.masks["fc2.weight"][:, j] = 0
    masked.masks["fc2.weight"][k, j] = 1
    x = sample_input("mlp", 8)
    res = compact(masked, x[:1])
    assert {s.name: s.kept for s in res.layers} == {"fc1": 127, "fc2": 63, "out": 10}
    # fc1 row j (64 + 1); fc2 column j (64) and row k (128 + 1), sharing one element; the head's column k (10)
    assert res.params_dense - res.params_compacted == 65 + 64 + 129 - 1 + 10
    # MACs: fc1 64, fc2 128·64 − 127·63 = 191, out 10
    assert res.flops_dense - res.flops_compacted == 2 * (64 + 191 + 10)
    assert _max_diff(res.module(x), masked(x)) <= 1e-5
    assert verify_compaction(masked, res, x) <= 1e-5


def test_unit_read_by_one_consumer_of_two_stays():
    torch.manual_seed(0)
    model = Block().eval()
    randomize_norms(model)
    x = torch.randn(4, 3, 6, 6)
    masked = _ones_case(model)
    full = compact(masked, x[:1])  # nothing to remove; batch norm folded
    masked.masks["conv1.weight"][:, 2] = 0  # the stem's channel 2: unread by conv1, read by the shortcut
    res = compact(masked, x[:1])
    assert {s.name: s.kept for s in res.layers}["stem"] == 4
    assert res.params_compacted == full.params_compacted
    assert _max_diff(res.module(x), masked(x)) <= 1e-5

    masked.masks["sconv.weight"][:, 2] = 0  # now unread by both consumers: it goes
    res = compact(masked, x[:1])
    assert res.kept_units["stem"].tolist() == [0, 1, 3]
    assert res.module.conv1.in_channels == res.module.sconv.in_channels == 3
    # stem filter (3·3·3 + 1), conv1's input channel (8 filters × 3·3), the shortcut's (8 × 1)
    assert full.params_compacted - res.params_compacted == 28 + 72 + 8
    # per output pixel (6×6 = 36): stem 27 MACs, conv1 8·9, sconv 8
    assert full.flops_compacted - res.flops_compacted == 2 * 36 * (27 + 72 + 8)
    assert _max_diff(res.module(x), masked(x)) <= 1e-5
    assert verify_compaction(masked, res, x) <= 1e-5


class IdentityBlock(nn.Module):
    """stem -> ReLU -> h; z = ReLU(conv2(ReLU(conv1(h))) + h): h's channels feed conv1 and the residual add."""

    head = ("out",)

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.out = nn.Linear(4, 5)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        z = torch.relu(self.conv2(torch.relu(self.conv1(h))) + h)
        return self.out(z.mean(dim=(2, 3)))


def test_unit_feeding_a_residual_add_stays_until_the_sum_is_unread():
    torch.manual_seed(0)
    masked = _ones_case(IdentityBlock().eval())
    x = torch.randn(4, 3, 6, 6)
    masked.masks["conv1.weight"][:, 1] = 0  # unread by conv1, but added into z, which the head reads
    res = compact(masked, x[:1])
    assert res.params_compacted == res.params_dense
    assert _max_diff(res.module(x), masked(x)) <= 1e-5

    masked.masks["conv1.weight"][:, 1] = 1
    masked.masks["out.weight"][:, 1] = 0  # the sum's channel 1 is unread, but conv1 still reads h's channel 1
    res = compact(masked, x[:1])
    assert res.params_compacted == res.params_dense

    masked.masks["conv1.weight"][:, 1] = 0  # unread everywhere: stem and conv2 lose channel 1 together
    res = compact(masked, x[:1])
    assert res.kept_units["stem"].tolist() == res.kept_units["conv2"].tolist() == [0, 2, 3]
    assert res.module.conv1.in_channels == 3
    assert _max_diff(res.module(x), masked(x)) <= 1e-5
    assert verify_compaction(masked, res, x) <= 1e-5


def test_channel_unread_after_a_depthwise_conv_goes_with_its_expand_channel():
    """project reads no input channel 3 or 10: the depthwise conv's channels go, and the expand conv's, which
    feed only them; their batch-norm shifts (constant outputs) never reach the output either."""
    masked = masked_case("tiny_mobilenet", kill=0.0)
    masked.masks["block1.project.weight"][:, [3, 10]] = 0
    x = sample_input("tiny_mobilenet", 4)
    res = compact(masked, x[:1])
    kept = {s.name: s.kept for s in res.layers}
    assert kept["block1.dw"] == kept["block1.expand"] == 30
    assert 3 not in res.kept_units["block1.expand"].tolist() and 10 not in res.kept_units["block1.dw"].tolist()
    assert res.module.block1.project.in_channels == 30
    assert _max_diff(res.module(x), masked(x)) <= 1e-5
    assert verify_compaction(masked, res, x) <= 1e-5


def test_conv_channel_goes_only_when_every_flattened_position_is_unread():
    torch.manual_seed(0)
    model = build_model("vgg16", (3, 64, 64), 10, width=1 / 16).eval()  # conv13: 32 channels of 2×2 -> fc1
    randomize_norms(model)
    masks = random_masks(model, 0.0, 1)
    masks["fc1.weight"][:, 4 * 5: 4 * 5 + 4] = 0  # channel 5: all four positions unread
    masks["fc1.weight"][:, 4 * 7 + 1] = 0  # channel 7: one position unread, three read
    masked = MaskedModel(model, model_sites(model), masks)
    x = torch.randn(3, 3, 64, 64)
    res = compact(masked, x[:1])
    assert res.kept_units["conv13"].tolist() == [c for c in range(32) if c != 5]
    assert res.module.fc1.in_features == 31 * 4
    assert verify_compaction(masked, res, x) <= 1e-5


def test_lstm_unit_unread_by_the_next_layer_stays():
    """The last LSTM layer's units 2 and 6 are unread by fc1, but the recurrence reads them back (W_hh, with
    the o-gate rows unmasked): removing them would change every later step."""
    masked = masked_case("char_lstm", kill=0.0)
    masked.masks["fc1.weight"][:, [2, 6]] = 0
    x = sample_input("char_lstm", 6)
    res = compact(masked, x[:1])
    h = masked.base.lstm.hidden_size
    assert {s.name: s.kept for s in res.layers}["lstm.layer1"] == h
    assert _max_diff(res.module(x), masked(x)) <= 1e-5


def test_every_unit_unread_keeps_one():
    torch.manual_seed(0)
    masked = _ones_case(build_model("mlp", (64,), 10).eval())
    masked.masks["out.weight"].zero_()  # nothing of fc2 is read: the head outputs its bias
    x = sample_input("mlp", 4)
    res = compact(masked, x[:1])
    assert res.kept_units["fc2"].tolist() == [0]
    assert len(res.kept_units["fc1"]) == 128  # fc2's kept row reads every one
    assert _max_diff(res.module(x), masked(x)) <= 1e-5
