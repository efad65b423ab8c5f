"""Compaction: compacted output equals masked output, with fewer parameters, on every model and hard case."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from export.compact import AllDeadLayerError, UnsupportedLayerError, compact, count_flops
from export.verify import VerificationError, verify_compaction
from export_helpers import MODEL_CASES, masked_case, randomize_norms, sample_input
from trainer.models import MaskedModel, model_sites
from trainer.models.masking import all_ones_masks


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


def test_flop_counter_by_hand():
    m = nn.Sequential()
    m.add_module("conv", nn.Conv2d(2, 3, 3, padding=1))  # 3·8·8 outputs × 2·3·3 MACs = 3456
    m.add_module("flat", nn.Flatten())
    m.add_module("fc", nn.Linear(192, 4))  # 4 × 192 = 768
    assert count_flops(m, (torch.randn(1, 2, 8, 8),)) == 2 * (3456 + 768)
    lstm = nn.LSTM(5, 7, num_layers=2, batch_first=True)  # 10 steps × 4·7·(5+7) + 10 × 4·7·(7+7)
    assert count_flops(lstm, (torch.randn(1, 10, 5),)) == 2 * (10 * 4 * 7 * 12 + 10 * 4 * 7 * 14)
