"""The trainer's records: what the round loop, the local-training engines and the algorithms hand each other.

* :class:`LocalTask` — what one client trains in one round (an algorithm's ``local_task``);
* :class:`LocalResult` — what its local training gave (an engine's output);
* :class:`ClientUpdate` — the client's upload (an algorithm's ``client_updates``), costed in bytes;
* :class:`EvalModel` — a client's personalized model for evaluation;
* :class:`ClientState` — what the run directory stores of a client;
* :class:`Engine` — how this host trains and evaluates clients (:mod:`edgemask.trainer.engines`).

All hold plain tensors: a batched engine's results are views of its stacked tensors' rows, which the server's
average reads without a copy (:func:`edgemask.trainer.aggregation.stack_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Callable, Protocol

import torch

from edgemask.trainer.task_functions import Fn, ModelSpec

Tensors = dict[str, torch.Tensor]
MODEL_FORWARD = Fn("model")  # the plain forward: the model on the trainable tensors


@dataclass
class LocalTask:
    """What one client trains in one round: tensors, settings and the names of its functions — plain data.

    ``model`` is the architecture the functions run (:class:`~edgemask.trainer.task_functions.ModelSpec`); ``forward``,
    ``regularizers``, ``loss`` and ``project`` name registered functions (:class:`~edgemask.trainer.task_functions.Fn`:
    a name and plain settings; :mod:`edgemask.trainer.task_functions` lists their signatures). The forward maps the
    trainable tensors and a batch ``(B, *input_shape)`` to logits ``(B, classes)``; the regularizers add to the data
    loss (e.g. FedMask's group lasso, Eq. 10), summed in order; ``buffers`` (batch-norm running statistics) are updated
    in place by the forward pass. Everything that differs between clients is in ``trainable``, ``constants`` or
    ``buffers``, so tasks whose model, function names and settings are equal and whose tensors agree in names,
    shapes and dtypes are one kind of task, stacked by the batched engine; and a task crosses a network as its
    tensors plus :meth:`settings` (:meth:`from_parts` rebuilds it, :mod:`edgemask.trainer.flower`).
    ``grad_keep`` zeroes the update of frozen elements, weight decay included (pruned mask entries, PerFedMask's
    frozen params): they never move. How the engines read each field is written once, in
    :mod:`edgemask.trainer.task_program`.
    Both loops train copies and never write to the task's tensors, so a task may hold tensors the algorithm
    keeps (the default task holds the global model itself: no per-client copy before training).
    """

    trainable: dict[str, torch.Tensor]
    model: ModelSpec
    forward: Fn = MODEL_FORWARD
    regularizers: tuple[Fn, ...] = ()
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    epochs: int = 1
    lr: float = 0.05
    grad_keep: dict[str, torch.Tensor] = field(default_factory=dict)
    max_steps: int | None = None  # stop after this many steps (each of ``batches_per_step`` minibatches)
    # per-tensor learning rates overriding ``lr`` (FedPeWS's mask rate η_s next to the weights' η_ℓ)
    lrs: dict[str, float] = field(default_factory=dict)
    # The step's data loss, replacing cross-entropy(forward(...), y). With ``batches_per_step`` k > 1, its ``x`` and
    # ``y`` are tuples of the step's k minibatches (Per-FedAvg's first-order MAML step: inner step on D, outer
    # step on D').
    loss: Fn | None = None
    # How many consecutive minibatches of the client's batch order one optimizer step consumes (needs ``loss``):
    # the order's minibatches (over all epochs) are taken k at a time; a last incomplete group wraps around to
    # the round's first minibatches, so every sample is used and the step count is ceil(minibatches / k).
    batches_per_step: int = 1
    # After every optimizer step, the named trainable tensors are replaced by the ones this function returns (a
    # projection, e.g. BNN's clip of the shadow weights to [-1, 1]); ``None``: no projection.
    project: Fn | None = None
    # Random numbers a step needs (FedPeWS's Bernoulli masks): ``{name: shape}``; before every step both loops put
    # fresh uniform [0, 1) tensors of these shapes into the constants the loss, forward and regularizer receive,
    # drawn from the client's own generator (seeded with ``seed``, which the round loop sets per client, round and
    # phase), so a client's draws do not depend on which clients train with it, nor on the loop.
    noise: dict[str, tuple[int, ...]] = field(default_factory=dict)
    seed: int = 0

    def with_regularizer(self, fn: Fn) -> "LocalTask":
        """This task with ``fn`` added after its regularizers (in place; returned for chaining)."""
        self.regularizers = (*self.regularizers, fn)
        return self

    def settings(self) -> dict[str, Any]:
        """Everything but the tensors (:data:`TENSOR_FIELDS`), as JSON-able data: the settings, the model and the
        function names. ``LocalTask.from_parts(tensors, task.settings())`` is the task again."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in TENSOR_FIELDS:
                continue
            if f.name == "regularizers":
                v = [r.to_data() for r in v]
            elif isinstance(v, (Fn, ModelSpec)):
                v = v.to_data()
            elif f.name == "noise":
                v = {k: list(s) for k, s in v.items()}
            out[f.name] = v
        return out

    @classmethod
    def from_parts(cls, tensors: dict[str, dict[str, torch.Tensor]], settings: dict[str, Any]) -> "LocalTask":
        """The task of ``tensors`` (each of :data:`TENSOR_FIELDS` to its tensors) and :meth:`settings`' data."""
        s = dict(settings)
        s["model"] = ModelSpec.from_data(s["model"])
        s["forward"] = Fn.from_data(s["forward"])
        s["regularizers"] = tuple(Fn.from_data(r) for r in s.get("regularizers", ()))
        for name in ("loss", "project"):
            s[name] = Fn.from_data(s[name]) if s.get(name) is not None else None
        s["noise"] = {k: tuple(v) for k, v in s.get("noise", {}).items()}
        unknown = set(s) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"task settings name unknown fields {sorted(unknown)}")
        return cls(**{f: dict(tensors.get(f, {})) for f in TENSOR_FIELDS}, **s)


TENSOR_FIELDS = ("trainable", "constants", "buffers", "grad_keep")  # LocalTask's fields that hold tensors


@dataclass
class EvalModel:
    """A client's personalized model for evaluation: ``forward(params, buffers, x)`` maps a batch to logits.
    As with :class:`LocalTask`, everything that differs between clients is in ``params`` and ``buffers`` and the
    function (one object for every client of a kind, e.g. a bound method) captures no tensor, so the loop can
    stack clients and evaluate them together on the training device (:func:`edgemask.trainer.batched.evaluate_many`). A
    tensor every client shares (the global weights of a masked model, :func:`edgemask.trainer.masks.masked_model`) goes
    in ``params`` too: held by all, it is stacked as one broadcast view, not copied."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    forward: Callable[[Tensors, Tensors, torch.Tensor], torch.Tensor]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The client's logits for a batch ``x``."""
        return self.forward(self.params, self.buffers, x)


class LocalResult:
    """What one client's local training gave: its ``trained`` tensors and ``buffers``, its mean training loss,
    the samples it saw, and the samples it holds."""

    __slots__ = ("trained", "buffers", "loss", "samples_seen", "num_samples")

    def __init__(self, trained: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], loss: float,
                 samples_seen: int, num_samples: int) -> None:
        self.trained, self.buffers, self.loss, self.samples_seen, self.num_samples = (trained, buffers, loss,
                                                                                       samples_seen, num_samples)

    def __repr__(self) -> str:
        return (f"LocalResult(trained={list(self.trained)}, loss={self.loss}, samples_seen={self.samples_seen}, "
                f"num_samples={self.num_samples})")


class ClientUpdate:
    """A client's upload. ``payload`` is what crosses the network; ``bytes_up`` is its exact size."""

    __slots__ = ("client_id", "num_samples", "payload", "bytes_up", "bytes_down", "train_loss", "samples_seen",
                 "extra")

    def __init__(self, client_id: str, num_samples: int, payload: dict[str, torch.Tensor], bytes_up: int,
                 bytes_down: int, train_loss: float, samples_seen: int = 0,
                 extra: dict[str, Any] | None = None) -> None:
        self.client_id, self.num_samples, self.payload = client_id, num_samples, payload
        self.bytes_up, self.bytes_down, self.train_loss, self.samples_seen = (bytes_up, bytes_down, train_loss,
                                                                               samples_seen)
        self.extra = extra if extra is not None else {}

    def __repr__(self) -> str:
        return (f"ClientUpdate({self.client_id!r}, num_samples={self.num_samples}, bytes_up={self.bytes_up}, "
                f"bytes_down={self.bytes_down}, train_loss={self.train_loss}, samples_seen={self.samples_seen})")


class Engine(Protocol):
    """How this host trains and evaluates clients (:mod:`edgemask.trainer.engines`: one after another, or stacked),
    chosen once per run. ``train``: ``tasks[i]`` on ``data[i] = (x, y)`` in ``orders[i]`` (one sample order per epoch),
    one :class:`LocalResult` per task, in order; ``evaluate``: ``(accuracy, mean cross-entropy)`` of each
    ``models[i]`` on ``data[i]``; ``groups``: the clients the round loop hands one call (all of them, or one at a
    time); ``together``: whether a call's clients train together. An algorithm that trains outside the rounds
    (FedMask's one-shot pruning epoch, Per-FedAvg's adaptation step) uses the one it was built with
    (``Algorithm.engine``), never an engine module."""

    together: bool

    def train(self, tasks: list[LocalTask], data: list[tuple[torch.Tensor, torch.Tensor]],
              orders: list[list[Any]], batch_size: int, momentum: float = 0.0,
              weight_decay: float = 0.0) -> list[LocalResult]: ...

    def evaluate(self, models: list[EvalModel],
                 data: list[tuple[torch.Tensor, torch.Tensor]]) -> list[tuple[float, float]]: ...

    def groups(self, cids: list[str]) -> list[list[str]]: ...


@dataclass
class ClientState:
    """What makes one client's model personal: binary masks and personal parameters (both by param name)."""

    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
