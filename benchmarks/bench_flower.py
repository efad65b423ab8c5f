"""Flower's simulation engine (Ray) on bench_batched.py's workload: client updates/s, start-up and peak memory,
beside our sequential and batched loops measured in the same run, so the ratios share the machine's load.

Workload (bench_batched.py's ``config()``): FedAvg, 100 clients, digits split 2 classes per client, 1 local epoch,
batch 16, lr 0.05, plain SGD, seed 0, on the MLP 64-128-64-10 (``mlp``) and the small CNN (``cnn``). Every Flower
client trains on its client's data from ``trainer.data.build_dataset`` in the per-epoch orders of
``trainer.sampling.batch_order`` (Flower's round r is our round r - 1), from the same seeded initial weights, so
Flower's global model after round 1 equals ours up to float summation order (the table prints the difference).

Flower 1.41.0 (``benchmarks/flower_env.sh`` says why not 1.42.0): ``flwr.simulation.run_simulation`` (marked
deprecated in favour of the ``flwr run`` CLI, still the in-process entry point) with a ServerApp that runs
``flwr.serverapp.strategy.FedAvg`` (fraction_train 1.0, no federated evaluation) and a ClientApp with one train
function; Ray with 2 CPUs, 1 per client, so 2 actors train side by side (Ray sets OMP_NUM_THREADS=1 in them: torch
uses one thread each; our loops use torch's default threads in the driver, or ``--threads``). Our loops' rounds
run inside the ServerApp after each Flower round (Flower, sequential, batched, repeat), so a busy machine slows all
three alike; a Flower round is timed from ``configure_train`` to the end of ``aggregate_train``, i.e. sending, the
clients' work, replies and the average. The first round of each is start-up (Ray, the actors, their imports and
data, the first round), not timed below; each loop's median round is reported. Peak memory: resident set sizes
summed over this process and all its descendants (Ray's gcs_server, raylet, agents and actors), sampled every
0.1 s while Flower runs; pages shared between processes (torch's libraries) count once per process.

    bash benchmarks/flower_env.sh && .venv-flower/bin/python benchmarks/bench_flower.py [--rounds N] [--models mlp,cnn]
        [--threads N] [--adapter]

``--adapter`` adds a row per model, "edgemask on Flower": our own FedAvg through ``trainer.flower`` (the round loop
of ``trainer.simulation`` in the ServerApp, each client's task a message to its node, the ClientApp's
``local_train``) in a second Flower simulation with the same Ray settings; evaluation only after the last round, so
a round is the clients' training, the messages and the average. Its rounds are timed between the round loop's
progress calls, its start-up from building the simulation to the end of its first round; the last column compares
its final global model with the batched loop's after the same rounds.

On a loaded 2-core machine, torch's default of 2 threads in the driver can make our loops several times slower
(threads waiting on each other) while Flower's 1-thread actors barely notice: compare with ``--threads 1``.
"""

from __future__ import annotations

import time

T_PROCESS = time.perf_counter()

import argparse  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no usage reports (the actors inherit both)
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # no GPUs here; silences Ray's FutureWarning

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402
from flwr.serverapp.strategy import FedAvg  # noqa: E402
from flwr.simulation import run_simulation  # noqa: E402

from bench_batched import OurLoop, config  # noqa: E402  (benchmarks/ is on sys.path, and Ray passes it on)
from edgemask.trainer.algorithms import ALGORITHMS  # noqa: E402
from edgemask.trainer.data import build_dataset  # noqa: E402
from edgemask.trainer.models import build_model  # noqa: E402
from edgemask.trainer.sampling import batch_order  # noqa: E402

T_IMPORTS = time.perf_counter() - T_PROCESS
WORKERS = 2  # Ray CPUs, one per client: two clients train at a time on this 2-core machine


# -- the ClientApp (runs in the Ray actors) ---------------------------------------------------------------------

_CLIENT_SIDE: dict[str, tuple] = {}  # per actor process: model name -> (TrainConfig, dataset, nn.Module)


def client_side(model: str) -> tuple:
    """The actor's dataset and a model to load weights into, built once per actor (a Flower client usually
    reloads its partition per message; caching it here favours Flower)."""
    if model not in _CLIENT_SIDE:
        cfg = config(model, batched=False)
        ds = build_dataset(cfg.data, cfg.run.seed)
        net = build_model(cfg.model.name, ds.input_shape, ds.num_classes, **cfg.model.args)
        _CLIENT_SIDE[model] = (cfg, ds, net.train())
    return _CLIENT_SIDE[model]


CLIENT_APP = ClientApp()


@CLIENT_APP.train()
def train(msg: Message, context: Context) -> Message:
    """One client's local training as ``trainer.local_training.local_train`` does it for FedAvg: plain SGD on the
    mean cross-entropy of consecutive ``batch_size`` slices of each epoch's ``batch_order`` (the last one short)."""
    t = time.perf_counter()
    model = str(msg.content["config"]["model"])
    rnd = int(msg.content["config"]["server-round"]) - 1  # Flower counts rounds from 1, the trainer from 0
    i = int(context.node_config["partition-id"])  # the client's index: ds.clients[i] is client-{i:03d}
    cfg, ds, net = client_side(model)
    c, bs = ds.clients[i], cfg.training.batch_size
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    opt = torch.optim.SGD(net.parameters(), lr=cfg.training.lr)
    for order in batch_order(c.num_train, cfg.training.local_epochs, cfg.run.seed, rnd, i):
        for s in range(0, len(order), bs):
            idx = torch.from_numpy(order[s: s + bs])
            loss = F.cross_entropy(net(c.train_x[idx]), c.train_y[idx])  # (B, 10) logits
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    metrics = MetricRecord({"num-examples": c.num_train, "train-s": time.perf_counter() - t,
                            "torch-threads": torch.get_num_threads()})
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": metrics}), reply_to=msg)


def importable_client_app() -> ClientApp:
    """``CLIENT_APP`` of this file imported as ``bench_flower``: Ray pickles the app with every message, and
    functions of ``__main__`` travel by value (each message would bring a fresh, empty ``_CLIENT_SIDE``); by name,
    each actor imports this file once and keeps its cache."""
    import bench_flower

    return bench_flower.CLIENT_APP


# -- the server side (runs in this process) ----------------------------------------------------------------------

@dataclass
class FlowerRound:
    server_round: int
    start: float  # perf_counter at configure_train
    end: float  # perf_counter after aggregate_train
    clients: int
    client_train_s: float  # the clients' own training time, summed over the round's clients
    torch_threads: float  # the actors' torch threads (mean over clients)

    @property
    def seconds(self) -> float:
        return self.end - self.start


class TimedFedAvg(FedAvg):
    """Flower's FedAvg that times each round, checks that every client answered, and calls ``after_round`` with
    the new global arrays (outside the timed span)."""

    def __init__(self, clients: int, after_round, **kwargs) -> None:
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=clients,
                         min_available_nodes=clients, **kwargs)
        self.clients, self.after_round = clients, after_round
        self.rounds: list[FlowerRound] = []
        self._start = 0.0

    def configure_train(self, server_round, arrays, config, grid):
        self._start = time.perf_counter()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        errors = [m.error.reason for m in replies if m.has_error()]
        if errors or len(replies) != self.clients:
            raise RuntimeError(f"Flower round {server_round}: {len(replies)} replies of {self.clients}, "
                               f"{len(errors)} errors (first: {errors[:1]}); rerun with --verbose for the "
                               "ClientApp's traceback")
        arrays, metrics = super().aggregate_train(server_round, replies)
        end = time.perf_counter()
        ms = [m.content["metrics"] for m in replies]
        self.rounds.append(FlowerRound(server_round, self._start, end, len(replies),
                                       sum(float(m["train-s"]) for m in ms),
                                       float(np.mean([m["torch-threads"] for m in ms]))))
        self.after_round(server_round, arrays)
        return arrays, metrics


class TreeMemory:
    """Peak resident memory of this process plus all its descendants, sampled in a thread every ``period`` s.
    ``samples`` keeps every ``(seconds since start, this process's RSS, all descendants' RSS)`` in bytes."""

    def __init__(self, period: float = 0.1) -> None:
        self.period = period
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._me = psutil.Process()

    def __enter__(self) -> "TreeMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        t0 = time.perf_counter()
        while True:
            own, others = self._me.memory_info().rss, 0
            for p in self._me.children(recursive=True):
                try:
                    others += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.ZombieProcess):  # ended between listing and reading
                    pass
            self.samples.append((time.perf_counter() - t0, own, others))
            if self._stop.wait(self.period):
                return

    @property
    def peak_total(self) -> int:
        return max(own + others for _, own, others in self.samples)

    @property
    def peak_driver(self) -> int:
        return max(own for _, own, _ in self.samples)


@dataclass
class AdapterResult:
    """Our FedAvg through trainer.flower: seconds per round (the first one is start-up) and the peak memory."""

    rounds: list[float] = field(default_factory=list)
    startup: float = 0.0
    memory: TreeMemory | None = None
    final_diff: float = float("nan")  # max |adapter - batched loop| of the global model after the last round


def bench_adapter(model: str, rounds: int, verbose: bool, reference: dict[str, torch.Tensor]) -> AdapterResult:
    """``rounds + 1`` rounds of our FedAvg through trainer.flower on Flower's simulation engine (WORKERS Ray CPUs);
    ``reference``: the batched loop's global model after as many rounds."""
    import dataclasses

    from edgemask.trainer.flower import simulate_flower

    res = AdapterResult()
    cfg = config(model, batched=False)
    cfg = cfg.replace(training=dataclasses.replace(cfg.training, rounds=rounds + 1, eval_every=rounds + 2))
    marks: list[float] = []
    t0 = time.perf_counter()
    with TreeMemory() as res.memory:
        (out,) = simulate_flower([cfg], workers=WORKERS, progress=lambda done, total, m: marks.append(
            time.perf_counter()), verbose=verbose)
    res.startup = marks[1] - t0  # marks[0]: the loop's start, before round 0
    res.rounds = list(np.diff(marks[1:]))
    res.final_diff = max_abs_diff(out.algorithm.global_params, reference)
    return res


@dataclass
class ModelResult:
    model: str
    flower: list[FlowerRound] = field(default_factory=list)
    flower_startup: float = 0.0
    ours: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # loop -> [(train s, round s)]
    ours_startup: dict[str, float] = field(default_factory=dict)
    round1_diff: dict[str, float] = field(default_factory=dict)  # loop -> max |Flower - ours| after round 1
    memory: TreeMemory | None = None
    driver_rss_before: int = 0
    adapter: AdapterResult | None = None


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        raise ValueError(f"different tensors: {sorted(a)} vs {sorted(b)}")
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def bench(model: str, rounds: int, verbose: bool) -> ModelResult:
    res = ModelResult(model)
    loops = {"sequential (ours)": OurLoop(model, False), "batched (ours)": OurLoop(model, True)}
    res.ours = {name: [] for name in loops}
    n = len(loops["batched (ours)"].cids)

    t_flower = time.perf_counter()
    cfg = config(model, batched=False)  # the seeded initial weights, built as OurLoop builds them
    initial = ALGORITHMS.get("fedavg")(cfg, build_dataset(cfg.data, cfg.run.seed)).global_params

    def after_round(server_round: int, arrays: ArrayRecord) -> None:
        """Flower's round r is done: our loops run their round r - 1 (round 0: start-up, then the comparison)."""
        rnd = server_round - 1
        if rnd == 0:
            res.flower_startup = time.perf_counter() - t_flower
        for name, loop in loops.items():
            t = time.perf_counter()
            tt, tr, _ = loop.round(rnd)
            if rnd == 0:
                res.ours_startup[name] = loop.setup_s + time.perf_counter() - t
                res.round1_diff[name] = max_abs_diff(arrays.to_torch_state_dict(), loop.algo.global_params)
            else:
                res.ours[name].append((tt, tr))

    strategy = TimedFedAvg(n, after_round)
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy.start(grid, ArrayRecord(initial), num_rounds=rounds + 1,
                       train_config=ConfigRecord({"model": model}))

    backend = {"init_args": {"num_cpus": WORKERS}, "client_resources": {"num_cpus": 1, "num_gpus": 0.0}}
    res.driver_rss_before = psutil.Process().memory_info().rss
    with TreeMemory() as res.memory:
        run_simulation(server_app=server_app, client_app=importable_client_app(), num_supernodes=n,
                       backend_config=backend, verbose_logging=verbose)
    if len(strategy.rounds) != rounds + 1:
        raise RuntimeError(f"Flower ran {len(strategy.rounds)} rounds of {rounds + 1}; rerun with --verbose")
    res.flower = strategy.rounds
    return res


def main() -> None:
    import flwr
    import ray

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds per loop (after one start-up round)")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads of our loops in the driver (default: torch's; Flower's actors use 1 each)")
    ap.add_argument("--verbose", action="store_true", help="Flower's and Ray's INFO/DEBUG logs")
    ap.add_argument("--adapter", action="store_true", help="also our FedAvg through trainer.flower on Flower's "
                    "simulation engine (one more Ray start-up per model)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.verbose:
        logging.getLogger("flwr").setLevel(logging.WARNING)
    threads = f"{torch.get_num_threads()} thread" + ("s" if torch.get_num_threads() > 1 else "")
    print(f"flwr {flwr.__version__}, ray {ray.__version__}, torch {torch.__version__} ({threads} in the driver), "
          f"numpy {np.__version__}, {os.cpu_count()} CPUs; imports {T_IMPORTS:.2f} s; "
          f"FedAvg, 100 clients, digits 2 classes/client, 1 epoch, batch 16, lr 0.05, {args.rounds} timed rounds")
    results = [bench(m, args.rounds, args.verbose) for m in args.models.split(",")]
    if args.adapter:
        for r in results:
            r.adapter = bench_adapter(r.model, args.rounds, args.verbose,
                                      batched_after(r.model, args.rounds + 1))

    mib = 1 << 20
    flower_name = f"Flower {flwr.__version__} (Ray, {WORKERS} actors × 1 CPU)"
    print("\n| model | loop | updates/s (round) | updates/s (train) | start-up to end of first round (s) | "
          "peak RSS, driver + Ray processes (MiB) | max abs diff of the global model after round 1 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in results:
        n = r.flower[0].clients
        fl = n / float(np.median([x.seconds for x in r.flower[1:]]))
        diffs = ", ".join(f"vs {k.split()[0]} {v:.1e}" for k, v in r.round1_diff.items())
        print(f"| {r.model} | {flower_name} | {fl:,.0f} | — | {r.flower_startup:.2f} | "
              f"{r.memory.peak_total / mib:,.0f} (driver {r.memory.peak_driver / mib:,.0f}) | {diffs} |")
        for name, times in r.ours.items():
            tt, tr = np.median(np.array(times), axis=0)
            print(f"| {r.model} | {name[:-1]}, {threads}) | {n / tr:,.0f} | {n / tt:,.0f} | "
                  f"{r.ours_startup[name]:.2f} | — | — |")
        if r.adapter is not None:
            a = r.adapter
            print(f"| {r.model} | edgemask on Flower (trainer.flower, Ray, {WORKERS} actors × 1 CPU) | "
                  f"{n / float(np.median(a.rounds)):,.0f} | — | {a.startup:.2f} | "
                  f"{a.memory.peak_total / mib:,.0f} (driver {a.memory.peak_driver / mib:,.0f}) | "
                  f"after {len(a.rounds) + 1} rounds vs batched {a.final_diff:.1e} |")

    print("\n| model | batched / Flower (round) | sequential / Flower (round) | Flower round (s, median) | "
          "Flower clients' own training (s per round, summed over clients) | actors' torch threads |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        fl_s = float(np.median([x.seconds for x in r.flower[1:]]))
        own = float(np.median([x.client_train_s for x in r.flower[1:]]))
        b = float(np.median([tr for _, tr in r.ours["batched (ours)"]]))
        s = float(np.median([tr for _, tr in r.ours["sequential (ours)"]]))
        print(f"| {r.model} | {fl_s / b:.1f}× | {fl_s / s:.1f}× | {fl_s:.2f} | {own:.2f} | "
              f"{r.flower[-1].torch_threads:g} |")
    print(f"\nstart-up: ours adds the imports ({T_IMPORTS:.2f} s, flwr and ray included) to the first loop built; "
          "Flower's counts from building the initial weights to the end of its first round (Ray, the actors, their "
          "imports and data). The driver's RSS before each simulation (torch, flwr, ray, our loops built): "
          + ", ".join(f"{r.model} {r.driver_rss_before / mib:,.0f} MiB" for r in results) + ".")


def batched_after(model: str, rounds: int) -> dict[str, torch.Tensor]:
    """The batched loop's global model after ``rounds`` rounds (the adapter's reference)."""
    loop = OurLoop(model, True)
    for rnd in range(rounds):
        loop.round(rnd)
    return loop.algo.global_params


if __name__ == "__main__":
    main()
