"""The per-layer model of a training step (issue #46, profiling/train_predict.py): the runner's op entries attributed
to the manifest's layers, a fit on hand-made per-layer rows predicting a hand-computed step and round, and the
refusals where the fit cannot say (a state no fitted layer of that kind was in, a forward time or a trained-parameter
count beyond the fitted range, another model)."""

from __future__ import annotations

import pytest

from edgemask.errors import ConfigError
from edgemask.profiling.train_predict import (OTHER, CannotPredict, ClientStep, StepTimes, Structure, attribute,
                                              client_step, fit, layer_budgets, leave_one_out, states, structure_of)

# -- attribution of the runner's op entries ---------------------------------------------------------------------
# A conv net's step as the runner names it (devices/remote/runner/training.py): conv1 and its batch norm train
# (t0, t1: conv1.weight, bn1.weight), conv2 is frozen (f0), the head out frozen (f1); x-independent nodes build
# conv1's gated weight and the regularizer's term of it.
TRAINED = ["conv1.weight", "bn1.weight"]
FROZEN = ["conv2.weight", "out.weight"]
LAYERS = ["conv1", "conv2", "out"]
OPS = [
    ["Optimizer.zero_grad#SGD.zero_grad[]", "Optimizer.zero_grad#SGD.zero_grad", 10.0, "update"],
    ["detach[t0]", "aten::detach", 2.0, "param"],
    ["mul[g0,t0]", "aten::mul", 3.0, "param"],  # the gate of t0: conv1's
    ["conv2d[g0,t0]", "aten::conv2d", 100.0, "forward"],
    ["batch_norm[b0,b1,t1]", "aten::batch_norm", 20.0, "forward"],  # bn1: no manifest layer -> conv1's segment
    ["relu[]", "aten::relu", 5.0, "forward"],
    ["conv2d_1[f0]", "aten::conv2d", 200.0, "forward"],
    ["relu_1[]", "aten::relu", 6.0, "forward"],
    ["mean[]", "aten::mean", 4.0, "forward"],
    ["linear[f1]", "aten::linear", 8.0, "forward"],
    ["cross_entropy_loss[]", "aten::cross_entropy_loss", 7.0, "forward"],
    ["pow_1[t1]", "aten::pow", 1.0, "param"],  # a regularizer on bn1.weight: conv1's, through its module
    ["add_5[g0,t0,t1]", "aten::add", 1.0, "param"],  # conv1 and bn1 -> conv1
    ["aten::ones_like[]", "aten::ones_like", 3.0, "other"],
    ["cross_entropy_loss[]", "NllLossBackward0", 2.0, "backward"],
    ["linear[f1]", "AddmmBackward0", 9.0, "backward"],
    ["relu_1[]", "ReluBackward0", 4.0, "backward"],
    ["conv2d_1[f0]", "ConvolutionBackward0", 180.0, "backward"],
    ["relu[]", "ReluBackward0", 3.0, "backward"],
    ["batch_norm[b0,b1,t1]", "NativeBatchNormBackward0", 30.0, "backward"],
    ["conv2d[g0,t0]", "ConvolutionBackward0", 150.0, "backward"],
    ["mul[g0,t0]", "MulBackward0", 2.0, "backward"],
    ["accumulate_grad[]", "torch::autograd::AccumulateGrad", 1.0, "update"],
    ["Optimizer.step#SGD.step[]", "Optimizer.step#SGD.step", 40.0, "update"],
]


def test_op_entries_go_to_their_layers_by_the_tensors_they_read():
    structure, owner = structure_of(OPS, LAYERS, TRAINED, FROZEN)
    assert structure.order == ("conv1", "conv2", "out")
    assert structure.kinds == {"conv1": "aten::conv2d", "conv2": "aten::conv2d", "out": "aten::linear"}
    # bn1's module is conv1's segment; the layers are their own
    assert structure.modules == {"conv1": "conv1", "bn1": "conv1", "conv2": "conv2", "out": "out"}
    t = attribute(OPS, 1.0, owner)
    # conv1: detach 2 + mul 3 + conv 100 + bn 20 + relu 5 + pow 1 + add 1 forward; bn 30 + conv 150 + mul 2 + relu 3
    assert t.layers["conv1"] == pytest.approx((0.132, 0.185))
    assert t.layers["conv2"] == pytest.approx((0.210, 0.184))  # conv 200 + relu 6 + mean 4; conv 180 + relu 4
    assert t.layers["out"] == pytest.approx((0.015, 0.011))  # linear 8 + the loss 7 (its segment); 9 + 2
    assert t.update_ms == pytest.approx(0.051) and t.other_ms == pytest.approx(0.003)  # ones_like: no node's
    assert t.total_ms == pytest.approx(sum(o[2] for o in OPS) / 1e3)  # every entry counted once
    # the states the step puts each layer in: conv1 trained (its bn too), the rest pass its gradient down
    step = ClientStep("r/c", tuple(TRAINED), 10, 1, profiled=(t,), structure=structure, step_ms=1.0)
    assert states(step, structure) == {"conv1": (1, 0), "conv2": (0, 1), "out": (0, 1)}


def test_an_entry_reading_two_layers_or_before_the_first_is_other():
    ops = [["flatten[]", "aten::flatten", 5.0, "forward"], ["linear[t0]", "aten::linear", 10.0, "forward"],
           ["mixed[t0,t1]", "aten::add", 2.0, "forward"], ["linear_1[t1]", "aten::linear", 10.0, "forward"],
           ["sum_all[t0,t1]", "aten::add", 1.0, "param"]]
    structure, owner = structure_of(ops, ["fc1", "fc2"], ["fc1.weight", "fc2.weight"], [])
    assert owner == {"flatten": OTHER, "linear": "fc1", "mixed": OTHER, "linear_1": "fc2", "sum_all": OTHER}
    assert attribute(ops, 1.0, owner).other_ms == pytest.approx(0.008)


def test_client_step_reads_the_manifest_and_the_profile_document():
    manifest = {"run_id": "r", "client_id": "client-001", "model": "cnn", "dataset": "digits",
                "params": {"dense": 1000}, "layers": [{"name": n, "total": 4} for n in LAYERS],
                "training": {"trained": TRAINED, "frozen": FROZEN, "trained_params": 77, "steps_per_round": 9}}
    profile = {"available": True, "runs": [{"end_to_end_ms": 1.0, "ops": OPS}, {"end_to_end_ms": 1.2, "ops": OPS}]}
    c = client_step(manifest, profile, 0.9, 8.0)
    assert c.measured and c.artifact == "r/client-001" and c.trained_params == 77 and c.steps_per_round == 9
    assert c.layer_ms()["conv2"] == pytest.approx((0.210, 0.184)) and c.update_ms() == pytest.approx(0.051)
    assert not client_step(manifest).measured  # no profile: to predict
    assert not client_step(manifest, {"available": False, "runs": []}, 0.9).measured


# -- the fit on hand-made per-layer rows --------------------------------------------------------------------------
# Layers A, B, D (the body) and the head C, in that forward order; A, B, D aten::linear, C another kind. Per layer
# its forward ms and its time (forward + backward) in each state (trained w, gradient through it g):
FWD = {"A": 1.0, "B": 2.0, "D": 2.0, "C": 0.5}
CELL = {("A", 0, 0): 1.0, ("A", 1, 0): 1.8,
        ("B", 0, 0): 2.0, ("B", 1, 0): 4.0, ("B", 0, 1): 5.0, ("B", 1, 1): 7.0,
        ("D", 0, 0): 2.0, ("D", 1, 0): 3.0, ("D", 0, 1): 4.4, ("D", 1, 1): 7.0,
        ("C", 0, 1): 0.9}
PARAMS = {"A": 100, "B": 300, "D": 50}
FIXED, U0, U1, ROUND = 0.5, 0.2, 0.001, 1.1  # C, the update's line, measured round ÷ (steps × p50)
KINDS = {"A": "aten::linear", "B": "aten::linear", "D": "aten::linear", "C": "aten::matmul"}


def _client(trained: set[str], model: str = "mlp", fwd: dict | None = None, measured: bool = True,
            steps: int = 10, cell: dict | None = None, params: dict | None = None) -> ClientStep:
    fwd, cells, sizes = fwd or FWD, {**CELL, **(cell or {})}, params or PARAMS
    structure = Structure(("A", "B", "D", "C"), KINDS, {l: l for l in "ABDC"})
    names = tuple(f"{l}.weight" for l in "ABD" if l in trained)
    p = sum(sizes[l] for l in trained)
    art = "run/" + ("+".join(sorted(trained)) or "nothing")
    if not measured:
        return ClientStep(art, names, p, steps, model)
    c = ClientStep(art, names, p, steps, model, structure=structure)
    layers, total = {}, 0.0
    for l, s in states(c, structure).items():
        layers[l] = (fwd[l], cells[(l, *s)] - fwd[l])
        total += cells[(l, *s)]
    update = U0 + U1 * p
    step = FIXED + total + update
    t = StepTimes(layers, update, 0.0, step)
    return ClientStep(art, names, p, steps, model, (t, t), structure, step, ROUND * steps * step)


FITTED = [{"B"}, {"A"}, {"A", "B"}, {"D"}]


def test_the_fit_on_hand_made_rows_predicts_a_hand_computed_step_and_round():
    model = fit([_client(t) for t in FITTED])
    assert model.fixed_ms == pytest.approx(FIXED) and model.update == pytest.approx((U0, U1))
    assert model.round_factor == pytest.approx(ROUND) and model.update_range == (50, 400)
    assert model.cells[("B", 1, 1)] == pytest.approx(7.0) and ("D", 1, 1) not in model.cells
    # B and D train: A frozen, nothing below (1.0), B trained with nothing below (4.0), D trained with B below it:
    # never fitted, so its kind's ratio, B's 7.0 / 2.0 = 3.5, times D's forward 2.0 = 7.0; the head with gradient
    # through it 0.9; the update 0.2 + 0.001 x 350; the fixed 0.5
    p = model.predict(_client({"B", "D"}, measured=False))
    assert p.step_ms == pytest.approx(0.5 + 1.0 + 4.0 + 7.0 + 0.9 + 0.2 + 0.35)  # 13.95 ms
    assert p.round_ms == pytest.approx(1.1 * 10 * 13.95)
    assert p.by_kind == ("D",) and p.layers == pytest.approx({"A": 1.0, "B": 4.0, "D": 7.0, "C": 0.9})
    # each client predicted by the others (B + D measured too): {B} from measured cells alone (D frozen with nothing
    # below it: never measured so, its forward 2.0, as it is); {A} needs B with gradient through it, fitted only on D
    # (ratio 4.4 / 2.0): 12.9 - 5.0 + 4.4; {B, D} needs D's (1, 1) from B's; {A, B} trains 400 parameters, past the
    # others' 50-350 (+10 %), and {D} 50, below the others' 100-400
    held = {h.artifact: h for h in leave_one_out([_client(t) for t in [*FITTED, {"B", "D"}]])}
    assert held["run/B"].predicted_ms == pytest.approx(11.3) and held["run/B+D"].predicted_ms == pytest.approx(13.95)
    assert held["run/A"].predicted_ms == pytest.approx(12.3)
    assert held["run/A+B"].predicted_ms is None and "trains 400 parameters" in held["run/A+B"].reason
    assert held["run/D"].predicted_ms is None and "trains 50 parameters" in held["run/D"].reason


def test_a_state_no_layer_of_its_kind_was_fitted_in_is_refused():
    model = fit([_client(t) for t in FITTED])
    # the head C trained (nothing below it): no fitted client trained C, nor any layer of its kind (aten::matmul)
    c = ClientStep("run/C", ("C.weight",), 100, 10, "mlp")
    with pytest.raises(CannotPredict) as e:
        model.predict(c)
    assert "layer C (aten::matmul) is trained, no gradient below it" in str(e.value)
    assert "nor any layer of its kind" in str(e.value) and "\n" not in str(e.value)


def test_a_layer_no_gradient_reaches_runs_its_forward_alone():
    # D as wide as A here (forward 1.0, its states in A's ratios); every fitted client trains A, so no layer was
    # ever frozen with nothing below it. {D} leaves A and B so: no gradient reaches them, they run their forward
    # alone (A never frozen: its forward over all, 1.0; B's while frozen, 2.0); D trained with nothing below: A's
    # ratio 1.8 x 1.0; the head 0.9; the update 0.2 + 0.001 x 100; the fixed 0.5
    fwd = {**FWD, "D": 1.0}
    cell = {("D", 0, 0): 1.0, ("D", 1, 0): 1.8, ("D", 0, 1): 2.2, ("D", 1, 1): 3.5}
    sizes = {**PARAMS, "D": 100}
    model = fit([_client(t, fwd=fwd, cell=cell, params=sizes) for t in ({"A"}, {"A", "B"}, {"A", "D"})])
    p = model.predict(_client({"D"}, fwd=fwd, cell=cell, params=sizes, measured=False))
    assert p.forward_only == ("A", "B") and p.by_kind == ("D",)
    assert p.layers == pytest.approx({"A": 1.0, "B": 2.0, "D": 1.8, "C": 0.9})
    assert p.step_ms == pytest.approx(0.5 + 1.0 + 2.0 + 1.8 + 0.9 + 0.3)


def test_a_forward_or_a_parameter_count_beyond_the_fitted_range_is_refused():
    # D three times B's forward: B's ratio in state (1, 1) would be carried to a layer outside the fitted range
    fwd = {**FWD, "D": 6.0}
    cell = dict(CELL)
    model = fit([_client(t, fwd=fwd) for t in FITTED])
    with pytest.raises(CannotPredict, match=r"layer D \(aten::linear\) is trained, gradient through it.*"
                                            r"2-2 ms forward and it is 6 ms: an extrapolation"):
        model.predict(_client({"B", "D"}, fwd=fwd, measured=False))
    assert cell == CELL
    # all three body layers: 450 trained parameters, past the fitted 50-400 (+10 %)
    model = fit([_client(t) for t in FITTED])
    with pytest.raises(CannotPredict, match=r"trains 450 parameters, outside the fitted clients' 50-400"):
        model.predict(_client({"A", "B", "D"}, measured=False))


def test_another_models_client_is_refused_and_one_fit_takes_one_model():
    model = fit([_client(t) for t in FITTED])
    with pytest.raises(CannotPredict, match="another model"):
        model.predict(_client({"B"}, model="cnn", measured=False))
    with pytest.raises(ConfigError, match="two models"):
        fit([_client({"B"}), _client({"A"}, model="cnn")])
    with pytest.raises(ConfigError, match="profile_layers = true"):
        fit([_client({"B"}, measured=False)])


def test_a_trained_tensor_of_no_known_layer_is_refused():
    model = fit([_client(t) for t in FITTED])
    c = ClientStep("run/x", ("E.weight",), 10, 10, "mlp")
    with pytest.raises(CannotPredict, match="'E.weight' belongs to no layer"):
        model.predict(c)


# -- PerFedMask's budgets on the model ---------------------------------------------------------------------------
def test_budgets_lower_a_late_device_until_the_layers_it_gets_fit_the_deadline():
    model = fit([_client(t) for t in FITTED])
    groups = {"A": ["A.weight"], "B": ["B.weight"], "D": ["D.weight"]}
    sizes = [PARAMS[g] for g in groups]
    d_w = sum(sizes)

    def solve(psi):  # a stand-in for P^mask: the largest layers first while they fit the budget
        rows = []
        for budget in psi:
            row, left = [0, 0, 0], budget
            for j in sorted(range(3), key=lambda j: -sizes[j]):
                if sizes[j] <= left + 1e-9:
                    row[j], left = 1, left - sizes[j]
            rows.append(row)
        return rows

    # 10 steps a round, deadline 130 ms: {B, D} costs 1.1 x 10 x 13.95 = 153.45 ms, {B, A}: 0.5 + 1.8 + 7.0 + 4.4
    # + 0.9 + 0.6 = 15.2 -> 167.2 ms; {B} alone: 0.5 + 1.0 + 4.0 + 4.4 + 0.9 + 0.5 = 11.3 -> 124.3 ms
    out, rounds = layer_budgets({"n0": 10}, {"n0": "b"}, {"b": model}, groups, sizes, 0.130, solve,
                                start={"n0": 350 / d_w})
    assert out["n0"]["layers"] == ["B"] and out["n0"]["meets_deadline"]
    assert out["n0"]["predicted_round_s"] == pytest.approx(0.1243)
    # below B + D by D's 50 (half a parameter above it: f · d_w read back in floating point still holds B)
    assert out["n0"]["fraction"] == pytest.approx((350 - 50 + 0.5) / d_w) and rounds == 2
