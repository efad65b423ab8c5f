"""Compaction of models users bring (their own module names, no ``norm_after``): batch norms found by tracing,
and every dead unit compaction keeps comes with its reason (issue #32)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import user_models  # noqa: F401 - registers user_resnet and user_mobilenet
from edgemask.export.compact import compact
from edgemask.export.layers import kept_dead_notes, layer_records
from export_helpers import randomize_norms
from edgemask.trainer.models import MaskedModel, build_model, model_sites
from edgemask.trainer.models.masking import all_ones_masks
from edgemask.trainer.models.registry import NormMapError, norms_after, traced_norms

SHAPE = (3, 16, 16)


def _half_dead(model: nn.Module, sites) -> dict[str, torch.Tensor]:
    """Masks killing the odd units of every masked layer but the head."""
    masks = {k: v for k, v in all_ones_masks(model, sites).items() if not k.startswith(model.head[0] + ".")}
    for m in masks.values():
        m[1::2] = 0
    return masks


def _user(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = build_model(name, SHAPE, 10).eval()
    randomize_norms(model, seed)
    return model


def _max_diff(a, b) -> float:
    return float((a - b).detach().abs().max())


# Hand count of the compacted parameters (batch norm folded: each conv gains a bias of its kept width).
#   user_resnet: entry 3→4 3×3 (108+4) + stage1.a, stage1.b 4→4 3×3 (144+4 each) + stage2.a 4→8 3×3 (288+8)
#                + stage2.b 8→8 3×3 (576+8) + shortcut 4→8 1×1 (32+8) + classifier 8→10 (80+10) = 1418
#   user_mobilenet: first 3→4 3×3 (108+4) + per block: widen 4→16 (64+16), depthwise 16 (144+16);
#                   ir1.narrow 16→4 (64+4), ir2.narrow 16→8 (128+8) + fc 8→10 (80+10) = 886
EXPECTED = {
    "user_resnet": ({"entry": 8, "stage1.a": 8, "stage1.b": 8, "stage2.a": 16, "stage2.b": 16,
                     "stage2.shortcut.0": 16, "classifier": 10}, 1418),
    "user_mobilenet": ({"first": 8, "ir1.widen": 32, "ir1.spatial": 32, "ir1.narrow": 8, "ir2.widen": 32,
                        "ir2.spatial": 32, "ir2.narrow": 16, "fc": 10}, 886),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_user_model_interior_layers_lose_their_dead_units(name):
    model = _user(name)
    sites = model_sites(model)
    masked = MaskedModel(model, sites, _half_dead(model, sites))
    x = torch.randn(8, *SHAPE, generator=torch.Generator().manual_seed(1))
    res = compact(masked, x[:1])
    totals, params = EXPECTED[name]
    head = model.head[0]
    assert {s.name: s.total for s in res.layers} == totals
    for s in res.layers:  # every interior layer keeps exactly its live (even) units; the head keeps all
        want = s.total if s.name == head else s.total // 2
        assert (s.kept, s.dead, s.why_kept) == (want, s.total - want, ()), s
        if s.name != head:
            assert res.kept_units[s.name].tolist() == list(range(0, s.total, 2))
    assert res.params_compacted == params
    with torch.no_grad():
        assert _max_diff(res.module(x), masked(x)) <= 1e-5


def test_trace_finds_the_user_models_batch_norms():
    assert traced_norms(_user("user_resnet")) == {
        "entry": "entry_norm", "stage1.a": "stage1.a_norm", "stage1.b": "stage1.b_norm",
        "stage2.a": "stage2.a_norm", "stage2.b": "stage2.b_norm", "stage2.shortcut.0": "stage2.shortcut.1"}
    assert traced_norms(_user("user_mobilenet")) == {
        "first": "first_norm", **{f"ir{i}.{c}": f"ir{i}.{c}_norm" for i in (1, 2)
                                  for c in ("widen", "spatial", "narrow")}}


@pytest.mark.parametrize("name, shape, args", [("vgg16", (3, 32, 32), {"width": 1 / 16}),
                                               ("resnet18", (3, 32, 32), {"width": 1 / 16}),
                                               ("tiny_mobilenet", (3, 16, 16), {})])
def test_zoo_maps_agree_with_the_trace(name, shape, args):
    model = build_model(name, shape, 10, **args)
    assert traced_norms(model) == model.norm_after  # the hand maps are complete and right
    assert norms_after(model) == (model.norm_after, None)


class Shapes(nn.Module):
    """conv→ReLU→bn (found through the activation), a bn fed by a sum of two convs (nobody's), a conv whose
    output is also read elsewhere (its bn is not "right after" it), a non-affine bn (nothing to gate)."""

    head = ("out",)

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.n1 = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)
        self.c2, self.c3, self.n23 = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
        self.c4, self.n4 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4)
        self.c5, self.n5 = nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4, affine=False)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        x = self.n1(torch.relu(self.c1(x)))
        x = self.n23(self.c2(x) + self.c3(x))
        y = self.c4(x)
        x = self.n4(y) + y
        x = self.n5(self.c5(x))
        return self.out(x.mean(dim=(2, 3)))


def test_trace_rules():
    assert traced_norms(Shapes()) == {"c1": "n1"}


class MyConv(nn.Conv2d):
    """A user's own conv subclass (torch.fx would trace into it and see F.conv2d, not the layer)."""

    def forward(self, x):
        return super().forward(x) * 1.0


class OwnLayers(nn.Module):
    head = ("out",)

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = MyConv(3, 4, 1), nn.BatchNorm2d(4)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.bn(self.conv(x)).mean(dim=(2, 3)))


def test_trace_keeps_a_users_layer_subclass_whole():
    assert traced_norms(OwnLayers()) == {"conv": "bn"}


class Untraceable(nn.Module):
    """A forward torch.fx cannot trace (control flow on a tensor's value)."""

    head = ("out",)

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        if x.sum() > -1e30:  # data-dependent: fx raises
            x = torch.relu(self.bn(self.conv(x)))
        return self.out(self.conv2(x).mean(dim=(2, 3)))


def _compact_untraceable(norm_after=None):
    torch.manual_seed(0)
    model = Untraceable().eval()
    randomize_norms(model)
    if norm_after is not None:
        model.norm_after = norm_after
    sites = model_sites(model)
    masks = _half_dead(model, sites)
    masked = MaskedModel(model, sites, masks)
    x = torch.randn(4, 3, 6, 6)
    res = compact(masked, x[:1])
    with torch.no_grad():
        assert _max_diff(res.module(x), masked(x)) <= 1e-5
    return {s.name: s for s in res.layers}


def test_untraceable_model_says_why_its_dead_units_stay_and_norm_after_fixes_it():
    norms, reason = norms_after(Untraceable())
    assert norms == {} and reason.startswith("torch.fx cannot trace Untraceable.forward (TraceError")
    layers = _compact_untraceable()
    conv = layers["conv"]
    assert (conv.kept, conv.dead) == (8, 4)
    assert conv.why_kept == (("batch norm 'bn' is not gated (not traced as right after a masked layer): "
                              "it emits β − γ·μ/σ", (1, 3, 5, 7)),)
    assert layers["conv2"].kept == 4 and layers["conv2"].why_kept == ()
    # the declared map is used where the trace is not available, and then the units go
    layers = _compact_untraceable({"conv": "bn"})
    assert (layers["conv"].kept, layers["conv"].why_kept) == (4, ())


def test_norm_after_contradicting_the_trace_is_refused():
    model = _user("user_resnet")
    model.norm_after = {"stage1.a": "stage1.b_norm"}
    with pytest.raises(NormMapError, match=r"UserResNet.norm_after\['stage1.a'\] = 'stage1.b_norm', but the "
                                           r"traced graph has 'stage1.a_norm' right after 'stage1.a'"):
        model_sites(model)
    model.norm_after = {"classifier": "entry_norm"}
    with pytest.raises(NormMapError, match="has no batch norm right after 'classifier'"):
        model_sites(model)


def test_residual_keeps_dead_units_and_says_which_branch():
    model = _user("user_resnet")
    sites = model_sites(model)
    masks = {k: v for k, v in all_ones_masks(model, sites).items() if not k.startswith("classifier.")}
    masks["stage1.b.weight"][[1, 3]] = 0  # dead in the residual branch, live through the identity shortcut
    masks["stage1.a.weight"][[2]] = 0  # an interior unit: goes
    masked = MaskedModel(model, sites, masks)
    x = torch.randn(4, *SHAPE)
    res = compact(masked, x[:1])
    layers = {s.name: s for s in res.layers}
    assert layers["stage1.b"].why_kept == (("residual add: live in 'entry'", (1, 3)),)
    assert (layers["stage1.b"].kept, layers["stage1.a"].kept, layers["stage1.a"].why_kept) == (8, 7, ())
    with torch.no_grad():
        assert _max_diff(res.module(x), masked(x)) <= 1e-5
    recs = {r["name"]: r for r in layer_records(model, res.module, (x[:1],), res.layers, {})}
    assert recs["stage1.b"]["dead"] == 2
    assert recs["stage1.b"]["why_kept"] == [{"reason": "residual add: live in 'entry'", "units": [1, 3]}]
    assert recs["stage1.a"]["why_kept"] == []
    assert kept_dead_notes(recs.values()) == [
        "stage1.b: keeps 2 of its 2 dead units (1, 3): residual add: live in 'entry'"]


class Gated(nn.Module):
    """conv → sigmoid → conv: sigmoid(0) = 0.5, so a dead filter of the first conv is still read."""

    head = ("out",)

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1)
        self.out = nn.Linear(4, 2)

    def forward(self, x):
        return self.out(self.c2(torch.sigmoid(self.c1(x))).mean(dim=(2, 3)))


def test_an_op_that_maps_zero_to_non_zero_keeps_the_unit_and_says_so():
    torch.manual_seed(0)
    model = Gated().eval()
    sites = model_sites(model)
    masks = {k: v for k, v in all_ones_masks(model, sites).items() if not k.startswith("out.")}
    masks["c1.weight"][[0, 2]] = 0
    masked = MaskedModel(model, sites, masks)
    x = torch.randn(4, 3, 5, 5)
    res = compact(masked, x[:1])
    c1 = {s.name: s for s in res.layers}["c1"]
    assert (c1.kept, c1.dead, c1.why_kept) == (4, 2, (("read by op Sigmoid, which does not map 0 to 0", (0, 2)),))
    with torch.no_grad():
        assert _max_diff(res.module(x), masked(x)) <= 1e-5
