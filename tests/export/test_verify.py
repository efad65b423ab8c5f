"""Export verification's one rule, |Δ| ≤ atol + rtol·|y_ref| elementwise: by hand, on a compaction, in the pipeline.

A real compaction error (a wrong unit, a NaN, two swapped channels) still fails; float32 noise on a large output,
more than atol but within rtol of it, passes."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from edgemask.export import TOLERANCE, Tolerance, export_run, load_manifest
from edgemask.export.compact import compact
from edgemask.export.formats import FORMATS
from edgemask.export.formats.base import ExportFormatError
from edgemask.export.verify import VerificationError, verify_compaction
from export_helpers import masked_case, random_masks, randomize_norms, sample_input
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.models import MaskedModel, build_model, model_sites
from edgemask.trainer.run_dir import ClientState, write_run

RULE = Tolerance(atol=1e-5, rtol=1e-4)


def test_the_rule_by_hand_lets_a_large_output_differ_within_rtol():
    ref = torch.tensor([1000.0, -2000.0, 0.5])
    # |Δ| 0.05 and 0.1: 5000× and 10000× atol, but within 1e-4 of 1000 and 2000 (limits 0.10001, 0.20001)
    c = RULE.compare(ref, ref + torch.tensor([0.05, -0.1, 0.0]))
    assert c.ok and c.max_abs_diff == pytest.approx(0.1, rel=1e-3)
    # beyond: 0.2 where the limit is 1e-5 + 1e-4·1000 = 0.10001; the element furthest past its limit is named
    c = RULE.compare(ref, ref + torch.tensor([0.2, -0.1, 0.0]))
    assert not c.ok
    assert c.diff == pytest.approx(0.2, rel=1e-3) and c.limit == pytest.approx(0.10001, rel=1e-5)
    assert RULE.describe(c) == "by 0.2 where the limit there is 0.1 (atol 1e-05 + rtol 0.0001·|y|)"


def test_the_rule_holds_an_element_near_zero_to_atol():
    # elementwise: a large neighbour does not widen the limit of an output near zero
    c = RULE.compare(torch.tensor([0.0, 1000.0]), torch.tensor([2e-5, 1000.0]))
    assert not c.ok and c.diff == pytest.approx(2e-5) and c.limit == pytest.approx(1e-5)
    assert RULE.compare(torch.tensor([0.0, 1000.0]), torch.tensor([9e-6, 1000.0])).ok


def test_the_rule_fails_a_nan_and_another_shape():
    c = RULE.compare(np.array([1.0, 2.0]), np.array([1.0, np.nan]))
    assert not c.ok and math.isnan(c.diff) and math.isnan(c.max_abs_diff)
    c = RULE.compare(np.array([np.nan]), np.array([1.0]))  # a NaN reference fails too
    assert not c.ok
    assert not RULE.compare(np.zeros((2, 3)), np.zeros((3, 2))).ok
    assert RULE.compare(np.zeros((0, 3)), np.zeros((0, 3))).ok


def test_a_bare_number_is_an_absolute_limit():
    assert Tolerance.of(1e-5) == Tolerance(atol=1e-5, rtol=0.0)
    assert Tolerance.of(RULE) is RULE
    assert not Tolerance.of(1e-5).compare([1000.0], [1000.05]).ok
    assert TOLERANCE.atol > 0 and TOLERANCE.rtol > 0  # the default has both parts


def _large_output_case(shift: float):
    """fedpews_cnn compacted, with every logit near 1e4 (the same bias added on both sides), then the compacted
    head's bias moved by ``shift``: a difference the size float32 rounding leaves on such an output."""
    masked = masked_case("fedpews_cnn")
    x = sample_input("fedpews_cnn", 8)
    res = compact(masked, x[:1])
    with torch.no_grad():
        masked.base.out.bias += 1e4
        res.module.out.bias += 1e4 + shift
    return masked, res, x


def test_compaction_passes_a_large_output_within_rtol_and_fails_beyond():
    masked, res, x = _large_output_case(0.05)  # > atol 1e-5, < 1e-4 · ~1e4
    assert verify_compaction(masked, res, x, RULE) == pytest.approx(0.05, rel=1e-2)
    with pytest.raises(VerificationError, match=r"by 0\.0(49|5)\d* where the limit there is 1e-05 "
                                                r"\(atol 1e-05 \+ rtol 0·\|y\|\) first at layer 'out'"):
        verify_compaction(masked, res, x, 1e-5)  # the former absolute rule refused it
    masked, res, x = _large_output_case(3.0)  # 3× what rtol allows: a real error
    with pytest.raises(VerificationError, match=r"by 3 where the limit there is 1 \(atol 1e-05 \+ rtol 0\.0001·\|y\|\) "
                                                r"first at layer 'out'"):
        verify_compaction(masked, res, x, RULE)


def test_one_wrong_unit_fails_and_names_its_layer_and_the_rule():
    masked = masked_case("fedpews_cnn")
    x = sample_input("fedpews_cnn", 4)
    res = compact(masked, x[:1])
    with torch.no_grad():
        res.module.conv2.weight[0] *= 1.01  # one kept filter 1 % off
    with pytest.raises(VerificationError, match=rf"by \S+ where the limit there is \S+ \({re.escape(str(TOLERANCE))}\) "
                                                r"first at layer 'conv2'; output differs by"):
        verify_compaction(masked, res, x)


@pytest.mark.parametrize("layer", ["conv1", "conv3"])
def test_two_swapped_channels_fail(layer):
    masked = masked_case("fedpews_cnn")
    x = sample_input("fedpews_cnn", 4)
    res = compact(masked, x[:1])
    conv = getattr(res.module, layer)
    assert conv.out_channels >= 2
    with torch.no_grad():  # output channels 0 and 1 trade places, weights and bias alike
        conv.weight[[0, 1]] = conv.weight[[1, 0]].clone()
        conv.bias[[0, 1]] = conv.bias[[1, 0]].clone()
    with pytest.raises(VerificationError, match=f"first at layer '{layer}'"):
        verify_compaction(masked, res, x)


@pytest.fixture
def run_dir(tmp_path):
    cfg = TrainConfig(run=RunConfig(seed=0, run_id="digits-fedmask-mlp-tol"),
                      data=DataConfig(name="digits", num_clients=2),
                      model=ModelConfig("mlp", {"hidden": [32, 16]}), algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    model = build_model("mlp", (64,), 10, hidden=(32, 16))
    clients = {"client-000": ClientState(masks=random_masks(model, 0.4, seed=0))}
    return write_run(tmp_path / "runs" / cfg.run_id, cfg, model.state_dict(), clients, [],
                     {"run_id": cfg.run_id, "clients": {}})


def _runtime_off_by(monkeypatch, change):
    """onnxruntime's answers passed through ``change`` (a stand-in for a runtime's own rounding, or its error)."""
    onnx = FORMATS.get("onnx")
    real = type(onnx).run
    monkeypatch.setattr(type(onnx), "run", lambda self, path, inputs, threads=1: change(real(self, path, inputs)))


def test_each_format_is_held_to_the_rule(run_dir, tmp_path, monkeypatch):
    # 5e-5 of each logit: up to ~2e-4 on this MLP, past the former 1e-5, within rtol 1e-4
    _runtime_off_by(monkeypatch, lambda y: y * np.float32(1 + 5e-5))
    out = export_run(run_dir, tmp_path / "a", clients=["client-000"], formats=("onnx",), progress=False,
                     limit=RULE)
    m = load_manifest(out[1])
    assert 1e-5 < m.tolerance["max_abs_diff"]["onnx"] <= 1e-3
    assert m.tolerance_rule == (RULE.atol, RULE.rtol)  # the rule, whole: what a device holds the files to


def test_a_format_with_two_logits_swapped_fails_naming_the_rule(run_dir, tmp_path, monkeypatch):
    _runtime_off_by(monkeypatch, lambda y: y[:, [1, 0, *range(2, y.shape[1])]])
    with pytest.raises(ExportFormatError, match=r"onnxruntime output differs from the compacted torch model by \S+ "
                                                r"where the limit there is \S+ \(atol 1e-05 \+ rtol 0\.0001·\|y\|\)"):
        export_run(run_dir, tmp_path / "a", clients=["client-000"], formats=("onnx",), progress=False, limit=RULE)


@pytest.mark.slow
def test_full_width_vgg16_passes_the_default_rule_where_an_absolute_1e_5_failed():
    # VGG16 at full width (CIFAR-10 shape), 30 % of each layer's units dead, logits up to 20 as a trained
    # classifier's: float32 sums in another order part by more than 1e-5 (issue #37: 4.6e-5 on a trained one;
    # 2.0e-5 here, on an x86 CPU with torch 2.13's kernels)
    torch.manual_seed(0)
    model = build_model("vgg16", (3, 32, 32), 10).eval()
    randomize_norms(model, 0)
    masked = MaskedModel(model, model_sites(model), random_masks(model, 0.3, seed=0, keep=1.0))
    x = torch.randn(32, 3, 32, 32, generator=torch.Generator().manual_seed(0))  # (32, 3, 32, 32)
    with torch.no_grad():
        k = 20 / float(masked(x).abs().max())
        model.out.weight.mul_(k)
        model.out.bias.mul_(k)
    res = compact(masked, x[:1])
    assert 1e-5 < verify_compaction(masked, res, x) < TOLERANCE.atol
    with pytest.raises(VerificationError, match=r"where the limit there is 1e-05 \(atol 1e-05 \+ rtol 0·\|y\|\)"):
        verify_compaction(masked, res, x, 1e-5)
