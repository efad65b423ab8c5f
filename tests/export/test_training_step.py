"""Training artifacts (issue #39): the exported local step is the engines' step, each runtime's one step equals
torch's within the rule, a wrong gradient fails that check, and the manifest's train_io digest is checked."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from edgemask.errors import CorruptFileError, EdgemaskError
from edgemask.manifest import load_artifact
from edgemask.export import export_run
from edgemask.export.formats import FORMATS
from edgemask.export.training import (STEP_RULE, TRAIN_IO, StepRule, TrainStep, TrainingExportError, check_step,
                                      host_step, step_spec)
from export_helpers import random_masks
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.local_training import local_train
from edgemask.trainer.models import build_model
from edgemask.trainer.records import ClientState
from edgemask.trainer.run_dir import load_run, write_run



def _run(tmp_path, algorithm: str = "fedmask", args: dict | None = None, lr: float = 5.0, momentum: float = 0.9,
         weight_decay: float = 0.0, batch_size: int = 16, one_sample_batch: str = "auto"):
    cfg = TrainConfig(run=RunConfig(seed=0, run_id=f"digits-{algorithm}-train-test"),
                      data=DataConfig(name="digits", num_clients=2),
                      model=ModelConfig("mlp", {"hidden": [32, 16]}),
                      algorithm=AlgorithmConfig(algorithm, args or {}),
                      training=TrainingConfig(batch_size=batch_size, lr=lr, momentum=momentum,
                                              weight_decay=weight_decay, one_sample_batch=one_sample_batch))
    torch.manual_seed(0)
    model = build_model("mlp", (64,), 10, hidden=(32, 16))
    clients = {f"client-00{i}": ClientState(masks=random_masks(model, 0.4, seed=i) if algorithm == "fedmask" else {})
               for i in range(2)}
    return load_run(write_run(tmp_path / "runs" / cfg.run_id, cfg, model.state_dict(), clients, [],
                              {"run_id": cfg.run_id, "clients": {}}))


def test_the_exported_step_is_the_engines_step(tmp_path):
    """One SGD step of TrainStep (the module every format exports) against the sequential engine's local_train on
    the same task and minibatch: FedMask's binarized forward, σ′ straight through, group lasso, pruned structure
    (grad_keep) and weight decay."""
    run = _run(tmp_path, weight_decay=0.01)
    spec = step_spec(run, "client-001")
    assert spec.task.grad_keep and spec.task.regularizers  # the pruned layers' structure and Eq. 10's term
    step = TrainStep(spec.task, spec.weight_decay)
    _, after = host_step(step, spec.x, spec.y, spec.lr, spec.momentum)
    task = spec.task
    task.max_steps = 1
    order = [np.arange(len(spec.y))]  # the minibatch itself, in order
    res = local_train(task, spec.x, spec.y, order, spec.batch_size, spec.momentum, spec.weight_decay)
    moved = 0
    for name in step.names:
        torch.testing.assert_close(after[name], res.trained[name], rtol=1e-5, atol=1e-6)
        moved += int((after[name] != task.trainable[name]).sum())
    assert moved > 0  # the step changed something: an all-zero gradient would pass the comparison too


def test_steps_per_round_is_the_clients_minibatches_times_epochs(tmp_path):
    run = _run(tmp_path)
    spec = step_spec(run, "client-000")
    n = len(run.dataset.client("client-000").train_y)
    assert spec.num_train == n and spec.steps_per_round == -(-n // 16) * spec.epochs
    assert spec.x.shape == (16, 1, 8, 8) and spec.y.dtype == torch.int64


def test_steps_per_round_leave_out_the_lone_last_sample_the_host_dropped(tmp_path):
    """training.one_sample_batch = "drop" with B = n − 1: the host trains one step an epoch, not ⌈n / B⌉ = 2, so the
    measured round must count one (before: the manifest said 2 · E, a step an epoch the host never ran)."""
    n = len(_run(tmp_path / "probe").dataset.client("client-000").train_y)
    assert n > 2
    dropped = step_spec(_run(tmp_path / "drop", batch_size=n - 1, one_sample_batch="drop"), "client-000")
    kept = step_spec(_run(tmp_path / "auto", batch_size=n - 1), "client-000")  # an MLP: auto keeps it
    assert dropped.steps_per_round == dropped.epochs and kept.steps_per_round == 2 * kept.epochs


@pytest.mark.parametrize("fmt", ["pte-train", "torch-train"])
def test_each_runtime_steps_like_torch_and_a_wrong_gradient_fails(tmp_path, fmt):
    run = _run(tmp_path)
    spec = step_spec(run, "client-000")
    step = TrainStep(spec.task, spec.weight_decay)
    losses, after = host_step(step, spec.x, spec.y, spec.lr, spec.momentum)
    f = FORMATS.get(fmt)
    path = tmp_path / f.filename("fp32")
    f.write_step(step, spec.x, spec.y, path)
    got_losses, got = f.run_step(path, spec.x.numpy(), spec.y.numpy(), spec.lr, spec.momentum, len(step.names))
    d = check_step(fmt, dict(zip(step.names, got)), got_losses[0], after, losses[0])
    assert d <= STEP_RULE.atol
    # a wrong gradient: the soft forward W ⊙ σ(m^r) instead of the binary one's straight-through estimator (the
    # same loss function's neighbour, FedMask's `forward = "soft"`): its step must not pass as the algorithm's
    wrong_task = step_spec(run, "client-000").task
    wrong_task.forward = type(wrong_task.forward).of("fedmask.forward", real_output_gate=True, binary=False)
    wrong = TrainStep(wrong_task, spec.weight_decay)
    f.write_step(wrong, spec.x, spec.y, path)
    got_losses, got = f.run_step(path, spec.x.numpy(), spec.y.numpy(), spec.lr, spec.momentum, len(step.names))
    with pytest.raises(TrainingExportError, match="differs from the host's"):
        check_step(fmt, dict(zip(step.names, got)), losses[0], after, losses[0])


def test_the_rule_reads_nan_as_a_failure():
    rule = StepRule(atol=1e-3, rtol=0.0)
    assert rule.max_excess(np.array([1.0005]), np.array([1.0]))[1] <= 0
    assert rule.max_excess(np.array([1.002]), np.array([1.0]))[1] > 0
    assert rule.max_excess(np.array([np.nan]), np.array([1.0]))[1] > 0


def test_export_writes_the_training_files_and_checks_their_digest(tmp_path):
    run = _run(tmp_path)
    out = export_run(run.path, tmp_path / "artifacts", ["client-000"], ["onnx", "torch-train"], progress=False)
    art = out[1]
    m = load_artifact(art)
    assert m.find_file("torch-train").file == "train.pt2"
    t = m.training
    assert t["file"] == TRAIN_IO and t["step"] == "fedmask.forward + fedmask.group_lasso"
    assert t["trained"] == ["fc1.weight", "fc2.weight", "out.weight"]  # the masks' scores; W frozen
    assert t["trained_params"] == 64 * 32 + 32 * 16 + 16 * 10
    assert t["max_abs_diff"]["torch-train"] <= t["limit"]
    with np.load(art / TRAIN_IO) as z:
        assert list(z["names"]) == t["trained"] and z["x"].shape == (16, 1, 8, 8)
        assert len(z["after_1"]) == 32 * 16 and z["index_1"][-1] == 32 * 16 - 1
    with np.load(art / TRAIN_IO) as z:
        arrays = {k: z[k] for k in z}
    arrays["after_0"] = arrays["after_0"] + 1.0  # changed after export
    with open(art / TRAIN_IO, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(CorruptFileError, match="training.sha256"):
        load_artifact(art)


def test_fedavg_trains_the_whole_model_and_the_dense_baseline_has_a_step(tmp_path):
    run = _run(tmp_path, "fedavg", lr=0.05)
    out = export_run(run.path, tmp_path / "artifacts", [], ["onnx", "torch-train"], progress=False)
    m = load_artifact(out[0])
    assert m.client_id == "dense" and m.training["step"] == "model"
    assert m.training["trained_params"] == 64 * 32 + 32 + 32 * 16 + 16 + 16 * 10 + 10


def test_a_step_that_is_not_one_forward_backward_is_refused_in_one_line(tmp_path):
    run = _run(tmp_path, "bnn_fedavg", lr=0.05)
    with pytest.raises(EdgemaskError) as e:
        export_run(run.path, tmp_path / "artifacts", [], ["torch-train"], progress=False)
    assert "\n" not in str(e.value)
    assert "bnn_fedavg" in str(e.value) or "projects" in str(e.value)


def test_perfedmask_steps_train_only_the_layers_p_mask_gave_them(tmp_path):
    """PerFedMask's step freezes what P^mask does not give the device: those tensors become constants of the step
    (no gradient computed), so the measured cost is the budget's; the dense baseline trains the whole body."""
    run = _run(tmp_path, "perfedmask", {"budgets": [1.0, 0.5]}, lr=0.05)
    s_full = TrainStep(step_spec(run, "client-000").task)
    assert {"out.weight", "out.bias"} <= set(s_full.frozen)  # the head (FedBABU): frozen in training
    assert s_full.names and set(s_full.names) <= {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    # ψ = d_w / 2 = 1,304 parameters (d_w = 2,080 + 528): P^mask's optimum gives client-001 nothing (its slack
    # ε = ψ beats sharing fc2 at k̃ = 1/2: d_w/2 − 528/2 + 776 = 1,816 > 1,304), and a step that trains nothing is no
    # training artifact
    with pytest.raises(TrainingExportError, match="nothing in its step trains"):
        TrainStep(step_spec(run, "client-001").task)
    dense = TrainStep(step_spec(run, None).task)
    assert dense.names == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]


def _conv_run(tmp_path, model: str, args: dict, algorithm: str = "fedavg"):
    """A hand-built run of a conv model on digits: FedAvg's step trains the whole model."""
    cfg = TrainConfig(run=RunConfig(seed=0, run_id=f"digits-{model}-train-test"),
                      data=DataConfig(name="digits", num_clients=2), model=ModelConfig(model, args),
                      algorithm=AlgorithmConfig(algorithm), training=TrainingConfig(batch_size=16, lr=0.05))
    torch.manual_seed(0)
    net = build_model(model, (1, 8, 8), 10, **args)
    clients = {f"client-00{i}": ClientState() for i in range(2)}
    return load_run(write_run(tmp_path / "runs" / cfg.run_id, cfg, net.state_dict(), clients, [],
                              {"run_id": cfg.run_id, "clients": {}}))


def test_a_step_through_max_pool_trains_in_executorch_as_in_torch(tmp_path):
    # Before: ExecuTorch's max_pool2d_with_indices_backward added into an output it never cleared: the cnn's conv1
    # gradient came out wrong (by 1.31 after an lr-100 step on the digits run of issue #44), and different each call
    run = _conv_run(tmp_path, "cnn", {"widths": [4, 8]})
    spec = step_spec(run, "client-000")
    step = TrainStep(spec.task, spec.weight_decay)
    f = FORMATS.get("pte-train")
    path = tmp_path / f.filename("fp32")
    f.write_step(step, spec.x, spec.y, path)
    losses, after = host_step(step, spec.x, spec.y, spec.lr, spec.momentum, steps=2)
    got_losses, got = f.run_step(path, spec.x.numpy(), spec.y.numpy(), spec.lr, spec.momentum, len(step.names),
                                 steps=2)
    assert "conv1.weight" in step.names and got_losses == pytest.approx(losses, rel=1e-4)
    for name, t in zip(step.names, got):  # two steps: a kernel that keeps what the last call left shows here
        assert STEP_RULE.max_excess(t, after[name].numpy())[1] <= 0, name


def test_executorchs_refusal_of_a_batch_norm_step_names_the_artifact_not_its_temporary(tmp_path):
    import user_models  # noqa: F401 - registers user_resnet (batch norms)

    run = _conv_run(tmp_path, "user_resnet", {})
    with pytest.raises(EdgemaskError) as e:
        export_run(run.path, tmp_path / "artifacts", [], ["onnx", "pte-train"], progress=False)
    final = tmp_path / "artifacts" / run.run_id / "dense" / "train.pte"
    assert str(e.value).startswith(f"{final} (pte-train): ExecuTorch cannot export this training step")
    assert "_native_batch_norm_legit" in str(e.value) and ".partial" not in str(e.value) and "\n" not in str(e.value)
