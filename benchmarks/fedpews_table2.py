"""FedPeWS Table 2: rounds to reach the target accuracy and final accuracy of the global model, FedAvg vs
FedAvg+PeWS, on the same seeds.

    python benchmarks/fedpews_table2.py configs/fedpews-synthetic32k.toml --seeds 0 1 2 [--algorithms fedavg fedpews]
        [--jobs 2] [--threads 1] [--rounds T]

Each (algorithm, seed) is one run (``--jobs`` of them at once, each with ``--threads`` torch threads); progress goes
to stderr every 10 rounds, one JSON line per finished run to stdout, then a table of mean ± std per algorithm.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def one_run(config: str, name: str, seed: int, threads: int, rounds: int | None) -> dict:
    import torch

    from trainer.config import AlgorithmConfig, RunConfig, TrainConfig
    from trainer.simulation import simulate

    torch.set_num_threads(threads)
    base = TrainConfig.load(config)
    args = base.algorithm.args if name == base.algorithm.name else {}
    if name == "fedprox" and "mu" in base.algorithm.args:
        args = {"mu": base.algorithm.args["mu"]}
    training = base.training if rounds is None else dataclasses.replace(base.training, rounds=rounds)
    cfg = base.replace(run=RunConfig(seed=seed), algorithm=AlgorithmConfig(name, args), training=training)

    def progress(done: int, total: int, metrics: dict) -> None:
        if done and (done % 10 == 0 or done == total):
            print(f"{name} seed {seed}: round {done}/{total}, mean accuracy {metrics.get('mean_accuracy', 0):.4f}",
                  file=sys.stderr, flush=True)

    s = simulate(cfg, progress).summary
    return {"algorithm": name, "seed": seed, "rounds_to_target": s.get("rounds_to_target"),
            "target": s.get("target_accuracy"), "final_global_accuracy": s.get("global_accuracy"),
            "rounds": cfg.training.rounds, "wall_seconds": round(s["wall_seconds"], 1)}


def mean_std(xs: list[float], fmt: str) -> str:
    if not xs:
        return "×"
    return format(statistics.mean(xs), fmt) + (f" ± {format(statistics.stdev(xs), fmt)}" if len(xs) > 1 else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "fedpews"])
    ap.add_argument("--jobs", type=int, default=1, help="runs at once (processes)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run")
    ap.add_argument("--rounds", type=int, default=None, help="override training.rounds")
    a = ap.parse_args()
    plan = [(name, seed) for seed in a.seeds for name in a.algorithms]
    rows = []
    with ProcessPoolExecutor(a.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(one_run, a.config, name, seed, a.threads, a.rounds) for name, seed in plan]
        for f in futures:
            rows.append(f.result())
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{a.config}: target accuracy {rows[0]['target']}, {rows[0]['rounds']} rounds, seeds {a.seeds}\n")
    print("| algorithm | reached target (seeds) | rounds to target | final global accuracy | per seed (rounds) |")
    print("| --- | ---: | ---: | ---: | --- |")
    for name in a.algorithms:
        r = [x for x in rows if x["algorithm"] == name]
        reached = [x["rounds_to_target"] for x in r if x["rounds_to_target"] is not None]
        acc = [100 * x["final_global_accuracy"] for x in r]
        per = ", ".join(f"s{x['seed']}: {x['rounds_to_target'] or '×'}" for x in r)
        print(f"| {name} | {len(reached)}/{len(r)} | {mean_std(reached, '.1f')} | {mean_std(acc, '.2f')} % | {per} |")


if __name__ == "__main__":
    main()
