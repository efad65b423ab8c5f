"""Whole rounds of ``simulate()`` (what ``edgemask train`` runs): training, uploads, the server's aggregate, the
exact FLOP accounting and every client's evaluation, per algorithm, batched against the sequential reference loop,
measured in one run so the ratios share the machine's load.

Workload: 100 clients, digits split 2 classes per client, the MLP 64-128-64-10, 1 local epoch, batch 16, evaluation
every round. Each algorithm's batched and sequential runs alternate (``--repeats`` times, in a random order); a run's
set-up (data, model, the algorithm's ``setup()`` such as FedMask's one-shot pruning) is timed apart from its rounds.

    python benchmarks/bench_simulate.py [--rounds 5] [--repeats 2] [--algorithms fedavg,fedmask,...] [--threads N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from edgemask.errors import EdgemaskError
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig
from edgemask.trainer.data import DataConfig
from edgemask.trainer.simulation import simulate

ALGORITHMS = "fedavg,fedmask,perfedmask,fedpews,heterofl,fedper,ditto,perfedavg"
ARGS = {"fedpews": {"warmup_rounds": 1}}  # the rounds after the warm-up, where its masks work


def config(algorithm: str, batched: bool, rounds: int) -> TrainConfig:
    return TrainConfig(run=RunConfig(seed=0), data=DataConfig(name="digits", num_clients=100,
                                                              partition="pathological", classes_per_client=2),
                       model=ModelConfig("mlp", {"hidden": [128, 64]}),
                       algorithm=AlgorithmConfig(algorithm, ARGS.get(algorithm, {})),
                       training=TrainingConfig(rounds=rounds, local_epochs=1, batch_size=16, lr=0.05,
                                               batched=batched))


def timed_run(cfg: TrainConfig) -> tuple[float, float, float]:
    """(set-up seconds, seconds per round, final mean accuracy) of one simulate() run."""
    marks: list[float] = []
    t0 = time.perf_counter()
    res = simulate(cfg, progress=lambda done, total, metrics: marks.append(time.perf_counter()))
    return marks[0] - t0, (marks[-1] - marks[0]) / cfg.training.rounds, res.summary["mean_accuracy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each loop per algorithm (median reported)")
    ap.add_argument("--algorithms", default=ALGORITHMS)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; 100 clients, digits 2 classes/client, "
          f"MLP 64-128-64-10, E = 1, batch 16, {args.rounds} rounds, evaluation every round, "
          f"{args.repeats} run(s) of each loop")
    print("\n| algorithm | batched: s/round | sequential: s/round | batched speed-up (paired median) | "
          "set-up batched (s) | set-up sequential (s) | mean accuracy batched / sequential |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rng = np.random.default_rng(0)
    for algo in args.algorithms.split(","):
        try:
            for batched in (True, False):  # first-use costs (lazy imports: torch.optim's and torch.func.grad's
                simulate(config(algo, batched, 1))  # torch._dynamo, 2 s) are paid once a process, not per round
        except EdgemaskError as e:  # e.g. fedpews_fixed needs a neuron per client: not this workload
            print(f"| {algo} | not run: {e} | | | | | |", flush=True)
            continue
        runs: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
        for _ in range(args.repeats):
            for batched in rng.permutation([True, False]):
                runs[bool(batched)].append(timed_run(config(algo, bool(batched), args.rounds)))
        b, s = (np.array(runs[k]) for k in (True, False))
        paired = np.median(s[:, 1] / b[:, 1])
        print(f"| {algo} | {np.median(b[:, 1]):.3f} | {np.median(s[:, 1]):.3f} | {paired:.1f}× | "
              f"{np.median(b[:, 0]):.2f} | {np.median(s[:, 0]):.2f} | {b[-1, 2]:.4f} / {s[-1, 2]:.4f} |", flush=True)


if __name__ == "__main__":
    main()
