"""Training artifacts (issue #39): a client's local step, as its algorithm runs it, for the board to time.

The step is the algorithm's own :class:`~edgemask.trainer.records.LocalTask` for that client, rebuilt from the run
directory (``Algorithm.device_task``): FedMask's is the forward with the binarized mask, σ′ straight through to the
real-valued scores, W frozen, plus the group lasso (Eq. 3, 7-8, 10); FedAvg's the whole model. :class:`TrainStep`
makes it one module whose ``forward(x, y)`` returns the step's objective, so plain SGD(lr, momentum) on its
parameters ``t0, t1, ...`` (the task's trainable tensors, in order) *is* the engines' step
(:mod:`edgemask.trainer.task_program`):

* ``grad_keep`` (pruned elements, PerFedMask's frozen layers) and per-tensor rates are folded into the graph:
  ``p_eff = p.detach() + (p − p.detach())·g`` has the value of ``p`` exactly and the gradient ``g ⊙ ∇``, with
  ``g = keep · lr_n / lr``; weight decay wd is the term ``wd/2·‖p_eff‖²`` (gradient ``g ⊙ wd·p``), so
  :func:`~edgemask.trainer.task_program.direction`'s ``(∇ + wd·p) ⊙ keep`` is what SGD sees;
* a trainable tensor no element of which may move (keep all zero) is a constant of the step: the board computes
  no gradient for it, as an implementation that knows it is frozen would not;
* steps that are not one forward-backward on one minibatch are refused with the reason (a projection after the
  step, random numbers per step, ``batches_per_step`` > 1).

Two formats write it (``export/formats/training.py``): ``pte-train``, ExecuTorch's joint forward-backward program
(``torch.export.experimental._export_forward_backward``, run by ``executorch.extension.training``'s
``TrainingModule`` with its SGD), and ``torch-train``, the same step as a ``torch.export`` program for torch on the
board's own Python (the fallback where ExecuTorch's portable kernels are too slow, or absent). Each is proven
equal at export (:func:`check_step`): one step in its runtime from the file's state gives the host's updated
tensors within the tolerance rule, and ``train_io.npz`` carries the batch and those tensors so the board checks
its own step the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from edgemask.errors import EdgemaskError
from edgemask.fileio import atomic_path
from edgemask.export.runtime import one_line, runtime_layout
from edgemask.trainer.records import LocalTask
from edgemask.trainer.sampling import epoch_steps
from edgemask.trainer.task_program import program

TRAIN_IO = "train_io.npz"


class TrainingExportError(EdgemaskError):
    """A client's local step cannot be written as a training artifact, or its file does not compute that step."""


class NothingTrainsError(TrainingExportError):
    """Every trainable tensor of the step is frozen whole (a PerFedMask device with budget ψ_n = 0): there is no
    step to export. Export leaves the training formats out of that artifact and writes the rest."""


@dataclass(frozen=True)
class StepRule:
    """The equality rule for a training step's updated tensors, |t − t_ref| ≤ atol + rtol·|t_ref| elementwise
    (the inference rule's form, ``export.verify.Tolerance``). A step's gradients sum over the minibatch and the
    runtimes order those sums differently; float32 rounding of that order, scaled by the learning rate, is what
    the rule allows. Measured on the demo (lr 100: FedMask scores of ±1 moved by up to ~10²): ExecuTorch's
    portable kernels and torch agree within 2e-4 absolute."""

    atol: float = 1e-3
    rtol: float = 1e-4

    def max_excess(self, got: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
        """(max |got − ref|, max of |got − ref| − (atol + rtol·|ref|)): the second ≤ 0 when the rule holds; NaN
        anywhere is a failure."""
        d = np.abs(got.astype(np.float64) - ref.astype(np.float64))
        if d.size == 0:
            return 0.0, -self.atol
        if not np.all(np.isfinite(d)):
            return math.inf, math.inf
        return float(d.max()), float((d - (self.atol + self.rtol * np.abs(ref))).max())


STEP_RULE = StepRule()


@dataclass
class StepSpec:
    """One client's local step: its task, the minibatch the artifact is traced and checked with, and how many such
    steps a local round takes (``steps_per_round``: ⌈num_train / batch_size⌉ · epochs, capped by the task's
    ``max_steps``; the round's last minibatch of an epoch may be partial, the board times full ones; an epoch's
    lone last sample left out where ``training.one_sample_batch`` drops it: ``trainer.sampling.epoch_steps``)."""

    task: LocalTask
    x: torch.Tensor  # (B, *input_shape)
    y: torch.Tensor  # (B,) int64
    lr: float
    momentum: float
    weight_decay: float
    num_train: int
    epochs: int
    batch_size: int
    steps_per_round: int


def refusal(task: LocalTask) -> str | None:
    """Why ``task``'s step cannot be one exported forward-backward, or None."""
    if task.project is not None:
        return f"its step projects the tensors after the update ({task.project.name})"
    if task.noise:
        return "its step draws random numbers (" + ", ".join(sorted(task.noise)) + ")"
    if task.batches_per_step != 1:
        return f"its step takes {task.batches_per_step} minibatches"
    if task.loss is not None:
        return f"its step has its own loss ({task.loss.name})"
    return None


def _gate(p: torch.Tensor, g: torch.Tensor | float | None) -> torch.Tensor:
    """``p`` in value, ``g ⊙ ∇`` in the backward (``None``: ``p`` itself)."""
    if g is None:
        return p
    d = p.detach()
    return d + (p - d) * g


class TrainStep(nn.Module):
    """A local step's objective as a module: ``forward(x, y) -> (loss,)`` with the task's forward, cross-entropy,
    regularizers and weight decay; parameters ``t<i>`` for the tensors that train, buffers ``c<i>`` for the
    constants, ``b<i>`` for the buffers (batch norm, updated in the forward), ``f<i>`` for trainable tensors
    that are frozen whole. Shapes as the task's."""

    def __init__(self, task: LocalTask, weight_decay: float = 0.0) -> None:
        super().__init__()
        why = refusal(task)
        if why is not None:
            raise TrainingExportError(why)
        self.prog = program(task)
        self.wd = float(weight_decay)
        self.names: list[str] = []  # trained: t0, t1, ... in the task's order
        self.frozen: list[str] = []  # trainable in the task, kept whole by grad_keep: f0, f1, ...
        gates = {}
        for name, v in task.trainable.items():
            keep = task.grad_keep.get(name)
            rate = task.lrs.get(name, task.lr) / task.lr if task.lr else 1.0
            if keep is not None and not bool(keep.any()):
                self.register_buffer(f"f{len(self.frozen)}", v.detach().clone())
                self.frozen.append(name)
                continue
            i = len(self.names)
            self.register_parameter(f"t{i}", nn.Parameter(v.detach().clone().float()))
            g = None
            if keep is not None and not bool(keep.all()):
                g = keep.to(torch.float32) * rate
            elif rate != 1.0:
                g = torch.full((), rate)
            if g is not None:
                self.register_buffer(f"g{i}", g)
                gates[i] = True
            self.names.append(name)
        self.gated = gates
        self.const_names = list(task.constants)
        for i, name in enumerate(self.const_names):
            self.register_buffer(f"c{i}", task.constants[name].detach().clone())
        self.buffer_names = list(task.buffers)
        for i, name in enumerate(self.buffer_names):
            self.register_buffer(f"b{i}", task.buffers[name].detach().clone())
        if not self.names:
            raise NothingTrainsError("nothing in its step trains (every trainable tensor is frozen whole)")

    def trained(self) -> dict[str, torch.Tensor]:
        """The trained tensors, ``t<i>`` by the task's names."""
        return {n: getattr(self, f"t{i}") for i, n in enumerate(self.names)}

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
        tr = {}
        for i, name in enumerate(self.names):
            tr[name] = _gate(getattr(self, f"t{i}"), getattr(self, f"g{i}") if i in self.gated else None)
        for i, name in enumerate(self.frozen):
            tr[name] = getattr(self, f"f{i}")
        consts = {n: getattr(self, f"c{i}") for i, n in enumerate(self.const_names)}
        buffers = {n: getattr(self, f"b{i}") for i, n in enumerate(self.buffer_names)}
        loss = F.cross_entropy(self.prog.forward(tr, consts, x, buffers), y)
        if self.prog.regularizer is not None:
            loss = loss + self.prog.regularizer(tr, consts)
        if self.wd:
            loss = loss + 0.5 * self.wd * sum(t.pow(2).sum() for t in tr.values() if t.requires_grad)
        return (loss,)


def sgd_steps(module: nn.Module, trained: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, lr: float,
              momentum: float, steps: int = 1) -> list[float]:
    """``steps`` steps of torch's SGD(lr, momentum) on ``trained`` (tensors of ``module``, whose ``forward(x, y)``
    returns ``(loss,)``), in place; the losses. The host's reference and the torch-train format's host runtime."""
    opt = torch.optim.SGD(trained, lr=lr, momentum=momentum)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        (loss,) = module(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def host_step(step: TrainStep, x: torch.Tensor, y: torch.Tensor, lr: float, momentum: float,
              steps: int = 1) -> tuple[list[float], dict[str, torch.Tensor]]:
    """``steps`` SGD steps of a copy of ``step`` in torch on the host: (losses, trained tensors after). The
    reference every runtime's step is held to; equal to the engines' loop (``local_train``) by construction of
    :class:`TrainStep` (tests/export/test_training_step.py checks it)."""
    import copy

    s = copy.deepcopy(step)
    losses = sgd_steps(s, [getattr(s, f"t{i}") for i in range(len(s.names))], x, y, lr, momentum, steps)
    return losses, {n: t.detach().clone() for n, t in s.trained().items()}


CHECKED_PER_TENSOR = 1 << 16  # elements of each trained tensor train_io.npz holds the host's value of


def check_indices(numel: int) -> np.ndarray:
    """The flat indices of a tensor a board's step is checked on: every element up to
    :data:`CHECKED_PER_TENSOR`, else that many evenly strided ones (every row of a weight is reached, so a wrong
    gradient anywhere but in a few elements shows), keeping ``train_io.npz`` small beside a large model."""
    if numel <= CHECKED_PER_TENSOR:
        return np.arange(numel, dtype=np.int64)
    return np.linspace(0, numel - 1, CHECKED_PER_TENSOR).round().astype(np.int64)


def write_train_io(path: Path, spec: StepSpec, step: TrainStep, losses: list[float],
                   after: dict[str, torch.Tensor]) -> None:
    """``train_io.npz``: the minibatch (``x``, ``y``), the SGD settings (``lr``, ``momentum``), the trained
    tensors' names in ``t<i>`` order (``names``), the host's loss of the first step (``loss``) and each tensor
    after it at the flat indices ``index_<i>`` (:func:`check_indices`) as ``after_<i>``; the board runs one step from
    the file's state and checks it against these."""
    arrays: dict[str, Any] = {"x": spec.x.numpy(), "y": spec.y.numpy().astype(np.int64),
                              "lr": np.float64(spec.lr), "momentum": np.float64(spec.momentum),
                              "names": np.array(step.names), "loss": np.float64(losses[0])}
    for i, n in enumerate(step.names):
        idx = check_indices(after[n].numel())
        arrays[f"index_{i}"] = idx
        arrays[f"after_{i}"] = after[n].reshape(-1).numpy()[idx].astype(np.float32)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)


def check_step(where: str, got: dict[str, np.ndarray], loss: float, ref: dict[str, torch.Tensor],
               ref_loss: float, rule: StepRule = STEP_RULE) -> float:
    """Hold one runtime step (``got``: updated tensors by name, ``loss``) to the host's; returns the largest
    |Δ| over the tensors, or raises naming ``where``, the tensor and by how much."""
    worst = 0.0
    if not math.isclose(loss, ref_loss, rel_tol=1e-4, abs_tol=rule.atol):
        raise TrainingExportError(f"{where}: its step's loss {loss:.6g} differs from the host's {ref_loss:.6g}")
    for name, r in ref.items():
        d, excess = rule.max_excess(got[name], r.numpy())
        if excess > 0:
            raise TrainingExportError(f"{where}: after one step, {name!r} differs from the host's by up to {d:.3g} "
                                      f"(the rule allows {rule.atol:g} + {rule.rtol:g}·|t|): its gradient is not "
                                      f"the algorithm's")
        worst = max(worst, d)
    return worst


def step_spec(run, client_id: str | None) -> StepSpec:
    """The local step of ``client_id`` (None: the dense baseline, the algorithm's step from its initial state) in
    the run ``run`` (``trainer.run_dir.Run``): the algorithm rebuilt from the run's config without its set-up,
    the run's shared weights loaded, its ``device_task`` from the client's stored state; the minibatch is the
    first ``batch_size`` samples of the client's train split (cycled where it has fewer)."""
    from edgemask.trainer.algorithms import ALGORITHMS
    from edgemask.trainer.records import ClientState

    cfg = run.config
    ds = run.dataset
    alg = ALGORITHMS.get(cfg.algorithm.name)(cfg, ds)
    shared = run.model_state
    alg.global_params.update({k: v for k, v in shared.items() if k in alg.global_params})
    alg.global_buffers.update({k: v for k, v in shared.items() if k in alg.global_buffers})
    state = run.client_state(client_id) if client_id is not None else ClientState()
    task = alg.device_task(client_id, state)
    if task is None:
        raise TrainingExportError(f"algorithm {cfg.algorithm.name!r} does not rebuild its local step from a run "
                                  f"directory (Algorithm.device_task); export without the training formats")
    data = ds.client(client_id if client_id is not None else run.client_ids[0])
    n = int(len(data.train_y))
    if n == 0:
        raise TrainingExportError(f"client {client_id} has no training samples")
    B = int(cfg.training.batch_size)
    idx = torch.arange(B) % n
    steps = epoch_steps(n, B, alg.drop_one_sample) * int(task.epochs)  # the steps the host trained (one_sample_batch)
    if task.max_steps is not None:
        steps = min(steps, int(task.max_steps))
    x = runtime_layout(data.train_x[idx].float())  # the step is traced with the layout its runtime is fed
    return StepSpec(task, x, data.train_y[idx].long(), float(task.lr),
                    float(cfg.training.momentum), float(cfg.training.weight_decay),
                    n, int(task.epochs), B, steps)


def write_training(run, client_id: str | None, directory: Path, formats: list, rule: StepRule = STEP_RULE,
                   where: Path | None = None) -> tuple[list[tuple[Any, Path, dict[str, Any], float]], dict[str, Any]]:
    """Write ``client_id``'s local step in each training format (``formats``: their ``TrainingFormat`` objects)
    and ``train_io.npz`` into ``directory``; check each file's one step in its runtime against torch's. Returns
    ``[(format, path, its write() info, max |Δ|)]`` and the manifest's ``training`` fields (without the digest).

    ``where``: the artifact directory the files end up in (``directory`` may be its temporary name): every
    message names the file there. A step that trains nothing raises :class:`NothingTrainsError`; a format that
    cannot write the step, or whose runtime fails on it, one line naming the file and the format."""
    where = Path(where) if where is not None else directory
    try:
        spec = step_spec(run, client_id)
        step = TrainStep(spec.task, spec.weight_decay)
    except NothingTrainsError:
        raise
    except TrainingExportError as e:  # the algorithm's step is none these formats take: say whose and which
        raise TrainingExportError(f"{where}: {', '.join(f.name for f in formats)}: {e}") from None
    losses, after = host_step(step, spec.x, spec.y, spec.lr, spec.momentum)
    out, diffs = [], {}
    for fmt in formats:
        path = directory / fmt.filename("fp32")
        final = f"{where / path.name} ({fmt.name})"
        try:
            info = fmt.write_step(step, spec.x, spec.y, path)
        except EdgemaskError as e:
            raise type(e)(f"{final}: {e}") from None
        try:
            got_losses, got = fmt.run_step(path, spec.x.numpy(), spec.y.numpy(), spec.lr, spec.momentum,
                                           len(step.names))
        except Exception as e:  # the runtimes raise RuntimeError, their own kinds, or worse: one line
            raise TrainingExportError(f"{final}: {fmt.runtime} failed to run its step: {one_line(e)}") from None
        d = check_step(final, dict(zip(step.names, got)), got_losses[0], after, losses[0], rule)
        diffs[fmt.name] = d
        out.append((fmt, path, info, d))
    write_train_io(directory / TRAIN_IO, spec, step, losses, after)
    task = spec.task
    fns = [task.forward.name, *(r.name for r in task.regularizers)]
    info = {"file": TRAIN_IO, "batch_size": spec.batch_size, "steps_per_round": spec.steps_per_round,
            "epochs": spec.epochs, "num_train": spec.num_train, "lr": spec.lr, "momentum": spec.momentum,
            "trained": list(step.names), "frozen": list(step.frozen),
            "trained_params": int(sum(getattr(step, f"t{i}").numel() for i in range(len(step.names)))),
            "step": " + ".join(fns), "limit": rule.atol, "rtol": rule.rtol, "max_abs_diff": diffs}
    return out, info
