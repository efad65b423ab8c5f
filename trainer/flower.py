"""The trainer's algorithms on Flower (flwr 1.41, its Message API): Flower's simulation engine (Ray) or a real Flower
deployment runs the same round loop as :func:`edgemask.trainer.simulation.simulate`, with the clients' local training on
Flower nodes. The only module that imports ``flwr``, and only when a Flower app is built or run.

The server keeps the algorithm; clients only train. The ServerApp runs :func:`~edgemask.trainer.simulation.simulate`
itself — the same seeds, ``algo.setup()``, sampling schedule, ``next_phases``, ``client_updates``, ``aggregate``,
evaluation, history and run directory — with a ``train_phase`` (:class:`FlowerTrainer`) that sends each phase's
``(client, task)`` pairs to the nodes holding the clients and waits for the trained tensors. What crosses the network
is a :class:`TaskMessage`: the task itself, which is data (:class:`~edgemask.trainer.records.LocalTask`) — its tensors
(trainable, constants, buffers, grad_keep) and its settings (epochs, lr, lrs, max_steps, batches_per_step, noise,
seed, the model spec and the names and settings of its registered functions, :mod:`edgemask.trainer.task_functions`) —
plus the run's config as TOML. The ClientApp builds no algorithm: it rebuilds the task from the message, takes its
client's data from the dataset the config names (built once per process, :class:`ClientSide`: a Ray actor keeps it
for the whole run; a deployment's SuperNode starts a process per message, which builds it again), and runs
:func:`~edgemask.trainer.local_training.local_train` in the batch orders the round loop uses.

Nodes and clients: the node with ``partition-id`` p of ``num-partitions`` P (Flower's node config; the simulation
engine gives one node per client, a deployment sets them with ``flower-supernode --node-config``) holds the clients
whose index i in the dataset's order has i mod P = p. The server asks every node for its partition (a ``query``
message) before the first round.

What stays on the server: the algorithm — ``algo.setup()`` (e.g. FedMask's one-shot pruning), ``local_task`` and
``next_phases``, uploads, aggregation, evaluation and the fine-tuning after the last round; so the server builds the
whole dataset too, as every node does.

    edgemask train --config X --engine flower [--flower-workers N]     # Flower's simulation engine, this host
    flwr run configs/flower-app <superlink> --run-config 'config="train.toml"'   # a deployment (README.md)
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from edgemask.errors import ConfigError, EdgemaskError
from edgemask.workspace import check_name
from edgemask.trainer.algorithms.base import Algorithm, one_sample_rule
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.records import TENSOR_FIELDS, LocalResult, LocalTask
from edgemask.trainer.run_dir import run_lock
from edgemask.trainer.engines import SequentialEngine
from edgemask.trainer.simulation import (PhaseTrainer, SimulationResult, phase_stream, room_check, simulate,
                                         train_on_data)

if TYPE_CHECKING:
    from flwr.app import Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp

__all__ = ["ClientSide", "FlowerTrainer", "TaskMessage", "client_app",  # noqa: F822 (module __getattr__)
           "make_client_app", "make_server_app", "server_app", "simulate_flower", "train_flower"]  # noqa: F822

Tensors = dict[str, torch.Tensor]
FLWR_VERSION = "1.41.0"
INSTALL = "pip install -e .[flower]"
# LocalTask's fields by how they travel: tensors as Flower ArrayRecords, everything else (LocalTask.settings: the
# settings, the model spec, the functions' names and settings) as JSON.
SETTING_FIELDS = tuple(f.name for f in dataclasses.fields(LocalTask) if f.name not in TENSOR_FIELDS)
# the ServerApp's run config (a deployment: ``[tool.flwr.app.config]`` of the app, or ``flwr run --run-config``)
RUN_CONFIG_DEFAULTS = {"config": "", "runs-root": "workspace/runs", "node-timeout": 600.0, "reply-timeout": 0.0}


def require_flwr() -> None:
    """A one-line EdgemaskError when Flower is missing."""
    try:
        import flwr
    except ImportError:
        raise EdgemaskError(f"Flower is not installed: `{INSTALL}` (flwr {FLWR_VERSION} with Ray)") from None
    if tuple(int(x) for x in flwr.__version__.split(".")[:2]) < (1, 41):
        raise EdgemaskError(f"Flower {flwr.__version__} is installed; trainer.flower needs {FLWR_VERSION}'s "
                            f"Message API: `{INSTALL}`")


# -- what crosses the network ----------------------------------------------------------------------------------

@dataclass
class TaskMessage:
    """One client's local-training phase as the server sends it: the task as data. ``tensors`` maps each of
    :data:`~edgemask.trainer.records.TENSOR_FIELDS` to its tensors; ``settings`` is :meth:`LocalTask.settings` (each of
    :data:`SETTING_FIELDS` to a JSON value)."""

    client_id: str
    round: int
    phase: int
    tensors: dict[str, Tensors]
    settings: dict[str, Any]

    @classmethod
    def of(cls, cid: str, rnd: int, phase: int, task: LocalTask) -> "TaskMessage":
        tensors = {f: {k: v.detach().cpu() for k, v in getattr(task, f).items()} for f in TENSOR_FIELDS}
        return cls(cid, rnd, phase, tensors, task.settings())

    def task(self) -> LocalTask:
        """The task this message carries (:meth:`LocalTask.from_parts`)."""
        try:
            return LocalTask.from_parts(self.tensors, self.settings)
        except (KeyError, TypeError, ValueError) as e:
            raise EdgemaskError(f"the task for client {self.client_id!r} (round {self.round}, phase {self.phase}) "
                                f"is not one this node can read ({type(e).__name__}: {e}): do the server and the "
                                "node run the same edgemask?") from None

    def to_records(self, config_toml: str) -> "RecordDict":
        from flwr.app import ArrayRecord, ConfigRecord, RecordDict

        head = {"client-id": self.client_id, "round": self.round, "phase": self.phase,
                "settings": json.dumps(self.settings), "config": config_toml}
        return RecordDict({"task": ConfigRecord(head), **{f: ArrayRecord(self.tensors[f]) for f in TENSOR_FIELDS}})

    @classmethod
    def from_records(cls, content: "RecordDict") -> tuple["TaskMessage", str]:
        """The message and the run's config (TOML)."""
        head = content.config_records["task"]
        tensors = {f: dict(content.array_records[f].to_torch_state_dict()) for f in TENSOR_FIELDS}
        msg = cls(str(head["client-id"]), int(head["round"]), int(head["phase"]), tensors,
                  json.loads(str(head["settings"])))
        return msg, str(head["config"])


def result_records(cid: str, res: LocalResult) -> "RecordDict":
    from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

    return RecordDict({"trained": ArrayRecord(res.trained), "buffers": ArrayRecord(res.buffers),
                       "client": ConfigRecord({"client-id": cid}),
                       "result": MetricRecord({"loss": float(res.loss), "samples-seen": int(res.samples_seen),
                                               "num-samples": int(res.num_samples)})})


def result_from_records(content: "RecordDict") -> tuple[str, LocalResult]:
    m = content.metric_records["result"]
    res = LocalResult(dict(content.array_records["trained"].to_torch_state_dict()),
                      dict(content.array_records["buffers"].to_torch_state_dict()),
                      float(m["loss"]), int(m["samples-seen"]), int(m["num-samples"]))
    return str(content.config_records["client"]["client-id"]), res


# -- the client side --------------------------------------------------------------------------------------------

class ClientSide:
    """What a node holds of the run: its config and the dataset the config names, built as the server builds its
    own (:func:`~edgemask.trainer.data.build_dataset` with the run's seed) — the clients' data. No algorithm: a task
    arrives whole (:class:`TaskMessage`)."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.dataset = build_dataset(cfg.data, cfg.run.seed)
        self.index = {c.client_id: i for i, c in enumerate(self.dataset.clients)}
        self.drop_one_sample = one_sample_rule(cfg, self.dataset)  # as the server's algorithm decides it

    def train(self, msg: TaskMessage) -> LocalResult:
        """The client's local training on its own data, in the batch orders of
        :func:`edgemask.trainer.simulation.train_phase_on_host` (the client's shuffle stream for the message's
        phase), by the sequential engine: on one thread, so the same bits as ``edgemask train --sequential``."""
        cid = msg.client_id
        if cid not in self.index:
            raise EdgemaskError(f"client {cid!r} is not in this run's dataset ({len(self.index)} clients)")
        stream = phase_stream(self.index[cid], len(self.index), msg.phase)
        (res,) = train_on_data(self.cfg, SequentialEngine(), msg.round, [self.dataset.client(cid)], [stream],
                               [msg.task()], self.drop_one_sample)  # one message, one client: sequential
        return res


def loopback_phases(cfg: TrainConfig) -> PhaseTrainer:
    """A ``train_phase`` for :func:`~edgemask.trainer.simulation.simulate` that trains each task as a Flower node
    does, in this process: through a :class:`TaskMessage` (settings through JSON, tensors copied) to a
    :class:`ClientSide` holding only the config's dataset. Flower's transport is left out, what it carries is not
    (tests/trainer/test_flower.py, benchmarks/history_hashes.py)."""
    side = ClientSide(cfg)

    def train_phase(algo: Algorithm, rnd: int, phase: int,
                    pairs: Sequence[tuple[str, LocalTask]]) -> list[LocalResult]:
        out = []
        for cid, task in pairs:
            msg = TaskMessage.of(cid, rnd, phase, task)
            msg.settings = json.loads(json.dumps(msg.settings))
            msg.tensors = {f: {k: v.clone() for k, v in d.items()} for f, d in msg.tensors.items()}
            out.append(side.train(msg))
        return out

    return train_phase


_CLIENT_SIDE: dict[str, ClientSide] = {}  # per process: the run's config (TOML) -> its ClientSide (the latest only)


def client_side(config_toml: str) -> ClientSide:
    if config_toml not in _CLIENT_SIDE:
        _CLIENT_SIDE.clear()  # a new run: free the last one's dataset
        cfg = TrainConfig.from_dict(tomllib.loads(config_toml), "the run's config (sent by the server)")
        _CLIENT_SIDE[config_toml] = ClientSide(cfg)
    return _CLIENT_SIDE[config_toml]


def _partition(context: "Context") -> tuple[int, int]:
    """The node's (partition-id, num-partitions) from its node config."""
    nc = context.node_config
    try:
        p, n = int(nc["partition-id"]), int(nc["num-partitions"])
    except (KeyError, ValueError):
        raise EdgemaskError(f"Flower node {context.node_id}: node config {dict(nc)} needs integers partition-id and "
                            "num-partitions: start it with flower-supernode --node-config "
                            "'partition-id=P num-partitions=N'") from None
    if not 0 <= p < n:
        raise EdgemaskError(f"Flower node {context.node_id}: partition-id {p} is not in [0, {n})")
    return p, n


def _train(msg: "Message", context: "Context") -> "Message":
    """The ClientApp's train handler (module level, so Ray pickles it by name and each process keeps its cache)."""
    from flwr.app import Message

    task, config_toml = TaskMessage.from_records(msg.content)
    side = client_side(config_toml)
    p, n = _partition(context)
    i = side.index.get(task.client_id)
    if i is None or i % n != p:
        raise EdgemaskError(f"Flower node {context.node_id} (partition {p} of {n}) does not hold client "
                            f"{task.client_id!r}: it holds the clients whose index mod {n} is {p}")
    return Message(result_records(task.client_id, side.train(task)), reply_to=msg)


def _query(msg: "Message", context: "Context") -> "Message":
    """The ClientApp's query handler: the node's partition."""
    from flwr.app import ConfigRecord, Message, RecordDict

    p, n = _partition(context)
    return Message(RecordDict({"node": ConfigRecord({"partition-id": p, "num-partitions": n})}), reply_to=msg)


def make_client_app() -> "ClientApp":
    require_flwr()
    from flwr.clientapp import ClientApp

    app = ClientApp()
    app.train()(_train)
    app.query()(_query)
    return app


# -- the server side --------------------------------------------------------------------------------------------

class FlowerTrainer:
    """A :data:`~edgemask.trainer.simulation.PhaseTrainer` that sends each ``(cid, task)`` to the Flower node holding
    the client and returns the replies' results in the pairs' order. Nodes are found on the first call.
    ``reply_timeout`` (s, ``None``: none) bounds each phase's wait."""

    def __init__(self, grid: "Grid", node_timeout: float = 600.0, reply_timeout: float | None = None) -> None:
        self.grid, self.node_timeout, self.reply_timeout = grid, node_timeout, reply_timeout
        self.nodes: dict[str, int] = {}  # client id -> node id
        self._toml: tuple[TrainConfig, str] | None = None

    def __call__(self, algo: Algorithm, rnd: int, phase: int,
                 pairs: list[tuple[str, LocalTask]]) -> list[LocalResult]:
        from flwr.app import Message

        if any(cid not in self.nodes for cid in algo.client_ids):
            self.nodes = client_nodes(self.grid, algo.client_ids, self.node_timeout)
        if self._toml is None or self._toml[0] is not algo.cfg:
            self._toml = (algo.cfg, algo.cfg.to_toml())
        msgs = [Message(TaskMessage.of(cid, rnd, phase, task).to_records(self._toml[1]), self.nodes[cid], "train",
                        group_id=f"round-{rnd}-phase-{phase}") for cid, task in pairs]
        results: dict[str, LocalResult] = {}
        for reply in self.grid.send_and_receive(msgs, timeout=self.reply_timeout):
            if reply.has_error():
                reason = " ".join(str(reply.error.reason).split())
                raise EdgemaskError(f"Flower node {reply.metadata.src_node_id} failed in round {rnd}, phase {phase} "
                                    f"({algo.name}): {reason}")
            cid, res = result_from_records(reply.content)
            results[cid] = res
        missing = [cid for cid, _ in pairs if cid not in results]
        if missing:
            raise EdgemaskError(f"round {rnd}, phase {phase}: no reply for {len(missing)} client(s) ({missing[0]}, "
                                f"...) within reply-timeout {self.reply_timeout} s; are their nodes still up?")
        return [results[cid] for cid, _ in pairs]


def client_nodes(grid: "Grid", client_ids: list[str], timeout: float = 600.0) -> dict[str, int]:
    """Client id -> the node that holds it (index i mod num-partitions = the node's partition-id), asking each
    node for its partition until every partition has one; an EdgemaskError after ``timeout`` seconds."""
    from flwr.app import Message, RecordDict

    deadline = time.monotonic() + timeout
    asked: set[int] = set()
    parts: dict[int, int] = {}  # partition-id -> node id
    total: int | None = None
    while True:
        new = [n for n in grid.get_node_ids() if n not in asked]
        replies = grid.send_and_receive([Message(RecordDict(), n, "query") for n in new],
                                        timeout=max(deadline - time.monotonic(), 1.0)) if new else []
        for r in replies:
            node = r.metadata.src_node_id
            if r.has_error():
                raise EdgemaskError(f"Flower node {node}: {' '.join(str(r.error.reason).split())}")
            p, n = int(r.content.config_records["node"]["partition-id"]), int(
                r.content.config_records["node"]["num-partitions"])
            if total not in (None, n) or p in parts:
                raise EdgemaskError(f"Flower node {node} says partition {p} of {n}; other nodes hold "
                                    f"{sorted(parts)} of {total}: give each node its own partition-id and the same "
                                    "num-partitions")
            total, parts[p] = n, node
        asked.update(new)
        if total is not None and len(parts) == total:
            break
        if time.monotonic() > deadline:
            have = f"partitions {sorted(parts)} of {total}" if total else "no node"
            raise EdgemaskError(f"after {timeout:.0f} s, {have}: start a flower-supernode for each partition "
                                "(--node-config 'partition-id=P num-partitions=N')")
        time.sleep(0.5)
    return {cid: parts[i % total] for i, cid in enumerate(client_ids)}


def make_server_app(configs: Sequence[TrainConfig] | None = None,
                    on_result: Callable[[SimulationResult], None] | None = None,
                    progress: Callable[[int, int, dict[str, float]], None] | None = None,
                    engine: str = f"flower {FLWR_VERSION} deployment", runs_root: Path | None = None,
                    on_error: Callable[[EdgemaskError], None] | None = None) -> "ServerApp":
    """A ServerApp that runs ``configs`` one after another and hands each result to ``on_result``. Without
    ``configs``: the deployed app — one config, the file its run config's ``config`` names, and the run directory
    written under its ``runs-root`` (default ``workspace/runs``). ``engine`` goes into each summary. Each run is
    refused before its first round when it will not fit under ``runs_root`` (the deployed app: ``runs-root``);
    ``on_error`` receives an edgemask error instead of Flower (which would log it and end the run)."""
    require_flwr()
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid: "Grid", context: "Context") -> None:
        rc = {**RUN_CONFIG_DEFAULTS, **dict(context.run_config)}
        trainer = FlowerTrainer(grid, float(rc["node-timeout"]), float(rc["reply-timeout"]) or None)
        if configs is None and not rc["config"]:
            raise ConfigError("trainer.flower:server_app needs the training config: set config = \"path/to.toml\" "
                              "in [tool.flwr.app.config] or `flwr run ... --run-config 'config=\"path/to.toml\"'`")
        root = runs_root if configs is not None else Path(str(rc["runs-root"]))
        for cfg in configs if configs is not None else [TrainConfig.load(str(rc["config"]))]:
            ready = room_check(cfg, root / cfg.run_id) if root is not None else None
            try:
                res = simulate(cfg, progress or (None if configs is not None else _log_progress), trainer,
                               ready=ready)
            except EdgemaskError as e:
                if on_error is None:
                    raise
                on_error(e)
                return
            res.summary["engine"] = engine
            if configs is None:
                path = res.write(root / cfg.run_id)
                _log(f"edgemask: wrote {path} (mean personalized accuracy {res.summary['mean_accuracy']:.4f})")
            if on_result is not None:
                on_result(res)

    return app


def _log(text: str) -> None:
    from logging import INFO

    from flwr.common.logger import log

    log(INFO, text)


def _log_progress(done: int, total: int, metrics: dict[str, float]) -> None:
    if done:
        _log(f"edgemask: round {done}/{total}, mean personalized accuracy {metrics.get('mean_accuracy', float('nan')):.4f}")


# -- Flower's simulation engine on this host --------------------------------------------------------------------

def simulate_flower(configs: Sequence[TrainConfig], workers: int | None = None,
                    progress: Callable[[int, int, dict[str, float]], None] | None = None,
                    verbose: bool = False, runs_root: Path | None = None) -> list[SimulationResult]:
    """Each config's :func:`~edgemask.trainer.simulation.simulate` with its local training on Flower's simulation
    engine: one Ray start-up for all, one virtual node per client (of the config with most), ``workers`` Ray CPUs
    (default: this host's, at most the clients) so that many clients train at a time, one torch thread each. With
    ``runs_root``, a run that will not fit under it is refused before its first round."""
    require_flwr()
    import logging

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no usage reports (the Ray actors inherit these)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    from flwr.simulation import run_simulation

    if workers is not None and workers < 1:
        raise ConfigError(f"--flower-workers must be ≥ 1, got {workers}")
    nodes = max(c.data.num_clients for c in configs)
    workers = workers or max(1, min(os.cpu_count() or 1, nodes))
    results: list[SimulationResult] = []
    errors: list[EdgemaskError] = []
    if not verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    backend = {"init_args": {"num_cpus": workers}, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    app = make_server_app(configs, results.append, progress, f"flower {FLWR_VERSION} simulation (Ray, {workers} "
                          f"worker{'s' if workers > 1 else ''})", runs_root=runs_root, on_error=errors.append)
    run_simulation(server_app=app, client_app=client_app_object(), num_supernodes=nodes, backend_config=backend,
                   verbose_logging=verbose)
    if errors:
        raise errors[0]
    if len(results) != len(configs):
        raise EdgemaskError(f"Flower's simulation ended after {len(results)} of {len(configs)} run(s); rerun with "
                            "--verbose for Flower's and Ray's log")
    return results


def train_flower(cfg: TrainConfig, runs_root: Path, workers: int | None = None, progress=None,
                 verbose: bool = False) -> Path:
    """:func:`simulate_flower` for one config, written to ``runs_root/<run-id>/`` like
    :func:`edgemask.trainer.simulation.train`."""
    with run_lock(Path(runs_root) / check_name(cfg.run_id, "run.run_id")) as path:
        (res,) = simulate_flower([cfg], workers, progress, verbose, runs_root=Path(runs_root))
        return res.write(path)


def client_app_object() -> "ClientApp":
    return __getattr__("client_app")


def __getattr__(name: str) -> Any:
    """``server_app`` and ``client_app``, the deployment's components, built on first use (so this module
    imports without Flower)."""
    builders = {"server_app": make_server_app, "client_app": make_client_app}
    if name not in builders:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in globals():
        globals()[name] = builders[name]()
    return globals()[name]
