"""The algorithm interface: a few hooks around the one round loop (``trainer.simulation``) and the local-training
engines (``trainer.local_training``, ``trainer.batched``). An algorithm says what it is; it never writes a loop of
its own, nor chooses how its clients are trained. A hook that concerns several clients takes them as a list, in
order (the engines train, upload and evaluate a round's clients together): there is no one-client twin to keep in
step.

The hooks, in the order the round loop calls them:

* ``setup()`` — once, before round 0 (e.g. FedMask's one-shot pruning on every client);
* ``round_clients(rnd, sampled)`` — who trains this round (default: the sampled ones; Standalone: everyone);
* ``local_task(cid, rnd)`` — what client ``cid`` trains this round: a :class:`~trainer.records.LocalTask`;
* ``next_phases(rnd, phase, results)`` — another local-training phase in the same round for each client, given
  its previous phase's result (GradLTN's pruning iterations, FedRep's head-then-body, Ditto's personal model);
  ``None`` ends that client's round (default: one phase);
* ``client_updates(rnd, results)`` — the round's trained tensors become the uploads
  (:class:`~trainer.records.ClientUpdate`, costed in bytes);
* ``aggregate(rnd, updates)`` — the server's update from the round's uploads;
* ``eval_models(cids)`` — each client's personalized model for evaluation (:class:`~trainer.records.EvalModel`);
* ``eval_masks(cid)`` — the client's binary masks, for its FLOPs and kept parameters (default: none, dense);
* ``client_state(cid)`` / ``shared_state()`` — what the run directory stores.

Optional hooks, whose defaults do nothing special:

* ``finetune_task(cid)`` / ``finetune_result(cid, result)`` — after the last round, one more local training per
  client (PerFedMask's and FedBABU's head fine-tuning); accuracy is reported before and after;
* ``global_forward()`` — the server's global model, evaluated on the dataset's global test set when it has one;
* ``backward_flops(cid, fwd)`` — backward FLOPs per sample given the forward FLOPs (frozen layers cost less);
* ``summary_extra()`` — the algorithm's own entries in ``summary.json``.

The defaults implement FedAvg; the helpers below the hooks (:meth:`Algorithm.fedavg_upload`,
:meth:`~Algorithm.average_params`, :meth:`~Algorithm.masked_model`, :meth:`~Algorithm.train_tasks`, …) are
what an algorithm builds its hooks from. docs/adding-an-algorithm.md walks through FedProx.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
from torch import nn

from edgemask.registry import Registry
from edgemask.schema import read_dataclass
from trainer.accounting import tensor_bytes
from trainer.data.base import FederatedDataset
from trainer.models import build_model, model_sites
from trainer.models.masking import effective_params
from trainer.models.stateless import stateless_call
from trainer.batched_rows import Row, stacked_uploads
from trainer.records import ClientState, ClientUpdate, EvalModel, LocalResult, LocalTask, LocalTrainer
from trainer.task_functions import ModelSpec, model_context

if TYPE_CHECKING:  # an annotation only: the config validates algorithm names against ALGORITHMS
    from trainer.config import TrainConfig

MASK_PREFIX = "mask:"  # a mask's name in a masked model's EvalModel.params (Algorithm.masked_model)


@dataclass(frozen=True)
class NoArgs:
    """An algorithm without arguments of its own: ``[algorithm.args]`` must be empty."""


ALGORITHMS: Registry[type["Algorithm"]] = Registry("algorithm")


class Algorithm:
    """Base class. Subclasses set ``name`` and ``Args`` (a frozen dataclass of their hyperparameters) and
    override hooks. The defaults implement FedAvg (McMahan et al., 2017)."""

    name: ClassVar[str] = "base"
    Args: ClassVar[type] = NoArgs

    def __init__(self, cfg: TrainConfig, dataset: FederatedDataset, train: LocalTrainer | None = None) -> None:
        self.cfg = cfg
        self.dataset = dataset
        self._train = train
        self.args = parse_args(self.Args, cfg.algorithm.args, cfg.algorithm.name)
        torch.manual_seed(cfg.run.seed)  # the shared initial (or frozen) weights come from the seed
        self.model: nn.Module = build_model(cfg.model.name, dataset.input_shape, dataset.num_classes,
                                            **cfg.model.args)
        # what a LocalTask names as its model: the same build, from plain values (a Flower node builds it again)
        self.model_spec = ModelSpec.of(cfg.model.name, dataset.input_shape, dataset.num_classes, cfg.model.args,
                                       cfg.run.seed)
        self.model_context = model_context(self.model_spec, self.model)
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

    def train_tasks(self, tasks: list[LocalTask], data: list[tuple[torch.Tensor, torch.Tensor]],
                    orders: list[list[Any]], batch_size: int, momentum: float = 0.0,
                    weight_decay: float = 0.0) -> list[LocalResult]:
        """Local training outside the rounds, by the framework's engines (the :class:`LocalTrainer` this
        algorithm was built with: :func:`trainer.simulation.build_algorithm` gives it the host's)."""
        if self._train is None:
            raise RuntimeError(f"algorithm {self.name!r} trains outside the rounds but was built without a "
                               f"LocalTrainer: build it with trainer.simulation.build_algorithm, or pass "
                               f"train=trainer.simulation.host_trainer(cfg)")
        return self._train(tasks, data, orders, batch_size, momentum, weight_decay)

    def client_data(self, cid: str):
        return self.dataset.client(cid)

    def call(self, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return stateless_call(self.model, {**params, **buffers}, (x,))

    def clone_global(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.global_params.items()}

    @property
    def local_epochs(self) -> int:
        return self.cfg.training.local_epochs

    # -- hooks (see the module docstring) --------------------------------------------------------------
    def setup(self) -> None:
        """Called once before the first round."""

    def round_clients(self, rnd: int, sampled: list[str]) -> list[str]:
        """The clients that train in round ``rnd``; ``sampled`` is the precomputed schedule's draw."""
        return sampled

    def local_task(self, cid: str, rnd: int) -> LocalTask:
        """What client ``cid`` trains in round ``rnd`` (FedAvg: the global model, the run's settings)."""
        return LocalTask(  # the global tensors themselves: the loops copy what they train (see LocalTask)
            trainable=dict(self.global_params),
            model=self.model_spec,  # forward: the plain model (task function "model")
            buffers=dict(self.global_buffers),
            epochs=self.local_epochs, lr=self.cfg.training.lr,
        )

    def next_phases(self, rnd: int, phase: int, results: list[tuple[str, LocalResult]]) -> list[LocalTask | None]:
        """Phase ``phase`` (≥ 1) of each ``(client, previous phase's result)``'s local training this round, in
        order; ``None`` ends that client's round and its last result goes to :meth:`client_updates` (the
        default: one phase for everyone)."""
        return [None] * len(results)

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """The round's uploads, one per ``(client, result)``, in order (FedAvg: :meth:`fedavg_upload`)."""
        return [self.fedavg_upload(cid, res) for cid, res in results]

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        """The server's update from the round's uploads (FedAvg: the sample-weighted average)."""
        self.average_params(updates, list(self.global_params))
        self.average_buffers(updates)

    def eval_models(self, cids: list[str]) -> list[EvalModel]:
        """The model each of ``cids`` is evaluated with, in order (FedAvg: the global one for all)."""
        return [self.global_model()] * len(cids)

    def eval_masks(self, cid: str) -> dict[str, torch.Tensor]:
        """The client's current binary masks (empty: dense)."""
        return {}

    def train_masks(self, cid: str) -> dict[str, torch.Tensor]:
        """The binary masks the client's last local training computed with, for its training FLOPs (default:
        :meth:`eval_masks`, the masks it trained and infers with)."""
        return self.eval_masks(cid)

    # The name of the ``accuracy`` measure in summary.json's ``accuracies`` when :meth:`extra_eval_models` adds
    # others (FedMask: "local_mask"); None: one measure only.
    primary_accuracy: ClassVar[str | None] = None

    def extra_eval_models(self, cids: list[str]) -> dict[str, list[EvalModel]]:
        """Further models each of ``cids`` is evaluated with, by measure name (history metric
        ``accuracy_<name>``; summary.json ``accuracies``); default none."""
        return {}

    def client_state(self, cid: str) -> ClientState:
        """What the run directory stores of client ``cid`` (its masks and personal parameters)."""
        return ClientState()

    def shared_state(self) -> dict[str, torch.Tensor]:
        """What the run directory stores for every client (``model.safetensors``)."""
        return {**self.global_params, **self.global_buffers}

    # -- optional hooks ------------------------------------------------------------------------------------
    def finetune_task(self, cid: str) -> LocalTask | None:
        """After the last round: what client ``cid`` fine-tunes (``None``, the default: nothing)."""
        return None

    def finetune_result(self, cid: str, result: LocalResult) -> None:
        """Keep the outcome of :meth:`finetune_task` (it becomes the client's personalized model)."""

    def global_forward(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """The server's global model (evaluated on ``dataset.global_test_x/y`` where the dataset has them)."""
        return lambda x: self.call(self.global_params, self.global_buffers, x)

    def backward_flops(self, cid: str, fwd: int) -> int:
        """Backward FLOPs of one sample given its forward FLOPs: input gradients + weight gradients ≈ 2×."""
        return 2 * fwd

    def summary_extra(self) -> dict[str, Any]:
        """The algorithm's own entries in ``summary.json``."""
        return {}

    # -- helpers for the hooks: uploads, aggregation, models ---------------------------------------------
    def fedavg_upload(self, cid: str, result: LocalResult) -> ClientUpdate:
        """FedAvg's upload of one result: the trained tensors and the batch-norm running statistics (which travel
        with the weights, so they are costed too); the dense model comes back down."""
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

    def global_model(self) -> EvalModel:
        """The global model as an :class:`EvalModel` (every client's, in FedAvg)."""
        return EvalModel(self.global_params, self.global_buffers, self.call)

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

    def trained_numel(self, cid: str) -> int:
        """How many elements the client optimizes locally (for the backward FLOPs of the update)."""
        return sum(v.numel() for v in self.global_params.values())


def parse_args(typ: type, raw: dict[str, Any], algo: str, source: str | None = None) -> Any:
    """``[algorithm.args]`` of algorithm ``algo`` read into its ``Args`` dataclass. Each argument is declared once,
    on its field: type (the annotation), default, limits (:func:`edgemask.schema.setting`); a mistake reads like
    any other config mistake, ``<source>: [algorithm.args] key: what is wrong; what to do`` (``source``: the
    config file; a config built in code is named ``algorithm '<algo>'``)."""
    return read_dataclass(source or f"algorithm {algo!r}", "algorithm.args", raw, typ)
