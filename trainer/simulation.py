"""The one round loop. Every algorithm runs through :func:`simulate`; algorithms only write hooks."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from edgemask.workspace import check_name
from trainer.accounting import dense_reference, forward_flops_split_many, kept_counts, layer_positions
from trainer.algorithms import ALGORITHMS, Algorithm
from trainer.allocator import tune_host_allocator
from trainer.batched import evaluate_many, local_train_batched, resolve_device
from trainer.config import TrainConfig
from trainer.data import build_dataset
from trainer.local_training import evaluate, local_train
from trainer.records import LocalResult, LocalTask, LocalTrainer
from trainer.run_dir import check_room, run_lock, write_run
from trainer.sampling import batch_orders, client_seeds, clients_per_round, sampling_schedule

FINETUNE_ROUND = (1 << 30) + 1  # shuffle-stream tag of the fine-tuning epochs after the last round

# ``train_phase(algo, rnd, phase, [(cid, task), ...]) -> [LocalResult, ...]``: one local-training phase of round
# ``rnd`` for the given clients, one result per pair in their order. The default trains them on this host
# (:func:`train_phase_on_host`); ``trainer.flower`` sends them to Flower nodes instead.
PhaseTrainer = Callable[[Algorithm, int, int, list[tuple[str, LocalTask]]], list[LocalResult]]


@dataclass
class SimulationResult:
    config: TrainConfig
    algorithm: Algorithm
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def write(self, run_dir: Path) -> Path:
        clients = {cid: self.algorithm.client_state(cid) for cid in self.algorithm.client_ids}
        return write_run(run_dir, self.config, self.algorithm.shared_state(), clients, self.history, self.summary)


def host_trainer(cfg: TrainConfig) -> LocalTrainer:
    """The :class:`~trainer.records.LocalTrainer` an algorithm is built with: its tasks trained on this host, all
    together (:func:`trainer.batched.local_train_batched`) with ``training.batched``, else one after another."""
    t = cfg.training

    def train(tasks: list[LocalTask], data: list[tuple[torch.Tensor, torch.Tensor]], orders: list[list[Any]],
              batch_size: int, momentum: float = 0.0, weight_decay: float = 0.0) -> list[LocalResult]:
        if t.batched:
            return local_train_batched(tasks, data, orders, batch_size, momentum, weight_decay, t.device)
        return [local_train(task, x, y, o, batch_size, momentum, weight_decay)
                for task, (x, y), o in zip(tasks, data, orders)]
    return train


def build_algorithm(cfg: TrainConfig) -> Algorithm:
    """``cfg``'s dataset and algorithm, set up (``algo.setup()``) from the seeds, in training mode: the same
    instance on every host that builds it from the same config (a Flower client builds its own)."""
    ds = build_dataset(cfg.data, cfg.run.seed)
    algo: Algorithm = ALGORITHMS.get(cfg.algorithm.name)(cfg, ds, host_trainer(cfg))
    torch.manual_seed(cfg.run.seed + 1)
    algo.model.train()
    algo.setup()
    return algo


def simulate(cfg: TrainConfig, progress: Callable[[int, int, dict[str, float]], None] | None = None,
             train_phase: PhaseTrainer | None = None,
             ready: Callable[[Algorithm], None] | None = None) -> SimulationResult:
    """Run ``cfg.training.rounds`` rounds of ``cfg.algorithm`` and evaluate every client's personalized model.
    ``train_phase`` trains each phase of a round's clients elsewhere (e.g. on Flower nodes); by default this host
    trains them, batched or one after another (``training.batched``). ``ready(algo)`` is called once the algorithm
    is set up, before the first round (``train`` checks there that the run will fit on disk).

    History rows (long format): per round × sampled client: ``bytes_up``, ``bytes_down``, ``train_loss``,
    ``samples_seen`` (training samples the local training processed, all its epochs),
    ``flops_fwd`` / ``flops_bwd`` (the round's local training, with the client's masks, counting what element
    sparsity would save: zero weights skipped), ``flops_fwd_structured`` / ``flops_bwd_structured`` (the same
    training counting only what structured removal saves: whole dead units; the paper's "computation cost"),
    ``params_kept``, ``bytes_up_vs_fedavg`` / ``bytes_down_vs_fedavg`` / ``flops_fwd_vs_fedavg`` /
    ``flops_fwd_structured_vs_fedavg`` (ratios to what FedAvg pays on the same model: dense float32 parameters
    and buffers, dense forward FLOPs per sample);
    per evaluated round × client: ``accuracy``, ``test_loss``; per round on ``server``: ``mean_accuracy``.
    """
    t0 = time.perf_counter()
    tune_host_allocator()  # freed tensors reused, not faulted in again each step (trainer.allocator)
    asked = cfg.training.device
    if cfg.training.batched and resolve_device(asked).type != torch.device(asked).type:
        warnings.warn(f"training.device {asked!r}: this torch ({torch.__version__}) sees no CUDA device, so the "
                      f"clients train and evaluate on the CPU", RuntimeWarning, stacklevel=2)
    algo = build_algorithm(cfg)
    if ready is not None:
        ready(algo)
    ds = algo.dataset
    schedule = sampling_schedule(algo.client_ids, cfg.training.rounds, cfg.training.participation, cfg.run.seed)
    example = ds.clients[0].train_x[:1]
    positions = layer_positions(algo.model, algo.sites, example)
    ref = dense_reference(algo.model, algo.sites, positions)  # FedAvg's cost on this model: the ratios' denominators
    result = SimulationResult(cfg, algo)
    hist = result.history
    totals = {"bytes_up": 0, "bytes_down": 0, "flops_train": 0, "flops_train_structured": 0, "fedavg_bytes": 0,
              "fedavg_flops": 0}

    def record(rnd: int, client: str, metric: str, value: float) -> None:
        hist.append({"round": rnd, "client": client, "metric": metric, "value": float(value)})

    def eval_all(rnd: int) -> float:
        algo.model.eval()
        accs = []
        tests = [(d.test_x, d.test_y) for d in map(algo.client_data, algo.client_ids)]
        models = algo.eval_models(list(algo.client_ids))
        if cfg.training.batched:  # every client's model at once
            scores = evaluate_many(models, tests, device=cfg.training.device)
        else:  # one after another: the reference
            scores = [evaluate(model, x, y) for model, (x, y) in zip(models, tests)]
        for cid, (acc, loss) in zip(algo.client_ids, scores):
            record(rnd, cid, "accuracy", acc)
            record(rnd, cid, "test_loss", loss)
            accs.append(acc)
        mean = float(np.nanmean(accs))
        record(rnd, "server", "mean_accuracy", mean)
        for name, extra in algo.extra_eval_models(list(algo.client_ids)).items():  # further labelled measures
            if cfg.training.batched:
                scores = evaluate_many(extra, tests, device=cfg.training.device)
            else:
                scores = [evaluate(model, x, y) for model, (x, y) in zip(extra, tests)]
            for cid, (acc, loss) in zip(algo.client_ids, scores):
                record(rnd, cid, f"accuracy_{name}", acc)
                record(rnd, cid, f"test_loss_{name}", loss)
            record(rnd, "server", f"mean_accuracy_{name}", float(np.nanmean([a for a, _ in scores])))
        if ds.global_test_x is not None:  # the server's global model on the shared test set (FedPeWS)
            g_acc, g_loss = evaluate(algo.global_forward(), ds.global_test_x, ds.global_test_y)
            record(rnd, "server", "global_accuracy", g_acc)
            record(rnd, "server", "global_test_loss", g_loss)
        algo.model.train()
        return mean

    mean_acc = float("nan")
    if progress:
        progress(0, cfg.training.rounds, {})  # start the clock before the first round
    for rnd in range(cfg.training.rounds):
        trained = train_clients(algo, algo.round_clients(rnd, schedule[rnd]), rnd, train_phase)
        updates = algo.client_updates(rnd, trained)
        masks_of = [algo.train_masks(cid) for cid, _ in trained]  # what the round's forward passes ran
        # a client without masks runs the dense model: FedAvg's per-sample cost, counted once above
        with_masks = [m for m in masks_of if m]
        masked = iter(forward_flops_split_many(algo.model, algo.sites, with_masks, positions))
        kept = iter(kept_counts([m for cid, _ in trained if (m := algo.eval_masks(cid))]))
        for (cid, res), upd, masks in zip(trained, updates, masks_of):
            fwd, fwd_s = next(masked) if masks else (ref["flops_fwd"], ref["flops_fwd"])
            fwd_train, fwd_train_s = fwd * res.samples_seen, fwd_s * res.samples_seen
            bwd_train = algo.backward_flops(cid, fwd) * res.samples_seen
            bwd_train_s = algo.backward_flops(cid, fwd_s) * res.samples_seen
            record(rnd, cid, "bytes_up", upd.bytes_up)
            record(rnd, cid, "bytes_down", upd.bytes_down)
            record(rnd, cid, "train_loss", upd.train_loss)
            record(rnd, cid, "samples_seen", res.samples_seen)  # training samples processed: FedScale's batch × steps
            record(rnd, cid, "flops_fwd", fwd_train)
            record(rnd, cid, "flops_bwd", bwd_train)
            record(rnd, cid, "flops_fwd_structured", fwd_train_s)
            record(rnd, cid, "flops_bwd_structured", bwd_train_s)
            record(rnd, cid, "params_kept",
                   next(kept) if masks else sum(v.numel() for v in algo.global_params.values()))
            totals["bytes_up"] += upd.bytes_up
            totals["bytes_down"] += upd.bytes_down
            totals["flops_train"] += fwd_train + bwd_train
            totals["flops_train_structured"] += fwd_train_s + bwd_train_s
            record(rnd, cid, "bytes_up_vs_fedavg", upd.bytes_up / ref["bytes"])
            record(rnd, cid, "bytes_down_vs_fedavg", upd.bytes_down / ref["bytes"])
            record(rnd, cid, "flops_fwd_vs_fedavg", fwd / ref["flops_fwd"] if ref["flops_fwd"] else float("nan"))
            record(rnd, cid, "flops_fwd_structured_vs_fedavg",
                   fwd_s / ref["flops_fwd"] if ref["flops_fwd"] else float("nan"))
            totals["fedavg_bytes"] += ref["bytes"]
            totals["fedavg_flops"] += 3 * ref["flops_fwd"] * res.samples_seen
        algo.aggregate(rnd, updates)
        if (rnd + 1) % cfg.training.eval_every == 0 or rnd + 1 == cfg.training.rounds:
            mean_acc = eval_all(rnd)
        if progress:
            progress(rnd + 1, cfg.training.rounds, {"mean_accuracy": mean_acc})
    if cfg.training.rounds == 0:
        mean_acc = eval_all(0)
    final = {cid: next(r["value"] for r in reversed(hist) if r["client"] == cid and r["metric"] == "accuracy")
             for cid in algo.client_ids}
    before_ft = finetune(cfg, algo, final)
    if before_ft:  # accuracy after fine-tuning, recorded one round past the last
        eval_all(cfg.training.rounds)
        final = {cid: next(r["value"] for r in reversed(hist) if r["client"] == cid and r["metric"] == "accuracy")
                 for cid in algo.client_ids}
    accuracies = {}  # measure name -> {client: final accuracy}, when the algorithm reports more than one
    if algo.primary_accuracy is not None:
        extras = sorted({r["metric"][len("accuracy_"):] for r in hist
                         if r["metric"].startswith("accuracy_") and r["client"] != "server"})
        accuracies = {algo.primary_accuracy: final, **{
            name: {cid: next(r["value"] for r in reversed(hist) if r["client"] == cid
                             and r["metric"] == f"accuracy_{name}") for cid in algo.client_ids}
            for name in extras}}
    result.summary = {
        "run_id": cfg.run_id, "algorithm": cfg.algorithm.name, "model": cfg.model.name, "dataset": cfg.data.name,
        "rounds": cfg.training.rounds, "num_clients": len(algo.client_ids),
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
            "bytes_up": totals["bytes_up"] / max(totals["fedavg_bytes"], 1),
            "bytes_down": totals["bytes_down"] / max(totals["fedavg_bytes"], 1),
            "flops_train": totals["flops_train"] / max(totals["fedavg_flops"], 1),
            "flops_train_structured": totals["flops_train_structured"] / max(totals["fedavg_flops"], 1)},
        "params_dense": sum(v.numel() for v in algo.global_params.values()),
        "wall_seconds": time.perf_counter() - t0,
        **algo.summary_extra(),
    }
    return result


def phase_stream(client_index: int, num_clients: int, phase: int) -> int:
    """The index that names a client's shuffle stream (:func:`trainer.sampling.batch_orders`) and random stream
    (:func:`trainer.sampling.client_seed`) in local-training phase ``phase``: the client's index, plus ``phase``
    times the number of clients."""
    return client_index + phase * num_clients


def phase_streams(algo: Algorithm, phase: int, pairs: list[tuple[str, LocalTask]]) -> list[int]:
    """:func:`phase_stream` of each pair's client."""
    index = algo.client_index
    return [phase_stream(index[cid], len(index), phase) for cid, _ in pairs]


def train_phase_on_host(algo: Algorithm, rnd: int, phase: int, pairs: list[tuple[str, LocalTask]],
                        batched: bool | None = None) -> list[LocalResult]:
    """One phase of round ``rnd`` for the ``(cid, task)`` pairs on this host: all together
    (:func:`trainer.batched.local_train_batched`) when ``batched`` (default: ``training.batched``), else one after
    another."""
    return train_on_data(algo.cfg, rnd, [algo.client_data(cid) for cid, _ in pairs], phase_streams(algo, phase, pairs),
                         [task for _, task in pairs], batched)


def train_on_data(cfg: TrainConfig, rnd: int, data: list[Any], streams: list[int], tasks: list[LocalTask],
                  batched: bool | None = None) -> list[LocalResult]:
    """``tasks[i]`` on the client data ``data[i]`` (its ``train_x``, ``train_y``) in round ``rnd``'s batch orders
    of shuffle stream ``streams[i]`` (:func:`phase_stream`): what a phase needs besides the tasks, which a Flower
    node has without an algorithm. All together when ``batched`` (default: ``training.batched``)."""
    t = cfg.training
    order = batch_orders([d.num_train for d in data], [task.epochs for task in tasks], cfg.run.seed, rnd,
                         streams)  # all at once
    if t.batched if batched is None else batched:
        return local_train_batched(tasks, [(d.train_x, d.train_y) for d in data], order,
                                   t.batch_size, t.momentum, t.weight_decay, t.device)
    return [local_train(task, d.train_x, d.train_y, o, t.batch_size, t.momentum, t.weight_decay)
            for d, task, o in zip(data, tasks, order)]


def train_clients(algo: Algorithm, cids: list[str], rnd: int,
                  train_phase: PhaseTrainer | None = None) -> list[tuple[str, LocalResult]]:
    """Round ``rnd``'s local training of ``cids``, every phase (``algo.next_phases``) included; the result's
    ``samples_seen`` sums the phases. One client after another (the reference) or, with ``training.batched`` or a
    ``train_phase``, each phase's clients together (:func:`trainer.batched.local_train_batched`, or wherever
    ``train_phase`` trains them): the same results."""
    def run(pairs: list[tuple[str, LocalTask]], phase: int) -> list[LocalResult]:
        seed_tasks(algo, rnd, phase, pairs)
        return (train_phase or train_phase_on_host)(algo, rnd, phase, pairs)

    if train_phase is None and not algo.cfg.training.batched:  # phase by phase per client: the sequential
        # reference keeps one client's tensors alive
        out = []
        for cid in cids:
            (res,) = run([(cid, algo.local_task(cid, rnd))], 0)
            phase, seen = 1, res.samples_seen
            while (task := algo.next_phases(rnd, phase, [(cid, res)])[0]) is not None:  # more phases
                (res,) = run([(cid, task)], phase)
                phase, seen = phase + 1, seen + res.samples_seen
            res.samples_seen = seen
            out.append((cid, res))
        return out
    first = run([(cid, algo.local_task(cid, rnd)) for cid in cids], 0)
    results = dict(zip(cids, first))
    seen = {cid: r.samples_seen for cid, r in results.items()}
    pending, phase = list(cids), 1
    while pending:  # the clients that go on to another phase, together again
        asked = algo.next_phases(rnd, phase, [(cid, results[cid]) for cid in pending])
        nxt = [(cid, task) for cid, task in zip(pending, asked) if task is not None]
        for (cid, _), res in zip(nxt, run(nxt, phase) if nxt else []):
            results[cid] = res
            seen[cid] += res.samples_seen
        pending, phase = [cid for cid, _ in nxt], phase + 1
    for cid, res in results.items():
        res.samples_seen = seen[cid]
    return [(cid, results[cid]) for cid in cids]


def seed_tasks(algo: Algorithm, rnd: int, phase: int, pairs: list[tuple[str, LocalTask]]) -> None:
    """Give each task its client's random stream for round ``rnd``, phase ``phase`` (:attr:`LocalTask.seed`)."""
    seeds = client_seeds(algo.cfg.run.seed, rnd, phase_streams(algo, phase, pairs))
    for (_, task), s in zip(pairs, seeds):
        task.seed = s


def finetune(cfg: TrainConfig, algo: Algorithm, final: dict[str, float]) -> dict[str, float]:
    """After the last round, each client trains what ``algo.finetune_task`` names (e.g. its head), as one more
    phase of a round numbered :data:`FINETUNE_ROUND`: all together with ``training.batched``, else one client
    after another. Returns the accuracies before fine-tuning of the clients (all of them), or {} when no client
    fine-tunes."""

    def tune(pairs: list[tuple[str, LocalTask]]) -> None:
        seed_tasks(algo, FINETUNE_ROUND, 0, pairs)
        for (cid, _), res in zip(pairs, train_phase_on_host(algo, FINETUNE_ROUND, 0, pairs)):
            algo.finetune_result(cid, res)

    tuned = False
    if cfg.training.batched:
        pairs = [(cid, task) for cid in algo.client_ids if (task := algo.finetune_task(cid)) is not None]
        tune(pairs)
        tuned = bool(pairs)
    else:  # one task alive at a time
        for cid in algo.client_ids:
            if (task := algo.finetune_task(cid)) is not None:
                tune([(cid, task)])
                tuned = True
    return dict(final) if tuned else {}


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


def train(cfg: TrainConfig, runs_root: Path, progress=None) -> Path:
    """Simulate and write ``runs_root/<run-id>/``, holding the run's lock from before the first round (a second
    training of the run id leaves at once, and an unwritable ``runs/`` is found before the work)."""
    path = Path(runs_root) / check_name(cfg.run_id, "run.run_id")
    with run_lock(path):
        return simulate(cfg, progress, ready=room_check(cfg, path)).write(path)


def room_check(cfg: TrainConfig, path: Path) -> Callable[[Algorithm], None]:
    """``simulate``'s ``ready``: the run's size is known once the model is built, so refuse a run that will not
    fit at ``path`` then, before the first round (:func:`trainer.run_dir.check_room`)."""

    def fits(algo: Algorithm) -> None:
        cids = list(algo.client_ids)
        per_round = clients_per_round(len(cids), cfg.training.participation)
        rows = cfg.training.rounds * (per_round * 12 + 2 * len(cids) + 4)  # ~12 metrics a trained client
        check_room(path, algo.shared_state(), algo.client_state(cids[0]), len(cids), rows)

    return fits
