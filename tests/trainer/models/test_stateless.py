"""trainer.models.stateless: the model run on tensors it is handed, as torch.func.functional_call runs it."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from edgemask.trainer.models import build_model
from edgemask.trainer.models import stateless
from edgemask.trainer.models.stateless import stateless_call


def _own(model):
    return {k: v.clone() for k, v in {**dict(model.named_parameters()), **dict(model.named_buffers())}.items()}


@pytest.mark.parametrize(("name", "shape", "args"), [("mlp", (1, 8, 8), {"hidden": (16, 12)}),
                                                     ("tiny_mobilenet", (1, 8, 8), {"width": 4, "expand": 2})])
def test_same_output_as_functional_call_and_the_models_own_tensors_come_back(name, shape, args):
    torch.manual_seed(0)
    model = build_model(name, shape, 7, **args).train()
    before = _own(model)
    x = torch.randn(5, *shape)
    theirs_state = {k: v + 0.1 * torch.randn_like(v) if v.is_floating_point() else v.clone()
                    for k, v in before.items()}
    ours_state = {k: v.clone() for k, v in theirs_state.items()}
    theirs = functional_call(model, theirs_state, (x,))
    ours = stateless_call(model, ours_state, (x,))
    assert torch.equal(ours, theirs)
    for k in before:  # batch norm updated the handed buffers in place, as functional_call does; not the model's
        assert torch.equal(ours_state[k], theirs_state[k]), k
        assert torch.equal(_own(model)[k], before[k]), k
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())


def test_a_subset_under_vmap_and_grad_and_the_slots_restored_after_an_error():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 7, hidden=(16, 12))
    W = torch.randn(3, *model.fc1.weight.shape)  # three clients' fc1 weights; the rest is the model's own
    x = torch.randn(3, 4, 1, 8, 8)
    ours = vmap(lambda w, xb: stateless_call(model, {"fc1.weight": w}, (xb,)))(W, x)
    theirs = vmap(lambda w, xb: functional_call(model, {"fc1.weight": w}, (xb,)))(W, x)
    assert torch.equal(ours, theirs)

    def loss(w, xb):
        return stateless_call(model, {"fc1.weight": w}, (xb,)).square().sum()

    def loss_ref(w, xb):
        return functional_call(model, {"fc1.weight": w}, (xb,)).square().sum()

    assert torch.equal(vmap(grad(loss))(W, x), vmap(grad(loss_ref))(W, x))
    own = model.fc1.weight
    with pytest.raises(RuntimeError):
        stateless_call(model, {"fc1.weight": torch.zeros(2, 2)}, (x[0],))  # wrong shape: the forward raises
    assert model.fc1.weight is own


def test_tied_tensors_and_unknown_names_go_to_functional_call(monkeypatch):
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3, bias=False)
            self.b = nn.Linear(3, 3, bias=False)
            self.b.weight = self.a.weight  # one tensor under two names

        def forward(self, x):
            return self.b(self.a(x))

    calls = []
    monkeypatch.setattr(stateless, "functional_call", lambda *a: calls.append(a) or functional_call(*a))
    torch.manual_seed(0)
    model, x, w = Tied(), torch.randn(2, 3), torch.randn(3, 3)
    out = stateless_call(model, {"a.weight": w}, (x,))
    assert torch.allclose(out, x @ w.T @ w.T) and len(calls) == 1  # the tie holds: b uses the handed w too
    plain = build_model("mlp", (1, 8, 8), 7, hidden=(16, 12))
    extra = {"fc1.weight": plain.fc1.weight, "not_a_tensor_name": torch.zeros(1)}
    stateless_call(plain, extra, (torch.randn(2, 1, 8, 8),))
    assert len(calls) == 2
