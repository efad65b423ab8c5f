"""``training.one_sample_batch`` measured: what leaving out an epoch's lone last sample costs.

Two figures (docs/training-engine.md, "A one-sample last minibatch"):

* on the FEMNIST stand-in at the paper's 2,414 writers (``benchmarks/standins.py``; labelled a stand-in), per batch
  size, the devices whose epoch ends in one sample and the share of the training samples an epoch then leaves out;
* on a model where both settings train (``tiny_mobilenet``: batch norm, never 1×1 on 28×28), ``keep`` against
  ``drop`` over seeds: mean accuracy ± sample standard deviation and the samples seen, so whether a finding
  survives the choice can be read off.

    .venv/bin/python benchmarks/one_sample_batch.py [--writers 20] [--rounds 5] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from standins import PAPER, Size, standin  # noqa: E402

from edgemask.trainer.config import TrainConfig  # noqa: E402
from edgemask.trainer.data import DataConfig, build_dataset  # noqa: E402
from edgemask.trainer.simulation import simulate  # noqa: E402


def lone_samples(root: Path, batch_sizes: list[int]) -> list[tuple[int, int, float, float]]:
    """Per batch size B: (B, devices whose training count ≡ 1 mod B, their share, the samples left out per epoch
    over all samples)."""
    ds = build_dataset(DataConfig(name="femnist", root=str(root), num_clients=10**9, partition="natural"), 0)
    n = np.array([c.num_train for c in ds.clients])
    return [(b, int((n % b == 1).sum()), float((n % b == 1).mean()), float((n % b == 1).sum() / n.sum()))
            for b in batch_sizes]


def config(root: Path, writers: int, rounds: int, seed: int, rule: str, model: str) -> TrainConfig:
    return TrainConfig.from_dict({
        "run": {"seed": seed},
        "data": {"name": "femnist", "root": str(root), "num_clients": writers, "partition": "natural"},
        "model": {"name": model}, "algorithm": {"name": "fedavg"},
        "training": {"rounds": rounds, "local_epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.9,
                     "eval_every": rounds, "one_sample_batch": rule}})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--writers", type=int, default=20, help="writers of the accuracy comparison")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--model", default="tiny_mobilenet")
    ap.add_argument("--cache", type=Path, default=Path("workspace/bench-data"))
    args = ap.parse_args()

    paper = standin("femnist", args.cache)
    print(f"FEMNIST STAND-IN at the paper's {PAPER['femnist'].users:,} writers ({paper})")
    print("batch | devices ending in one sample | share of devices | samples left out per epoch")
    for b, k, share, left in lone_samples(paper, [8, 16, 32, 64]):
        print(f"{b:5d} | {k:28d} | {share:16.2%} | {left:.4%}")

    small = standin("femnist", args.cache, Size(args.writers, PAPER["femnist"].mean_samples))
    print(f"\n{args.model}, FedAvg, {args.writers} writers of the FEMNIST STAND-IN, {args.rounds} rounds, "
          f"batch 16, seeds {args.seeds}")
    print("setting | mean accuracy ± sd | samples seen a run")
    for rule in ("keep", "drop"):
        acc, seen = [], []
        for seed in args.seeds:
            res = simulate(config(small, args.writers, args.rounds, seed, rule, args.model))
            acc.append(res.summary["mean_accuracy"])
            seen.append(sum(r["value"] for r in res.history if r["metric"] == "samples_seen"))
        print(f"{rule:7s} | {np.mean(acc):.4f} ± {np.std(acc, ddof=1) if len(acc) > 1 else 0:.4f} | "
              f"{np.mean(seen):,.0f}")


if __name__ == "__main__":
    main()
