"""The algorithm interface: a few hooks around the one round loop (``trainer.simulation``) and the one
local-training loop (``trainer.local_training``). An algorithm never writes a loop of its own.

Hooks, in the order the loop calls them:

* ``setup()`` — once, before round 0 (e.g. FedMask's one-shot pruning on every client);
* ``round_clients(rnd, sampled)`` — who trains this round (default: the sampled ones; Standalone: everyone);
* ``local_task(cid, rnd)`` — what client ``cid`` trains this round: a :class:`LocalTask`;
* ``client_update(cid, rnd, result)`` — the trained tensors become the upload: a :class:`ClientUpdate`
  (``client_updates(rnd, results)`` asks for the round's clients together; by default one by one);
* ``aggregate(rnd, updates)`` — the server's update from the round's uploads;
* ``eval_model(cid)`` / ``eval_masks(cid)`` — the client's personalized model for evaluation (an
  :class:`EvalModel`: the loop evaluates many clients together) and its masks for FLOPs;
* ``client_state(cid)`` / ``shared_state()`` — what the run directory stores.

Optional hooks (defaults keep the behaviour above):

* ``next_phase(cid, rnd, phase, result)`` — another local-training phase in the same round, started after the
  previous one (GradLTN's pruning iterations, LocalAlt, FedRep's head-then-body, Ditto's personal model);
  ``None`` ends the client's round and the last result goes to ``client_update`` (``next_phases(rnd, phase,
  results)`` asks for a phase's clients together; by default one by one);
* ``global_forward()`` — the server's global model, evaluated on the dataset's global test set when it has one;
* ``finetune_task(cid)`` / ``finetune_result(cid, result)`` — after the last round, one more local training per
  client (PerFedMask's and FedBABU's head fine-tuning); accuracy is reported before and after;
* ``backward_flops(cid, fwd)`` — backward FLOPs per sample given the forward FLOPs (frozen layers cost less);
* ``eval_models(cids)`` — every listed client's :class:`EvalModel`, asked for together by the batched loop
  (Per-FedAvg adapts them all in one batched step); by default each one's ``eval_model``;
* ``eval_forward(cid)`` — the personalized model as a plain function of a batch, by default
  :meth:`Algorithm.eval_model`'s. An algorithm whose evaluation cannot be written as an :class:`EvalModel`
  overrides this instead, and the loop evaluates its clients one after another.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
from torch import nn

from edgemask.errors import ConfigError
from edgemask.registry import Registry
from trainer.accounting import tensor_bytes
from trainer.config import TrainConfig
from trainer.data.base import FederatedDataset
from trainer.models import build_model, model_sites
from trainer.models.masking import effective_params
from trainer.models.stateless import stateless_call
from trainer.run_dir import ClientState

Tensors = dict[str, torch.Tensor]
MASK_PREFIX = "mask:"  # a mask's name in a masked model's EvalModel.params (Algorithm.masked_model)
Forward = Callable[[Tensors, Tensors, torch.Tensor, Tensors], torch.Tensor]


@dataclass
class LocalTask:
    """What one client trains in one round.

    ``forward(trainable, constants, x, buffers)`` maps the trainable tensors and a batch ``(B, *input_shape)``
    to logits ``(B, classes)``; ``regularizer(trainable, constants)`` adds to the data loss (e.g. FedMask's
    group lasso, Eq. 10); ``buffers`` (batch-norm running statistics) are updated in place by the forward pass.
    Everything that differs between clients must be in ``trainable``, ``constants`` or ``buffers`` — never
    captured in the closures — so the loop can stack clients and train them together (torch.func.vmap);
    the closures may capture what every client shares (e.g. FedMask's frozen weights).
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


class StackedRows:
    """One batched chunk's trained tensors, ``{name: (C, *shape)}`` (detached, on the CPU), for its C clients'
    :class:`LocalResult` and :class:`ClientUpdate` to hold a :class:`Row` of until their dict is asked for. The
    per-client views are made together, once, on the first request for one (C × the tensors, ~1 µs each: for
    100 MLP clients 0.6 ms of a 10 ms round); FedAvg's aggregate asks for none and reads the stack itself
    (:meth:`Algorithm.average_params`)."""

    __slots__ = ("tensors", "count", "row_bytes", "_views")

    def __init__(self, tensors: dict[str, torch.Tensor], count: int) -> None:
        self.tensors, self.count = tensors, count
        self.row_bytes = tensor_bytes(tensors) // max(count, 1)  # one client's, on the wire
        self._views: list[tuple[torch.Tensor, ...]] | None = None

    def row(self, i: int) -> dict[str, torch.Tensor]:
        """Client ``i``'s tensors: views of its rows (a new dict each call, the same tensors)."""
        if self._views is None:
            self._views = list(zip(*[v.unbind(0) for v in self.tensors.values()])) if self.tensors else \
                [()] * self.count
        return dict(zip(self.tensors, self._views[i]))


class Row:
    """A dict not made yet: row ``index`` of ``stack``'s tensors, then ``rest`` (a result's ``trained``; an
    upload's ``payload``, the weights then the buffers)."""

    __slots__ = ("stack", "index", "rest")

    def __init__(self, stack: StackedRows, index: int, rest: dict[str, torch.Tensor] | None = None) -> None:
        self.stack, self.index, self.rest = stack, index, rest or {}

    def made(self) -> dict[str, torch.Tensor]:
        return {**self.stack.row(self.index), **self.rest} if self.rest else self.stack.row(self.index)


class MadeOnRead:
    """A dict attribute that may hold an unmade :class:`Row` (kept in the slot ``_<name>``): made on first
    read, the dict from then on; :meth:`row` of the owner gives the Row while it is not made."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}"

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = getattr(obj, self.slot)
        if type(value) is Row:
            value = value.made()
            setattr(obj, self.slot, value)
        return value

    def __set__(self, obj: Any, value: dict[str, torch.Tensor]) -> None:
        setattr(obj, self.slot, value)

    def unmade(self, obj: Any) -> Row | None:
        value = getattr(obj, self.slot)
        return value if type(value) is Row else None


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


@dataclass(frozen=True)
class NoArgs:
    pass


ALGORITHMS: Registry[type["Algorithm"]] = Registry("algorithm")


class Algorithm:
    """Base class. Subclasses set ``name`` and ``Args`` (a frozen dataclass of their hyperparameters) and
    override hooks. The defaults implement FedAvg (McMahan et al., 2017)."""

    name: ClassVar[str] = "base"
    Args: ClassVar[type] = NoArgs

    def __init__(self, cfg: TrainConfig, dataset: FederatedDataset) -> None:
        self.cfg = cfg
        self.dataset = dataset
        self.args = parse_args(self.Args, cfg.algorithm.args, cfg.algorithm.name)
        torch.manual_seed(cfg.run.seed)  # the shared initial (or frozen) weights come from the seed
        self.model: nn.Module = build_model(cfg.model.name, dataset.input_shape, dataset.num_classes,
                                            **cfg.model.args)
        self.sites = model_sites(self.model)
        self.client_ids = [c.client_id for c in dataset.clients]
        self.global_params = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        self.global_buffers = {k: v.detach().clone() for k, v in self.model.named_buffers()}

    # -- helpers for subclasses ------------------------------------------------------------------------
    @functools.cached_property
    def client_index(self) -> dict[str, int]:
        """Each client's index in :attr:`client_ids` (its shuffle and random streams are named by it)."""
        return {cid: i for i, cid in enumerate(self.client_ids)}

    @functools.cached_property
    def dense_bytes(self) -> int:
        """The dense float32 global model with its buffers on the wire (FedAvg's downlink); its shapes are fixed
        for the run, so this is counted once."""
        return tensor_bytes({**self.global_params, **self.global_buffers})

    def client_data(self, cid: str):
        return self.dataset.client(cid)

    def call(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return stateless_call(self.model, {**params, **buffers}, (x,))

    def forward_of_params(self, params: dict[str, torch.Tensor], constants: dict[str, torch.Tensor],
                          x: torch.Tensor, buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        """The plain :attr:`LocalTask.forward`: the model on ``params`` and ``buffers`` (one method, so the
        tasks of a round share it)."""
        return self.call(params, buffers, x)

    def clone_global(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.global_params.items()}

    @property
    def local_epochs(self) -> int:
        return self.cfg.training.local_epochs

    # -- hooks -----------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Called once before the first round."""

    def round_clients(self, rnd: int, sampled: list[str]) -> list[str]:
        """The clients that train in round ``rnd``; ``sampled`` is the precomputed schedule's draw."""
        return sampled

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        return LocalTask(  # the global tensors themselves: the loops copy what they train (see LocalTask)
            trainable=dict(self.global_params),
            forward=self.forward_of_params,
            buffers=dict(self.global_buffers),
            epochs=self.local_epochs, lr=self.cfg.training.lr,
        )

    def client_update(self, cid: str, rnd: int, result: LocalResult) -> ClientUpdate:
        # the batch-norm running statistics travel with the weights, so they are costed too
        row = result.row()
        if row is not None:  # the batched loop's row: uploaded as a row too, its size the stack's per client
            payload = Row(row.stack, row.index, result.buffers)
            size = row.stack.row_bytes + tensor_bytes(result.buffers)
        else:
            payload = {**result.trained, **result.buffers}
            size = tensor_bytes(payload)
        return ClientUpdate(cid, result.num_samples, payload, bytes_up=size,
                            bytes_down=self.dense_bytes,
                            train_loss=result.loss,
                            samples_seen=result.samples_seen)

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """:meth:`client_update` of each of the round's clients, in order. An algorithm may compute them
        together (FedMask binarizes all clients' stacked scores in one op); the loop calls this."""
        return [self.client_update(cid, rnd, res) for cid, res in results]

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        self.average_params(updates, list(self.global_params))
        self.average_buffers(updates)

    # -- upload and aggregation helpers for subclasses ------------------------------------------------
    def partial_update(self, cid: str, result: LocalResult, keys: list[str]) -> ClientUpdate:
        """An upload of only ``keys`` (e.g. the body in FedPer/FedBABU) plus the batch-norm buffers; the same
        tensors come back down."""
        sent = {k: result.trained[k] for k in keys}
        return ClientUpdate(cid, result.num_samples, {**sent, **result.buffers}, bytes_up=tensor_bytes(sent),
                            bytes_down=tensor_bytes(sent), train_loss=result.loss, samples_seen=result.samples_seen)

    def average_params(self, updates: list[ClientUpdate], keys: list[str]) -> None:
        """FedAvg's sample-weighted average of the uploaded ``keys`` into the global parameters."""
        from trainer.aggregation import average_state, normalized, weighted_average

        weights = [u.num_samples for u in updates]
        stack = stacked_uploads(updates)
        if stack is not None and all(k in stack.tensors for k in keys):  # the batched loop's stack, as it is
            w = normalized(weights)
            avg = {k: weighted_average(stack.tensors[k], w) for k in keys}
        else:
            avg = average_state([u.payload for u in updates], weights, keys)
        self.global_params = {**self.global_params, **avg}

    def average_buffers(self, updates: list[ClientUpdate], weights: list[float] | None = None) -> None:
        """Average the batch-norm buffers the updates carry (sample-weighted unless ``weights``); integer
        buffers (``num_batches_tracked``) keep their dtype."""
        from trainer.aggregation import average_state

        if not self.global_buffers:
            return
        weights = weights if weights is not None else [u.num_samples for u in updates]
        keys = list(self.global_buffers)
        if stacked_uploads(updates) is not None and all(k in updates[0].row().rest for k in keys):
            states = [u.row().rest for u in updates]  # the buffers after the rows: no payload made
        else:
            states = [u.payload for u in updates]
        avg = average_state(states, weights, keys)
        self.global_buffers = {k: v.to(self.global_buffers[k].dtype) for k, v in avg.items()}

    def eval_model(self, cid: str) -> EvalModel:
        """The model client ``cid`` is evaluated with (default: the global one)."""
        return EvalModel(self.global_params, self.global_buffers, self.call)

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        """:meth:`eval_model` of each of ``cids`` (the batched loop asks for them together)."""
        return [self.eval_model(cid) for cid in cids]

    def eval_forward(self, cid: str) -> Callable[[torch.Tensor], torch.Tensor]:
        """Client ``cid``'s model as a function of a batch: :meth:`eval_model`'s, unless overridden."""
        return self.eval_model(cid)

    def evaluates_batched(self) -> bool:
        """Whether :meth:`eval_forward` is :meth:`eval_model`'s (not overridden), so clients can be evaluated
        together."""
        return type(self).eval_forward is Algorithm.eval_forward

    def masked_model(self, masks: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor]) -> EvalModel:
        """The global weights under a client's ``masks`` (:func:`~trainer.models.masking.effective_params`) as an
        :class:`EvalModel`. Its ``params`` hold the global weights too (under their names; the masks under
        :data:`MASK_PREFIX` + the weight's name): every client holds the very same weight tensors, so stacking
        them is a broadcast view, and they move to the evaluation device with the masks."""
        return EvalModel({**self.global_params, **{MASK_PREFIX + k: m for k, m in masks.items()}}, buffers,
                         self.masked_call)

    def masked_call(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor],
                    x: torch.Tensor) -> torch.Tensor:
        """The :attr:`EvalModel.forward` of :meth:`masked_model`: the weights in ``params`` under its masks."""
        weights = {k: v for k, v in params.items() if not k.startswith(MASK_PREFIX)}
        masks = {k[len(MASK_PREFIX):]: v for k, v in params.items() if k.startswith(MASK_PREFIX)}
        return self.call(effective_params(weights, masks, self.sites), buffers, x)

    def eval_masks(self, cid: str) -> dict[str, torch.Tensor]:
        """The client's current binary masks (empty: dense)."""
        return {}

    def trained_numel(self, cid: str) -> int:
        """How many elements the client optimizes locally (for the backward FLOPs of the update)."""
        return sum(v.numel() for v in self.global_params.values())

    def client_state(self, cid: str) -> ClientState:
        return ClientState()

    def shared_state(self) -> dict[str, torch.Tensor]:
        return {**self.global_params, **self.global_buffers}

    def summary_extra(self) -> dict[str, Any]:
        return {}

    def next_phase(self, cid: str, rnd: int, phase: int, result: LocalResult) -> LocalTask | None:
        """Phase ``phase`` (≥ 1) of client ``cid``'s local training this round, given the previous phase's
        result; ``None`` (the default) ends the round for this client."""
        return None

    def next_phases(self, rnd: int, phase: int, results: list[tuple[str, LocalResult]]) -> list[LocalTask | None]:
        """:meth:`next_phase` of each ``(client, result)``, in order; the batched loop asks for the clients of a
        phase together, and an algorithm may compute them at once (FedSelect's GradLTN pruning)."""
        return [self.next_phase(cid, rnd, phase, res) for cid, res in results]

    def global_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The server's global model (evaluated on ``dataset.global_test_x/y`` where the dataset has them)."""
        return lambda x: self.call(self.global_params, self.global_buffers, x)

    def finetune_task(self, cid: str) -> LocalTask | None:
        """After the last round: what client ``cid`` fine-tunes (``None``, the default: nothing)."""
        return None

    def finetune_result(self, cid: str, result: LocalResult) -> None:
        """Keep the outcome of :meth:`finetune_task` (it becomes the client's personalized model)."""

    def backward_flops(self, cid: str, fwd: int) -> int:
        """Backward FLOPs of one sample given its forward FLOPs: input gradients + weight gradients ≈ 2×."""
        return 2 * fwd


def parse_args(typ: type, raw: dict[str, Any], algo: str) -> Any:
    """Validate ``[algorithm.args]`` against the algorithm's dataclass; unknown keys list the valid ones."""
    fields = {f.name: f for f in dataclasses.fields(typ)}
    for k in raw:
        if k not in fields:
            valid = ", ".join(fields) or "(none)"
            raise ConfigError(f"algorithm {algo!r}: unknown argument {k!r} in [algorithm.args]; valid: {valid}")
    kw = {}
    for k, v in raw.items():
        d = fields[k].default
        if isinstance(d, float) and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if d is not dataclasses.MISSING and d is not None and not isinstance(v, type(d)):
            raise ConfigError(f"algorithm {algo!r}: argument {k!r} must be {type(d).__name__}, got {v!r}")
        kw[k] = v
    return typ(**kw)


def stacked_uploads(updates: list[ClientUpdate]) -> StackedRows | None:
    """The stack whose rows 0, 1, …, in order, the updates' unread payloads are (the batched loop's one chunk of
    FedAvg uploads; the buffers after the rows, under other names), else ``None``: the server may read its
    tensors for the uploads' (a payload once read may have been changed)."""
    first = updates[0].row() if updates else None
    if first is None or first.stack.count != len(updates):
        return None
    stack = first.stack
    for i, u in enumerate(updates):
        row = u.row()
        if row is None or row.stack is not stack or row.index != i or not stack.tensors.keys().isdisjoint(row.rest):
            return None
    return stack
