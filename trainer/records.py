"""The trainer's records: what the round loop, the local-training engines and the algorithms hand each other.

* :class:`LocalTask` — what one client trains in one round (an algorithm's ``local_task``);
* :class:`LocalResult` — what its local training gave (an engine's output);
* :class:`ClientUpdate` — the client's upload (an algorithm's ``client_updates``), costed in bytes;
* :class:`EvalModel` — a client's personalized model for evaluation;
* :class:`ClientState` — what the run directory stores of a client.

The batched engine hands a result's tensors over as a row of one stacked tensor (:mod:`trainer.batched_rows`),
made into a dict when first read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from trainer.batched_rows import MadeOnRead, Row

Tensors = dict[str, torch.Tensor]
Forward = Callable[[Tensors, Tensors, torch.Tensor, Tensors], torch.Tensor]


@dataclass
class LocalTask:
    """What one client trains in one round.

    ``forward(trainable, constants, x, buffers)`` maps the trainable tensors and a batch ``(B, *input_shape)``
    to logits ``(B, classes)``; ``regularizer(trainable, constants)`` adds to the data loss (e.g. FedMask's
    group lasso, Eq. 10); ``buffers`` (batch-norm running statistics) are updated in place by the forward pass.
    Everything that differs between clients must be in ``trainable``, ``constants`` or ``buffers`` — never
    captured in the functions — so the loop can stack clients and train them together (torch.func.vmap).
    Tasks whose functions compare equal (``==``: the same function object, bound methods of the same object,
    or equal values such as :class:`~trainer.losses.Proximal`) and whose tensors agree in names, shapes and
    dtypes are one kind of task, stacked by the batched engine; a fresh closure per task is a kind of its own.
    ``grad_keep`` zeroes the update of frozen elements, weight decay included (pruned mask entries, PerFedMask's
    frozen params): they never move.
    Both loops train copies and never write to the task's tensors, so a task may hold tensors the algorithm
    keeps (the default task holds the global model itself: no per-client copy before training).
    """

    trainable: dict[str, torch.Tensor]
    forward: Forward
    regularizer: Callable[[Tensors, Tensors], torch.Tensor] | None = None
    constants: dict[str, torch.Tensor] = field(default_factory=dict)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    epochs: int = 1
    lr: float = 0.05
    grad_keep: dict[str, torch.Tensor] = field(default_factory=dict)
    max_steps: int | None = None  # stop after this many steps (each of ``batches_per_step`` minibatches)
    # per-tensor learning rates overriding ``lr`` (FedPeWS's mask rate η_s next to the weights' η_ℓ)
    lrs: dict[str, float] = field(default_factory=dict)
    # ``loss(trainable, constants, x, y, buffers)``: the data loss of a step, replacing
    # cross-entropy(forward(...), y). With ``batches_per_step`` k > 1, ``x`` and ``y`` are tuples of the step's k
    # minibatches (Per-FedAvg's first-order MAML step: inner step on D, outer step on D').
    loss: Callable[[Tensors, Tensors, Any, Any, Tensors], torch.Tensor] | None = None
    # How many consecutive minibatches of the client's batch order one optimizer step consumes (needs ``loss``):
    # the order's minibatches (over all epochs) are taken k at a time; a last incomplete group wraps around to
    # the round's first minibatches, so every sample is used and the step count is ceil(minibatches / k).
    batches_per_step: int = 1
    # ``project(trainable) -> {name: tensor}``: after every optimizer step, the named trainable tensors are
    # replaced by the returned ones (a projection, e.g. BNN's clip of the shadow weights to [-1, 1]). Must be
    # per-client (it runs under vmap on stacked clients in the batched loop); ``None``: no projection.
    project: Callable[[Tensors], Tensors] | None = None
    # Random numbers a step needs (FedPeWS's Bernoulli masks): ``{name: shape}``; before every step both loops put
    # fresh uniform [0, 1) tensors of these shapes into the constants the loss, forward and regularizer receive,
    # drawn from the client's own generator (seeded with ``seed``, which the round loop sets per client, round and
    # phase), so a client's draws do not depend on which clients train with it, nor on the loop.
    noise: dict[str, tuple[int, ...]] = field(default_factory=dict)
    seed: int = 0


@dataclass
class EvalModel:
    """A client's personalized model for evaluation: ``forward(params, buffers, x)`` maps a batch to logits.
    As with :class:`LocalTask`, everything that differs between clients is in ``params`` and ``buffers`` and the
    function (one object for every client of a kind, e.g. a bound method) captures no tensor, so the loop can
    stack clients and evaluate them together on the training device (:func:`trainer.batched.evaluate_many`). A
    tensor every client shares (the global weights of a masked model, :meth:`Algorithm.masked_model`) goes in
    ``params`` too: held by all, it is stacked as one broadcast view, not copied."""

    params: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]
    forward: Callable[[Tensors, Tensors, torch.Tensor], torch.Tensor]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """The client's logits for a batch ``x``."""
        return self.forward(self.params, self.buffers, x)


class LocalResult:
    """What one client's local training gave: its ``trained`` tensors and ``buffers``, its mean training loss,
    the samples it saw, and the samples it holds. The batched loop hands ``trained`` over as a :class:`Row` of
    its stack, made into the dict on first access; :meth:`row` is that row while the dict is not made."""

    __slots__ = ("_trained", "buffers", "loss", "samples_seen", "num_samples")

    def __init__(self, trained: dict[str, torch.Tensor] | Row, buffers: dict[str, torch.Tensor], loss: float,
                 samples_seen: int, num_samples: int) -> None:
        self._trained = trained
        self.buffers, self.loss, self.samples_seen, self.num_samples = buffers, loss, samples_seen, num_samples

    trained = MadeOnRead()

    def row(self) -> Row | None:
        """The unmade :class:`Row` ``trained`` is, else ``None`` (a dict: made, replaced, or never a row)."""
        return LocalResult.trained.unmade(self)

    def __repr__(self) -> str:
        return (f"LocalResult(trained={list(self.row().stack.tensors) if self.row() else self.trained}, "
                f"loss={self.loss}, samples_seen={self.samples_seen}, num_samples={self.num_samples})")


class ClientUpdate:
    """A client's upload. ``payload`` is what crosses the network; ``bytes_up`` is its exact size. FedAvg's
    upload of a batched result is a :class:`Row` of the stack until ``payload`` is read (:meth:`row`)."""

    __slots__ = ("client_id", "num_samples", "_payload", "bytes_up", "bytes_down", "train_loss", "samples_seen",
                 "extra")

    def __init__(self, client_id: str, num_samples: int, payload: dict[str, torch.Tensor] | Row, bytes_up: int,
                 bytes_down: int, train_loss: float, samples_seen: int = 0,
                 extra: dict[str, Any] | None = None) -> None:
        self.client_id, self.num_samples, self._payload = client_id, num_samples, payload
        self.bytes_up, self.bytes_down, self.train_loss, self.samples_seen = (bytes_up, bytes_down, train_loss,
                                                                               samples_seen)
        self.extra = extra if extra is not None else {}

    payload = MadeOnRead()

    def row(self) -> Row | None:
        """The unmade :class:`Row` ``payload`` is, else ``None``."""
        return ClientUpdate.payload.unmade(self)

    def __repr__(self) -> str:
        return (f"ClientUpdate({self.client_id!r}, num_samples={self.num_samples}, bytes_up={self.bytes_up}, "
                f"bytes_down={self.bytes_down}, train_loss={self.train_loss}, samples_seen={self.samples_seen})")


class LocalTrainer(Protocol):
    """The framework's local training, offered to an algorithm that trains outside the rounds (FedMask's one-shot
    pruning epoch, Per-FedAvg's adaptation step): ``tasks[i]`` on ``data[i] = (x, y)`` in ``orders[i]`` (one
    sample order per epoch), one :class:`LocalResult` per task, in order. The round loop's own engines implement
    it (:func:`trainer.simulation.host_trainer`): an algorithm never imports them."""

    def __call__(self, tasks: list[LocalTask], data: list[tuple[torch.Tensor, torch.Tensor]],
                 orders: list[list[Any]], batch_size: int, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> list[LocalResult]: ...


@dataclass
class ClientState:
    """What makes one client's model personal: binary masks and personal parameters (both by param name)."""

    masks: dict[str, torch.Tensor] = field(default_factory=dict)
    params: dict[str, torch.Tensor] = field(default_factory=dict)
