"""The algorithm interface: a few hooks around the one round loop (``trainer.simulation``) and the local-training
engines (``trainer.local_training``, ``trainer.batched``). An algorithm says what it is; it never writes a loop of
its own, nor chooses how its clients are trained. A hook that concerns several clients takes them as a list, in
order (the engines train, upload and evaluate a round's clients together): there is no one-client twin to keep in
step.

The hooks, in the order the round loop calls them:

* ``setup()`` — once, before round 0 (e.g. FedMask's one-shot pruning on every client);
* ``round_clients(rnd, sampled)`` — who trains this round (default: the sampled ones; Standalone: everyone);
* ``local_task(cid, rnd)`` — what client ``cid`` trains this round: a :class:`~edgemask.trainer.records.LocalTask`;
* ``next_phases(rnd, phase, results)`` — another local-training phase in the same round for each client, given
  its previous phase's result (GradLTN's pruning iterations, FedRep's head-then-body, Ditto's personal model);
  ``None`` ends that client's round (default: one phase);
* ``client_updates(rnd, results)`` — the round's trained tensors become the uploads
  (:class:`~edgemask.trainer.records.ClientUpdate`, costed in bytes);
* ``aggregate(rnd, updates)`` — the server's update from the round's uploads;
* ``eval_models(cids)`` — each client's personalized model for evaluation
  (:class:`~edgemask.trainer.records.EvalModel`), or ``{measure: models}`` when the algorithm reports several (FedMask:
  the local and the returned mask; the first is the ``accuracy``, the others ``accuracy_<measure>``);
* ``eval_masks(cid)`` / ``train_masks(cid)`` — the client's binary masks, for its kept parameters and its training
  FLOPs (default: none, dense);
* ``client_state(cid)`` / ``shared_state()`` — what the run directory stores.

Optional hooks, whose defaults do nothing special:

* ``finetune_task(cid)`` / ``finetune_result(cid, result)`` — after the last round, one more local training per
  client (PerFedMask's and FedBABU's head fine-tuning); accuracy is reported before and after;
* ``backward_flops(cid, fwd)`` — backward FLOPs per sample given the forward FLOPs (frozen layers cost less);
* ``summary_extra()`` — the algorithm's own entries in ``summary.json``;
* ``client_state_bytes()`` / ``setup_bytes(devices, engine_pass)`` — host bytes it keeps per client, and what its
  set-up holds at its peak, for the memory estimate before anything is built (on the model's shapes:
  :func:`edgemask.trainer.footprint.of_shapes`).

The defaults implement FedAvg. An algorithm builds its hooks from plain functions over tensors, each in the module it
belongs to: uploads costed in bytes (:func:`edgemask.trainer.accounting.fedavg_upload`,
:func:`~edgemask.trainer.accounting.partial_upload`), the server's averages
(:func:`edgemask.trainer.aggregation.average_state`, :func:`~edgemask.trainer.aggregation.average_buffers`), masked
models (:func:`edgemask.trainer.masks.masked_model`); the model itself runs as ``self.model_context.call(params,
buffers, x)``, a client's data is ``self.dataset.client(cid)``, and local training outside the rounds goes through
``self.engine`` (:class:`~edgemask.trainer.records.Engine`). docs/adding-an-algorithm.md walks through FedProx.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
from torch import nn

from edgemask.errors import ConfigError
from edgemask.registry import Registry
from edgemask.schema import read_dataclass
from edgemask.trainer.accounting import fedavg_upload, tensor_bytes
from edgemask.trainer.aggregation import average_buffers, average_state
from edgemask.trainer.data.base import FederatedDataset
from edgemask.trainer.device_store import DeviceStore
from edgemask.trainer.models import build_model, model_sites
from edgemask.trainer.models.registry import one_value_norms
from edgemask.trainer.models.masking import dead_layers
from edgemask.trainer.records import ClientState, ClientUpdate, Engine, EvalModel, LocalResult, LocalTask
from edgemask.trainer.sampling import ends_alone
from edgemask.trainer.task_functions import ModelSpec, model_context

if TYPE_CHECKING:  # an annotation only: the config validates algorithm names against ALGORITHMS
    from edgemask.trainer.config import TrainConfig


@dataclass(frozen=True)
class NoArgs:
    """An algorithm without arguments of its own: ``[algorithm.args]`` must be empty."""


ALGORITHMS: Registry[type["Algorithm"]] = Registry("algorithm")


class _NoEngine:
    """The engine of an algorithm built without one (a unit test's of its hooks): training or evaluating clients
    says how to build it with one."""

    together = False

    def train(self, *args: Any, **kwargs: Any) -> list[LocalResult]:
        raise RuntimeError("this algorithm was built without an engine, so it cannot train or evaluate clients: "
                           "build it with trainer.simulation.build_algorithm, or pass "
                           "engine=trainer.engines.engine_for(cfg.training)")

    evaluate = groups = train


class Algorithm:
    """Base class. Subclasses set ``name`` and ``Args`` (a frozen dataclass of their hyperparameters) and
    override hooks. The defaults implement FedAvg (McMahan et al., 2017).

    What a hook reads (set here, plain data): ``cfg``, ``args`` (the parsed ``Args``), ``dataset``, ``engine``,
    ``model`` (the architecture, in the round loop's mode), ``model_spec`` and ``model_context`` (what a
    :class:`~edgemask.trainer.records.LocalTask` names as its model; ``model_context.call(params, buffers, x)`` runs
    it), ``sites`` (its mask sites), ``client_ids``, ``global_params`` / ``global_buffers`` (the server's model) and
    ``dense_bytes`` (that model with its buffers on the wire: FedAvg's downlink, fixed for the run), and ``store``
    (:class:`~edgemask.trainer.device_store.DeviceStore`): where every per-device state between rounds lives,
    ``self.store.table(name)`` a ``{cid: {name: tensor}}`` off the heap (a plain dict of every device's tensors would
    grow the host's memory with the device count: issue #45)."""

    name: ClassVar[str] = "base"
    Args: ClassVar[type] = NoArgs
    # Each client's upload (client_updates) reads its own result alone, and the result is larger than the upload
    # (FedMask's float32 scores against 1-bit masks): the round loop then makes a part's uploads as soon as the
    # part has trained and drops its results, instead of holding every result of the round until all have trained.
    uploads_alone: ClassVar[bool] = False

    def __init__(self, cfg: TrainConfig, dataset: FederatedDataset, engine: Engine | None = None, *,
                 meta: bool = False, state_dir: str | os.PathLike[str] | None = None) -> None:
        self.cfg = cfg
        self.dataset = dataset
        self.engine: Engine = engine if engine is not None else _NoEngine()
        self.args = parse_args(self.Args, cfg.algorithm.args, cfg.algorithm.name)
        torch.manual_seed(cfg.run.seed)  # the shared initial (or frozen) weights come from the seed
        # meta: every tensor a shape, no memory (edgemask.trainer.footprint.of_shapes)
        with torch.device("meta") if meta else contextlib.nullcontext():
            self.model: nn.Module = build_model(cfg.model.name, dataset.input_shape, dataset.num_classes,
                                                **cfg.model.args)
        # what a LocalTask names as its model: the same build, from plain values (a Flower node builds it again)
        self.model_spec = ModelSpec.of(cfg.model.name, dataset.input_shape, dataset.num_classes, cfg.model.args,
                                       cfg.run.seed)
        self.model_context = model_context(self.model_spec, self.model)
        self.sites = model_sites(self.model)
        self.client_ids = [c.client_id for c in dataset.clients]
        # whether an epoch's one-sample last minibatch is left out (training.one_sample_batch)
        self.drop_one_sample = one_sample_rule(cfg, dataset)
        # what the algorithm keeps per device between rounds, off the heap (trainer.device_store): in ``state_dir``
        # (edgemask train: beside the run directory) or anonymous temporary files
        self.store = DeviceStore(self.client_ids, state_dir)
        self.global_params = {k: v.detach().clone() for k, v in self.model.named_parameters()}
        self.global_buffers = {k: v.detach().clone() for k, v in self.model.named_buffers()}
        self.dense_bytes = tensor_bytes({**self.global_params, **self.global_buffers})

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
            epochs=self.cfg.training.local_epochs, lr=self.cfg.training.lr,
        )

    def next_phases(self, rnd: int, phase: int, results: list[tuple[str, LocalResult]]) -> list[LocalTask | None]:
        """Phase ``phase`` (≥ 1) of each ``(client, previous phase's result)``'s local training this round, in
        order; ``None`` ends that client's round and its last result goes to :meth:`client_updates` (the
        default: one phase for everyone)."""
        return [None] * len(results)

    def client_updates(self, rnd: int, results: list[tuple[str, LocalResult]]) -> list[ClientUpdate]:
        """The round's uploads, one per ``(client, result)``, in order (FedAvg:
        :func:`~edgemask.trainer.accounting.fedavg_upload`)."""
        return [fedavg_upload(cid, res, self.dense_bytes) for cid, res in results]

    def aggregate(self, rnd: int, updates: list[ClientUpdate]) -> None:
        """The server's update from the round's uploads (FedAvg: the sample-weighted average)."""
        states, n = [u.payload for u in updates], [u.num_samples for u in updates]
        self.global_params = {**self.global_params, **average_state(states, n, list(self.global_params))}
        self.global_buffers = average_buffers(self.global_buffers, states, n)

    def eval_models(self, cids: list[str]) -> list[EvalModel] | dict[str, list[EvalModel]]:
        """The model each of ``cids`` is evaluated with, in order (FedAvg: the global one for all); or, for several
        measures, ``{measure: models}`` (the first measure is ``accuracy``)."""
        return [EvalModel(self.global_params, self.global_buffers, self.model_context.call)] * len(cids)

    def eval_masks(self, cid: str) -> dict[str, torch.Tensor]:
        """The client's current binary masks (empty: dense)."""
        return {}

    def dead_layers(self, cid: str) -> list[str]:
        """The layers of the client's masked model with no live unit (collapse: ``CollapseWatch``), from
        :meth:`eval_masks`; an algorithm that holds its masks as bits answers from them."""
        return dead_layers(self.sites, self.eval_masks(cid))

    def train_masks(self, cid: str) -> dict[str, torch.Tensor]:
        """The binary masks the client's last local training computed with, for its training FLOPs (default:
        :meth:`eval_masks`, the masks it trained and infers with)."""
        return self.eval_masks(cid)

    def client_state(self, cid: str) -> ClientState:
        """What the run directory stores of client ``cid`` (its masks and personal parameters)."""
        return ClientState()

    def shared_state(self) -> dict[str, torch.Tensor]:
        """What the run directory stores for every client (``model.safetensors``)."""
        return {**self.global_params, **self.global_buffers}

    # -- optional hooks ------------------------------------------------------------------------------------
    def device_task(self, cid: str | None, state: ClientState) -> LocalTask | None:
        """The local task device ``cid`` runs in a round, rebuilt without :meth:`setup` from what the run
        directory keeps: ``state`` (its :meth:`client_state`; empty for the dense baseline, ``cid`` None) and the
        shared weights, loaded into ``global_params`` / ``global_buffers``. What a training artifact exports
        (:mod:`edgemask.export.training`, issue #39): the tensors and functions of a real round's step, so its cost
        is that step's. The default: :class:`Algorithm`'s own task (the whole model trainable, the run's
        settings) where the algorithm keeps it; ``None`` (no training artifact, said at export) where it trains
        something else and does not say how to rebuild it."""
        if type(self).local_task is not Algorithm.local_task:
            return None
        return Algorithm.local_task(self, cid or "dense", 0)

    def finetune_task(self, cid: str) -> LocalTask | None:
        """After the last round: what client ``cid`` fine-tunes (``None``, the default: nothing)."""
        return None

    def finetune_result(self, cid: str, result: LocalResult) -> None:
        """Keep the outcome of :meth:`finetune_task` (it becomes the client's personalized model)."""

    def backward_flops(self, cid: str, fwd: int) -> int:
        """Backward FLOPs of one sample given its forward FLOPs: input gradients + weight gradients ≈ 2×."""
        return 2 * fwd

    def trained_fraction(self, cid: str) -> float:
        """The part of the model's parameters device ``cid`` trains, in [0, 1]: what a board's local step costs
        scales with under ``[system]`` (:mod:`edgemask.trainer.system`; PerFedMask: ψ_n's share of d_w)."""
        return 1.0

    def summary_extra(self) -> dict[str, Any]:
        """The algorithm's own entries in ``summary.json``."""
        return {}

    def client_state_bytes(self) -> int:
        """Host bytes the algorithm keeps for each client between rounds, at most, from the model's shapes before
        anything is built (``edgemask train``'s memory estimate: :mod:`edgemask.trainer.footprint`, on
        :func:`~edgemask.trainer.footprint.of_shapes`); state at the size it is (a binary mask in bits). Default:
        none (FedAvg keeps nothing per client)."""
        return 0

    def setup_bytes(self, devices: int, engine_pass: Callable[[int], int]) -> int:
        """Host bytes :meth:`setup` holds at its peak for ``devices`` clients, at most, besides what the estimate
        counts already (the data, the shared model copies, :meth:`client_state_bytes` per device), from the
        model's shapes (:func:`~edgemask.trainer.footprint.of_shapes`); ``engine_pass(k)``: the bytes of the
        engine's stacked training of ``k`` clients' local tasks, for a set-up that trains (FedMask's
        ClientPruning). Default: none."""
        return 0


def one_sample_rule(cfg: TrainConfig, dataset: FederatedDataset) -> bool:
    """Whether the run leaves an epoch's last sample out where it would be a minibatch of its own
    (:func:`edgemask.trainer.sampling.drop_one_sample_batches`): ``training.one_sample_batch``.

    The papers leave it open. FedMask §4.1 runs VGG16 on FEMNIST's 28×28 writers, where conv11–13 are 1×1, so a
    one-sample minibatch gives their batch norms one value per channel, which torch refuses to train on; the
    paper gives no batch size ("Not given by the paper": configs/ic-emnist-fedmask.toml). ``"auto"`` (the default)
    drops it only for a model with such a batch norm (:func:`~edgemask.trainer.models.registry.one_value_norms`),
    so every run that trains without it is unchanged; ``"drop"`` drops it for every model; ``"keep"`` trains on
    it, and is refused up front where a device's epoch would end in such a minibatch. A batch size of 1 on such
    a model is refused whatever the setting: every minibatch would be one sample."""
    t = cfg.training
    rule = t.one_sample_batch
    if rule == "drop":
        return True
    norms = one_value_norms(cfg.model.name, dataset.input_shape, dataset.num_classes, cfg.model.args)
    if not norms:
        return False
    what = (f"model {cfg.model.name!r} on {'x'.join(map(str, dataset.input_shape))} inputs gives batch norm "
            f"{norms[0]!r} one value per channel in a one-sample minibatch, which training cannot normalize")
    if t.batch_size == 1:
        raise ConfigError(f"[training] batch_size = 1: {what}; set batch_size to 2 or more")
    if rule == "keep":
        ones = [c.client_id for c in dataset.clients if ends_alone(c.num_train, t.batch_size)]
        if ones:
            raise ConfigError(f"[training] one_sample_batch = \"keep\": {what}, and the epochs of {len(ones)} "
                              f"device(s) end in one (the first: {ones[0]!r}); set it to \"auto\" or \"drop\"")
    return rule == "auto"


def parse_args(typ: type, raw: dict[str, Any], algo: str, source: str | None = None) -> Any:
    """``[algorithm.args]`` of algorithm ``algo`` read into its ``Args`` dataclass. Each argument is declared once,
    on its field: type (the annotation), default, limits (:func:`edgemask.schema.setting`); a mistake reads like
    any other config mistake, ``<source>: [algorithm.args] key: what is wrong; what to do`` (``source``: the
    config file; a config built in code is named ``algorithm '<algo>'``)."""
    return read_dataclass(source or f"algorithm {algo!r}", "algorithm.args", raw, typ)
