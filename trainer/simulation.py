"""The one round loop. Every algorithm runs through :func:`simulate`; algorithms only write hooks."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from edgemask.workspace import check_name
from edgemask.trainer.accounting import (dense_reference, forward_flops_split_many, kept_counts, layer_positions,
                                         tensor_bytes)
from edgemask.trainer.algorithms import ALGORITHMS, Algorithm
from edgemask.trainer.allocator import release_free_memory, tune_host_allocator
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.device_store import EVAL_PART_BYTES, store_beside
from edgemask.trainer.engines import engine_for
from edgemask.trainer.footprint import TASK_PART_BYTES, Footprint, check_fits, estimate, history_rows
from edgemask.trainer.local_training import evaluate
from edgemask.trainer.records import ClientState, ClientUpdate, Engine, EvalModel, LocalResult, LocalTask
from edgemask.trainer.run_dir import check_room, run_lock, write_run
from edgemask.trainer.sampling import (batch_orders, client_seeds, clients_per_round, drop_one_sample_batches,
                                      sampling_schedule)
from edgemask.fedscale import TraceFile
from edgemask.trainer.system import System, TraceConfig

FINETUNE_ROUND = (1 << 30) + 1  # shuffle-stream tag of the fine-tuning epochs after the last round

# ``train_phase(algo, rnd, phase, [(cid, task), ...]) -> [LocalResult, ...]``: one local-training phase of round
# ``rnd`` for the given clients, one result per pair in their order. The default trains them on this host with the
# run's engine (:func:`train_phase_on_host`); ``trainer.flower`` sends them to Flower nodes instead.
PhaseTrainer = Callable[[Algorithm, int, int, list[tuple[str, LocalTask]]], list[LocalResult]]
Record = Callable[[int, str, str, float], None]  # (round, client, metric, value): one history row


@dataclass
class SimulationResult:
    config: TrainConfig
    algorithm: Algorithm
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def write(self, run_dir: Path) -> Path:
        algo = self.algorithm
        return write_run(run_dir, self.config, algo.shared_state(), ClientStates(algo), self.history, self.summary)


class ClientStates(Mapping):
    """``{cid: algo.client_state(cid)}``, each built when it is read: the run directory writes one client at a time,
    so only one client's unpacked masks are alive (400 devices' float32 masks of a VGG16 would be 24 GB)."""

    def __init__(self, algo: Algorithm) -> None:
        self.algo = algo

    def __getitem__(self, cid: str) -> ClientState:
        if cid not in self.algo.client_ids:
            raise KeyError(cid)
        return self.algo.client_state(cid)

    def __iter__(self) -> Iterator[str]:
        return iter(self.algo.client_ids)

    def __len__(self) -> int:
        return len(self.algo.client_ids)


def build_algorithm(cfg: TrainConfig, engine: Engine | None = None,
                    before_setup: Callable[[Algorithm], None] | None = None,
                    state_dir: Path | None = None) -> Algorithm:
    """``cfg``'s dataset and algorithm with its engine (default: the one ``[training]`` asks for,
    :func:`edgemask.trainer.engines.engine_for`), set up (``algo.setup()``) from the seeds, in training mode: the same
    instance on every host that builds it from the same config (a Flower client builds its own). ``before_setup(algo)``
    runs once the data and the model are built, before the set-up (a look at the built algorithm: tests, benchmarks).
    ``state_dir``: where its device store keeps the devices' state (:mod:`edgemask.trainer.device_store`; default:
    anonymous temporary files)."""
    ds = build_dataset(cfg.data, cfg.run.seed)
    engine = engine if engine is not None else engine_for(cfg.training, stacklevel=3)
    algo: Algorithm = ALGORITHMS.get(cfg.algorithm.name)(cfg, ds, engine, state_dir=state_dir)
    if before_setup is not None:
        before_setup(algo)
    torch.manual_seed(cfg.run.seed + 1)
    algo.model.train()
    algo.setup()
    return algo


def simulate(cfg: TrainConfig, progress: Callable[[int, int, dict[str, float]], None] | None = None,
             train_phase: PhaseTrainer | None = None,
             ready: Callable[[Algorithm], None] | None = None,
             before_setup: Callable[[Algorithm], None] | None = None,
             state_dir: Path | None = None) -> SimulationResult:
    """Run ``cfg.training.rounds`` rounds of ``cfg.algorithm`` and evaluate every client's personalized model.
    ``train_phase`` trains each phase of a round's clients elsewhere (e.g. on Flower nodes); by default this host
    trains them with the run's engine (:mod:`edgemask.trainer.engines`). ``ready(algo)`` is called once the algorithm is
    set up, before the first round (``train`` checks there that the run will fit on disk); ``before_setup(algo)`` before
    its set-up (:func:`build_algorithm`); ``state_dir`` holds its device store (:func:`build_algorithm`).

    History rows (long format): per round × sampled client, what :meth:`RoundCosts.record` lists; per evaluated
    round × client: ``accuracy``, ``test_loss`` (and ``accuracy_<name>``, ``test_loss_<name>`` of further
    measures); per round on ``server``: ``mean_accuracy`` (:func:`evaluate_clients`). Each evaluation checks the
    clients' models for collapse (:class:`CollapseWatch`: a warning when it finds new ones, summary.json's
    ``collapse``).
    """
    t0 = time.perf_counter()
    trace_files = read_trace(cfg)  # a device trace's files read and checked before any work
    tune_host_allocator()  # freed tensors reused, not faulted in again each step (trainer.allocator)
    algo = build_algorithm(cfg, before_setup=before_setup, state_dir=state_dir)
    release_free_memory()  # what the set-up freed, back to the OS between phases (trainer.allocator)
    if ready is not None:
        ready(algo)
    rounds = cfg.training.rounds
    system = deadlines(cfg, algo.client_ids, trace_files, algo.drop_one_sample)
    schedule = sampling_schedule(algo.client_ids, rounds, cfg.training.participation, cfg.run.seed,
                                 None if system is None else cfg.system.selected(system.k, len(algo.client_ids)))
    result = SimulationResult(cfg, algo)
    hist = result.history

    def record(rnd: int, client: str, metric: str, value: float) -> None:
        hist.append({"round": rnd, "client": client, "metric": metric, "value": float(value)})

    costs = RoundCosts(algo)
    watch = CollapseWatch(algo)
    mean_acc, measures = float("nan"), []
    if progress:
        progress(0, rounds, {})  # start the clock before the first round
    for rnd in range(rounds):
        cids, offline = algo.round_clients(rnd, schedule[rnd]), []
        if system is not None:  # a device offline at the round's start does not train (an availability trace)
            cids, offline = system.available(cids)
        trained, updates = [], []
        algo.store.pin(cids)  # a round reads its devices' state once and holds it until its aggregate
        if cids or system is None:
            def upload(part: list[tuple[str, LocalResult]]) -> list[tuple[str, LocalResult]]:
                # past the uploads, the round needs only the results' counts: their tensors go unless the
                # algorithm kept them
                updates.extend(algo.client_updates(rnd, part))
                return [(cid, LocalResult({}, {}, r.loss, r.samples_seen, r.num_samples)) for cid, r in part]

            if algo.uploads_alone:  # each part's uploads as soon as it has trained (Algorithm.uploads_alone)
                trained = train_clients(algo, cids, rnd, train_phase, each_part=upload)
            else:
                trained = upload(train_clients(algo, cids, rnd, train_phase))
            release_free_memory()
            costs.record(rnd, trained, updates, record)
        if system is not None:  # the uploads that arrive in time, as a deployment's server sees them
            updates = system.round(rnd, trained, updates, algo.trained_fraction, record, offline)
        if updates or system is None:  # nothing arrived: the server keeps its model
            algo.aggregate(rnd, updates)
        algo.store.unpin()
        release_free_memory()
        if (rnd + 1) % cfg.training.eval_every == 0 or rnd + 1 == rounds:
            mean_acc, measures = evaluate_clients(algo, rnd, record, watch)
            release_free_memory()
        if progress:
            progress(rnd + 1, rounds, {"mean_accuracy": mean_acc})
    if rounds == 0:
        mean_acc, measures = evaluate_clients(algo, 0, record, watch)
    before_ft = last_values(hist, algo.client_ids, "accuracy")
    if finetune(algo):  # accuracy after fine-tuning, recorded one round past the last
        mean_acc, measures = evaluate_clients(algo, rounds, record, watch)
    else:
        before_ft = {}
    result.summary = summarize(cfg, algo, hist, costs.totals, measures, before_ft, time.perf_counter() - t0,
                               watch.summary())
    if system is not None:
        result.summary["system"] = system.summary()
    return result


def read_trace(cfg: TrainConfig) -> tuple[TraceFile, TraceFile | None] | None:
    """The config's device trace (``[system.trace]``), its files read and checked (a mistake: one line naming the
    file and field), or None without one."""
    return cfg.system.trace.read_files() if cfg.system is not None and cfg.system.trace is not None else None


def deadlines(cfg: TrainConfig, client_ids: list[str],
              trace_files: tuple[TraceFile, TraceFile | None] | None = None,
              drop_one_sample: bool = False) -> System | None:
    """The run's ``[system]`` with its devices' boards (or trace clients: ``trace_files``, its device trace's files
    as read; default: read now), or None (a run as it always was). ``drop_one_sample``: the algorithm's
    ``training.one_sample_batch`` decision, so a device's round counts the steps it trained."""
    if cfg.system is None:
        return None
    k = clients_per_round(len(client_ids), cfg.training.participation)
    return System.build(cfg.system, list(client_ids), cfg.run.seed, cfg.training.batch_size, k, trace_files,
                        drop_one_sample)


class RoundCosts:
    """A round's communication and computation per trained client, and the run's totals (:attr:`totals`), with
    FedAvg's cost on the same model as the ratios' denominators
    (:func:`~edgemask.trainer.accounting.dense_reference`)."""

    def __init__(self, algo: Algorithm) -> None:
        self.algo = algo
        self.positions = layer_positions(algo.model, algo.sites, algo.dataset.clients[0].train_x[:1])
        self.ref = dense_reference(algo.model, algo.sites, self.positions)
        self.dense_params = sum(v.numel() for v in algo.global_params.values())
        self.totals = {"bytes_up": 0, "bytes_down": 0, "flops_train": 0, "flops_train_structured": 0,
                       "fedavg_bytes": 0, "fedavg_flops": 0}

    def record(self, rnd: int, trained: list[tuple[str, LocalResult]], updates: list[ClientUpdate],
               record: Record) -> None:
        """Per trained client: ``bytes_up``, ``bytes_down``, ``train_loss``, ``samples_seen`` (training samples the
        local training processed, all its epochs), ``flops_fwd`` / ``flops_bwd`` (the round's local training, with
        the client's masks, counting what element sparsity would save: zero weights skipped),
        ``flops_fwd_structured`` / ``flops_bwd_structured`` (counting only what structured removal saves: whole
        dead units; the paper's "computation cost"), ``params_kept``, ``bytes_up_vs_fedavg`` /
        ``bytes_down_vs_fedavg`` / ``flops_fwd_vs_fedavg`` / ``flops_fwd_structured_vs_fedavg`` (ratios to what
        FedAvg pays on the same model: dense float32 parameters and buffers, dense forward FLOPs per sample)."""
        algo, ref, tot = self.algo, self.ref, self.totals
        masks_of = [algo.train_masks(cid) for cid, _ in trained]  # what the round's forward passes ran
        # a client without masks runs the dense model: FedAvg's per-sample cost, counted once above
        masked = iter(forward_flops_split_many(algo.model, algo.sites, [m for m in masks_of if m], self.positions))
        kept = iter(kept_counts([m for cid, _ in trained if (m := algo.eval_masks(cid))]))
        dense_fwd = ref["flops_fwd"]
        for (cid, res), upd, masks in zip(trained, updates, masks_of):
            fwd, fwd_s = next(masked) if masks else (dense_fwd, dense_fwd)
            n = res.samples_seen
            fwd_train, fwd_train_s = fwd * n, fwd_s * n
            bwd_train, bwd_train_s = algo.backward_flops(cid, fwd) * n, algo.backward_flops(cid, fwd_s) * n
            for metric, value in (("bytes_up", upd.bytes_up), ("bytes_down", upd.bytes_down),
                                  ("train_loss", upd.train_loss), ("samples_seen", n),  # FedScale's batch × steps
                                  ("flops_fwd", fwd_train), ("flops_bwd", bwd_train),
                                  ("flops_fwd_structured", fwd_train_s), ("flops_bwd_structured", bwd_train_s),
                                  ("params_kept", next(kept) if masks else self.dense_params),
                                  ("bytes_up_vs_fedavg", upd.bytes_up / ref["bytes"]),
                                  ("bytes_down_vs_fedavg", upd.bytes_down / ref["bytes"]),
                                  ("flops_fwd_vs_fedavg", fwd / dense_fwd if dense_fwd else float("nan")),
                                  ("flops_fwd_structured_vs_fedavg", fwd_s / dense_fwd if dense_fwd else float("nan"))):
                record(rnd, cid, metric, value)
            tot["bytes_up"] += upd.bytes_up
            tot["bytes_down"] += upd.bytes_down
            tot["flops_train"] += fwd_train + bwd_train
            tot["flops_train_structured"] += fwd_train_s + bwd_train_s
            tot["fedavg_bytes"] += ref["bytes"]
            tot["fedavg_flops"] += 3 * dense_fwd * n


def evaluate_clients(algo: Algorithm, rnd: int, record: Record,
                     watch: CollapseWatch | None = None) -> tuple[float, list[str]]:
    """Every client's personalized model on its test split, by the run's engine, recorded in the history as
    ``accuracy`` / ``test_loss`` per client and ``mean_accuracy`` on ``server``; further measures an algorithm
    names (``eval_models`` returning ``{name: models}``: the first is ``accuracy``) as ``accuracy_<name>`` ...;
    the server's global model on the dataset's global test set where it has one (FedPeWS) as ``global_accuracy``,
    ``global_test_loss``. With a ``watch``, the personalized models (the first measure's) are checked for
    collapse (:meth:`CollapseWatch.check`). Returns the mean accuracy and the measures' names ([] when there is
    one)."""
    cids, ds = list(algo.client_ids), algo.dataset
    algo.model.eval()
    names: list[str] = []
    scores: dict[str, list[tuple[float, float]]] = {}
    found: dict[str, list[str]] = {}
    for part in eval_parts(algo, cids):  # a part's models at a time: their state read from the device store
        algo.store.pin(part)
        tests = [(d.test_x, d.test_y) for d in map(ds.client, part)]
        measures = algo.eval_models(part)
        named = measures if isinstance(measures, dict) else {"": measures}
        names = list(named)
        for i, (name, models) in enumerate(named.items()):
            scores.setdefault(name, []).extend(algo.engine.evaluate(models, tests))
            if i == 0 and watch is not None:
                found.update(watch.scan(part, models, tests))
        del measures, named
        algo.store.unpin()
    means = []
    for i, name in enumerate(names):  # the rows in the order of one evaluation of every client
        suffix = "" if i == 0 else f"_{name}"
        for cid, (acc, loss) in zip(cids, scores[name]):
            record(rnd, cid, f"accuracy{suffix}", acc)
            record(rnd, cid, f"test_loss{suffix}", loss)
        means.append(float(np.nanmean([a for a, _ in scores[name]])))
        record(rnd, "server", f"mean_accuracy{suffix}", means[-1])
    if watch is not None:
        watch.update(rnd, found)
    if ds.global_test_x is not None:  # the server's global model on the shared test set (FedPeWS)
        glob = EvalModel(algo.global_params, algo.global_buffers, algo.model_context.call)
        g_acc, g_loss = evaluate(glob, ds.global_test_x, ds.global_test_y)
        record(rnd, "server", "global_accuracy", g_acc)
        record(rnd, "server", "global_test_loss", g_loss)
    algo.model.train()
    return means[0], names if names != [""] else []


def eval_parts(algo: Algorithm, cids: list[str]) -> list[list[str]]:
    """The clients an evaluation builds models for at once: as many as :data:`EVAL_PART_BYTES` of their stored state
    (:meth:`~edgemask.trainer.device_store.DeviceStore.bytes_per_device`) allow, so the host holds a part's, not
    every device's (a run of few devices is one part: evaluated as it always was)."""
    step = max(1, EVAL_PART_BYTES // max(algo.store.bytes_per_device(), 1))
    return [cids[s: s + step] for s in range(0, len(cids), step)]


def output_varies(model: EvalModel, x: torch.Tensor, rows: int = 16) -> bool | None:
    """Whether ``model``'s logits differ between the first ``rows`` inputs of ``x`` (beyond float rounding: a
    layer that outputs zeros makes every later row the same function of zeros); None when those inputs are all
    the same (or fewer than two), so the outputs say nothing."""
    x = x[:rows]
    if len(x) < 2 or bool((x == x[:1]).all()):
        return None
    device = next(iter(model.params.values())).device if model.params else x.device
    with torch.no_grad():
        y = model(x.to(device)).detach().float().cpu()  # (rows, classes)
    first = y[:1].expand_as(y)
    return not torch.allclose(y, first, rtol=1e-5, atol=1e-6 * (1.0 + float(first.abs().max())))


class CollapseWatch:
    """The clients whose personalized model has collapsed, from one evaluation to the next. A client has collapsed
    when its masked model (``algo.eval_masks``) has a layer with no live unit AND its logits are the same for
    different test inputs: a dead layer that a residual branch bypasses cuts nothing, so the outputs confirm it
    (a client whose test inputs are all alike is judged by the dead layer alone). A model whose output is constant
    with every layer alive (every ReLU's input negative) is not looked for. An algorithm without masks never
    collapses.

    :meth:`check` warns once per evaluation that finds clients not collapsed at the evaluation before (one line:
    the round, how many, an example client and its first dead layer, the settings that drive it: :meth:`settings`);
    :meth:`summary` is summary.json's ``collapse`` (docs/contracts.md)."""

    def __init__(self, algo: Algorithm) -> None:
        self.algo = algo
        self.clients: dict[str, dict[str, Any]] = {}  # cid -> {"round": counted from 1, "layers": [dead layers]}

    def check(self, rnd: int, cids: list[str], models: list[EvalModel],
              tests: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Round ``rnd``'s evaluation (0-based; ``rounds`` after fine-tuning) of ``cids``' ``models`` on ``tests``."""
        self.update(rnd, self.scan(cids, models, tests))

    def scan(self, cids: list[str], models: list[EvalModel],
             tests: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, list[str]]:
        """The collapsed ones of ``cids`` (their models on their ``tests``), with their dead layers: a part of an
        evaluation (:meth:`update` takes them all)."""
        found = {}
        for cid, model, (x, _) in zip(cids, models, tests):
            dead = self.algo.dead_layers(cid)
            if dead and not output_varies(model, x):
                found[cid] = dead
        return found

    def update(self, rnd: int, found: dict[str, list[str]]) -> None:
        """The evaluation of round ``rnd`` found ``found`` (every part's :meth:`scan`) collapsed."""
        new = [cid for cid in found if cid not in self.clients]
        self.clients = {cid: {"round": self.clients[cid]["round"] if cid in self.clients else rnd + 1,
                              "layers": dead} for cid, dead in found.items()}
        if new:
            warnings.warn(self.line(rnd, new), stacklevel=2)

    def settings(self) -> dict[str, Any]:
        """The ``[algorithm.args]`` that drive a collapse, with the run's values: those an algorithm class names in
        its ``collapse_settings`` (a tuple of names, FedMask's ``("lambda_r", "prune_rate")``; none by default, so
        the base class keeps only its hooks)."""
        return {name: getattr(self.algo.args, name) for name in getattr(type(self.algo), "collapse_settings", ())}

    def line(self, rnd: int, new: list[str]) -> str:
        """The warning: ``round 8: 4 client(s) collapsed (8 of 8 now): client-000's model has no live unit in
        'stem' (and 7 more layers) and gives every test input the same output; it depends on [algorithm.args]
        lambda_r = 0.002, prune_rate = 0.2 (docs/fedmask.md, "Collapse")``."""
        when = "after fine-tuning" if rnd >= self.algo.cfg.training.rounds else f"round {rnd + 1}"
        cid, layers = new[0], self.clients[new[0]]["layers"]
        more = f" (and {len(layers) - 1} more layer{'s' if len(layers) > 2 else ''})" if len(layers) > 1 else ""
        settings = ", ".join(f"{k} = {v}" for k, v in self.settings().items())
        drive = f"; it depends on [algorithm.args] {settings}" if settings else ""
        return (f"{when}: {len(new)} client(s) collapsed ({len(self.clients)} of {len(self.algo.client_ids)} now): "
                f"{cid}'s model has no live unit in {layers[0]!r}{more} and gives every test input the same output"
                f"{drive} (docs/fedmask.md, \"Collapse\")")

    def summary(self) -> dict[str, Any]:
        """summary.json's ``collapse``: the clients collapsed at the last evaluation (``{cid: {"round", "layers"}}``,
        ``round`` counted from 1: the evaluation that found it, since when it has stayed collapsed), whether that is
        every client (``all_collapsed``), and the settings that drive it with their values (``settings``)."""
        n = len(self.algo.client_ids)
        return {"clients": {cid: self.clients[cid] for cid in sorted(self.clients)},
                "all_collapsed": bool(n) and len(self.clients) == n, "settings": self.settings()}


def last_values(hist: list[dict[str, Any]], cids: list[str], metric: str) -> dict[str, float]:
    """Each client's last recorded ``metric``."""
    return {cid: next(r["value"] for r in reversed(hist) if r["client"] == cid and r["metric"] == metric)
            for cid in cids}


def summarize(cfg: TrainConfig, algo: Algorithm, hist: list[dict[str, Any]], totals: dict[str, int],
              measures: list[str], before_ft: dict[str, float], wall: float,
              collapse: dict[str, Any] | None = None) -> dict[str, Any]:
    """summary.json: each client's final accuracy (before fine-tuning too, and per measure where ``eval_models``
    names several: ``measures``, the first being ``accuracy``), the means, the totals and their ratios to what
    FedAvg pays for the same updates, the collapsed clients (``collapse``: :meth:`CollapseWatch.summary`) and the
    algorithm's own entries."""
    cids = algo.client_ids
    final = last_values(hist, cids, "accuracy")
    accuracies = {measures[0]: final, **{name: last_values(hist, cids, f"accuracy_{name}")
                                         for name in sorted(measures[1:])}} if measures else {}
    fedavg_bytes, fedavg_flops = max(totals["fedavg_bytes"], 1), max(totals["fedavg_flops"], 1)
    return {
        "run_id": cfg.run_id, "algorithm": cfg.algorithm.name, "model": cfg.model.name, "dataset": cfg.data.name,
        "rounds": cfg.training.rounds, "num_clients": len(cids),
        "clients": {cid: {"accuracy": a, **({"accuracy_before_finetune": before_ft[cid]} if before_ft else {}),
                          **({"accuracies": {k: v[cid] for k, v in accuracies.items()}} if accuracies else {})}
                    for cid, a in final.items()},
        **global_summary(hist, cfg.training.target_accuracy),
        "mean_accuracy": float(np.nanmean(list(final.values()))),
        **({"mean_accuracies": {k: float(np.nanmean(list(v.values()))) for k, v in accuracies.items()}}
           if accuracies else {}),
        "bytes_up": totals["bytes_up"], "bytes_down": totals["bytes_down"],
        "flops_train": totals["flops_train"],  # element sparsity: what skipping every zero weight would save
        "flops_train_structured": totals["flops_train_structured"],  # whole dead units only: computation cost
        "vs_fedavg": {  # the same updates as FedAvg would have cost them (dense float32 model, dense FLOPs)
            "bytes_up": totals["bytes_up"] / fedavg_bytes, "bytes_down": totals["bytes_down"] / fedavg_bytes,
            "flops_train": totals["flops_train"] / fedavg_flops,
            "flops_train_structured": totals["flops_train_structured"] / fedavg_flops},
        "params_dense": sum(v.numel() for v in algo.global_params.values()),
        "wall_seconds": wall,
        **({"collapse": collapse} if collapse is not None else {}),
        **algo.summary_extra(),
    }


def phase_stream(client_index: int, num_clients: int, phase: int) -> int:
    """The index that names a client's shuffle stream (:func:`edgemask.trainer.sampling.batch_orders`) and random stream
    (:func:`edgemask.trainer.sampling.client_seed`) in local-training phase ``phase``: the client's index, plus
    ``phase`` times the number of clients."""
    return client_index + phase * num_clients


def phase_streams(algo: Algorithm, phase: int, pairs: list[tuple[str, LocalTask]]) -> list[int]:
    """:func:`phase_stream` of each pair's client."""
    ids = algo.client_ids
    index = {cid: i for i, cid in enumerate(ids)}
    return [phase_stream(index[cid], len(ids), phase) for cid, _ in pairs]


def train_phase_on_host(algo: Algorithm, rnd: int, phase: int,
                        pairs: list[tuple[str, LocalTask]]) -> list[LocalResult]:
    """One phase of round ``rnd`` for the ``(cid, task)`` pairs on this host, by the algorithm's engine."""
    return train_on_data(algo.cfg, algo.engine, rnd, [algo.dataset.client(cid) for cid, _ in pairs],
                         phase_streams(algo, phase, pairs), [task for _, task in pairs], algo.drop_one_sample)


def train_on_data(cfg: TrainConfig, engine: Engine, rnd: int, data: list[Any], streams: list[int],
                  tasks: list[LocalTask], drop_one_sample: bool = False) -> list[LocalResult]:
    """``tasks[i]`` on the client data ``data[i]`` (its ``train_x``, ``train_y``) in round ``rnd``'s batch orders
    of shuffle stream ``streams[i]`` (:func:`phase_stream`), by ``engine``: what a phase needs besides the tasks,
    which a Flower node has without an algorithm. ``drop_one_sample``: an epoch's one-sample last minibatch left
    out (:func:`edgemask.trainer.algorithms.base.one_sample_rule`)."""
    t = cfg.training
    order = batch_orders([d.num_train for d in data], [task.epochs for task in tasks], cfg.run.seed, rnd, streams)
    if drop_one_sample:
        order = drop_one_sample_batches(order, t.batch_size)
    return engine.train(tasks, [(d.train_x, d.train_y) for d in data], order, t.batch_size, t.momentum,
                        t.weight_decay)


def train_clients(algo: Algorithm, cids: list[str], rnd: int, train_phase: PhaseTrainer | None = None,
                  each_part: Callable[[list[tuple[str, LocalResult]]], list[tuple[str, LocalResult]]] | None = None
                  ) -> list[tuple[str, LocalResult]]:
    """Round ``rnd``'s local training of ``cids``, every phase (``algo.next_phases``) included; the result's
    ``samples_seen`` sums the phases. The clients go in the engine's groups
    (:meth:`~edgemask.trainer.records.Engine.groups`: the batched engine's one group trains each phase's clients
    together, the sequential one trains a client's every phase before the next client's; a group whose tasks are
    large is cut into parts, :func:`task_parts`) or, with a ``train_phase``, all together, wherever it trains them: the
    same results. ``each_part``: what a part's results become once all its phases have trained, before the next part
    trains (the round loop's uploads, :attr:`Algorithm.uploads_alone`)."""
    def run(pairs: list[tuple[str, LocalTask]], phase: int) -> list[LocalResult]:
        seed_tasks(algo, rnd, phase, pairs)
        release_free_memory()  # what building the tasks freed, before the training takes its own
        return (train_phase or train_phase_on_host)(algo, rnd, phase, pairs)

    out = []
    for group in ([list(cids)] if train_phase else task_parts(algo, algo.engine.groups(cids), rnd)):
        pairs = [(cid, algo.local_task(cid, rnd)) for cid in group] if train_phase else group
        group = [cid for cid, _ in pairs]
        results = dict(zip(group, run(pairs, 0)))
        del pairs  # a task's tensors (FedMask's start scores) are not needed past its training
        release_free_memory()
        seen = {cid: r.samples_seen for cid, r in results.items()}
        pending, phase = list(group), 1
        while pending:  # the clients that go on to another phase, together again
            asked = algo.next_phases(rnd, phase, [(cid, results[cid]) for cid in pending])
            nxt = [(cid, task) for cid, task in zip(pending, asked) if task is not None]
            pending, phase = [cid for cid, _ in nxt], phase + 1
            results.update(zip(pending, run(nxt, phase - 1) if nxt else []))
            for cid in pending:
                seen[cid] += results[cid].samples_seen
        # no name outlives the part but ``out``: a loop variable left bound to a result kept its tensors (with the
        # batched engine, rows of the whole part's storage) through the next part's training
        for cid in group:
            results[cid].samples_seen = seen[cid]
        part = [(cid, results.pop(cid)) for cid in group]
        out += part if each_part is None else each_part(part)
        del part
    return out


def task_parts(algo: Algorithm, groups: list[list[str]], rnd: int) -> Iterator[list[tuple[str, LocalTask]]]:
    """The engine's ``groups`` of round ``rnd``'s clients with their tasks (``algo.local_task``), each group cut where
    its tasks' trainable tensors pass :data:`TASK_PART_BYTES`, built as they are reached: a round of 20 full-width
    FedMask devices holds one part's start scores, not all 20 (1.2 GB). Parts below the budget are the groups as
    they were (a small model's round is one part)."""
    for group in groups:
        part, size = [], 0
        for cid in group:
            task = algo.local_task(cid, rnd)
            part.append((cid, task))
            size += tensor_bytes(task.trainable)
            if size >= TASK_PART_BYTES:
                yield part
                part, size = [], 0
        if part:
            yield part


def seed_tasks(algo: Algorithm, rnd: int, phase: int, pairs: list[tuple[str, LocalTask]]) -> None:
    """Give each task its client's random stream for round ``rnd``, phase ``phase`` (:attr:`LocalTask.seed`)."""
    seeds = client_seeds(algo.cfg.run.seed, rnd, phase_streams(algo, phase, pairs))
    for (_, task), s in zip(pairs, seeds):
        task.seed = s


def finetune(algo: Algorithm) -> bool:
    """After the last round, each client trains what ``algo.finetune_task`` names (e.g. its head), as one more
    phase of a round numbered :data:`FINETUNE_ROUND`, in the engine's groups. Whether any client fine-tuned."""
    tuned = False
    for group in algo.engine.groups(algo.client_ids):
        pairs = [(cid, task) for cid in group if (task := algo.finetune_task(cid)) is not None]
        if pairs:
            seed_tasks(algo, FINETUNE_ROUND, 0, pairs)
            for (cid, _), res in zip(pairs, train_phase_on_host(algo, FINETUNE_ROUND, 0, pairs)):
                algo.finetune_result(cid, res)
            tuned = True
    return tuned


def global_summary(hist: list[dict[str, Any]], target: float | None) -> dict[str, Any]:
    """Final accuracy of the global model on the global test set and, with a target accuracy υ, the number of
    rounds to reach it (FedPeWS Table 2: the first round t, counted from 1, whose accuracy is ≥ υ; None if never)."""
    rows = [(r["round"], r["value"]) for r in hist if r["client"] == "server" and r["metric"] == "global_accuracy"]
    if not rows:
        return {}
    out: dict[str, Any] = {"global_accuracy": rows[-1][1]}
    if target is not None:
        out["target_accuracy"] = target
        out["rounds_to_target"] = next((rnd + 1 for rnd, v in rows if v >= target), None)
    return out


def train(cfg: TrainConfig, runs_root: Path, progress=None, memory: Callable[[Footprint], None] | None = None,
          memory_check: bool = True, source: str | None = None) -> Path:
    """Simulate and write ``runs_root/<run-id>/``, holding the run's lock from before the first round (a second
    training of the run id leaves at once, and an unwritable ``runs/`` is found before the work). First of all,
    before the data is partitioned or a model built, the run's memory is estimated from its config and its
    dataset's sizes (:func:`edgemask.trainer.footprint.estimate`), handed to ``memory`` (the CLI prints it) and,
    with ``memory_check``, a run that cannot fit this host is refused, naming ``source`` (the config): nothing
    of its size has been allocated, and nothing is written."""
    path = Path(runs_root) / check_name(cfg.run_id, "run.run_id")
    trace_files = read_trace(cfg)  # a device trace's mistakes said before anything else (simulate reads it again)
    fp = estimate(cfg)
    if trace_files is not None:  # as many trace clients as the data's devices
        TraceConfig.check_size(trace_files, fp.devices)
    if memory_check:  # a refusal says the figures itself
        check_fits(fp, source or f"run {cfg.run_id}")
    with run_lock(path):
        if memory is not None:  # said once the run is this process's to train (a second training leaves first)
            memory(fp)
        with store_beside(path) as state_dir:  # the devices' state between rounds, off the heap
            return simulate(cfg, progress, ready=room_check(cfg, path), state_dir=state_dir).write(path)


def room_check(cfg: TrainConfig, path: Path) -> Callable[[Algorithm], None]:
    """``simulate``'s ``ready``: the run's size is known once the model is built, so refuse a run that will not
    fit at ``path`` then, before the first round (:func:`edgemask.trainer.run_dir.check_room`)."""

    def fits(algo: Algorithm) -> None:
        cids = list(algo.client_ids)
        check_room(path, algo.shared_state(), algo.client_state(cids[0]), len(cids), history_rows(cfg, len(cids)),
                   algo.store.bytes_to_come())

    return fits
