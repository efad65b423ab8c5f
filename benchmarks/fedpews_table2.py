"""FedPeWS Table 2: rounds to reach the target accuracy and final accuracy of the global model, FedAvg vs
FedAvg+PeWS, on the same seeds.

    python benchmarks/fedpews_table2.py configs/fedpews-synthetic32k.toml --seeds 0 1 2 [--algorithms fedavg fedpews]
        [--jobs 2] [--threads 1] [--rounds T]

Each (algorithm, seed) is one run (``--jobs`` of them at once, each with ``--threads`` torch threads); progress goes
to stderr every 10 rounds, one JSON line per finished run to stdout (with the global model's accuracy per round),
then a table of mean ± std per algorithm: rounds to the config's target accuracy and to each ``--targets`` (the
first round, counted from 1, whose global accuracy is ≥ υ), and the final global accuracy.
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

    from edgemask.trainer.config import AlgorithmConfig, RunConfig, TrainConfig
    from edgemask.trainer.simulation import simulate

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

    res = simulate(cfg, progress)
    s = res.summary
    curve = [round(r["value"], 5) for r in res.history if r["client"] == "server" and r["metric"] == "global_accuracy"]
    return {"algorithm": name, "seed": seed, "rounds_to_target": s.get("rounds_to_target"),
            "target": s.get("target_accuracy"), "final_global_accuracy": s.get("global_accuracy"),
            "rounds": cfg.training.rounds, "wall_seconds": round(s["wall_seconds"], 1), "global_accuracy": curve}


def rounds_to(curve: list[float], target: float) -> int | None:
    return next((i + 1 for i, v in enumerate(curve) if v >= target), None)


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
    ap.add_argument("--targets", type=float, nargs="*", default=[0.8, 0.9, 0.95],
                    help="more target accuracies to report rounds for")
    a = ap.parse_args()
    plan = [(name, seed) for seed in a.seeds for name in a.algorithms]
    rows = []
    with ProcessPoolExecutor(a.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(one_run, a.config, name, seed, a.threads, a.rounds) for name, seed in plan]
        for f in futures:
            rows.append(f.result())
            print(json.dumps(rows[-1]), flush=True)
    targets = sorted({*a.targets, *([rows[0]["target"]] if rows[0]["target"] is not None else [])})
    print(f"\n{a.config}: {rows[0]['rounds']} rounds, seeds {a.seeds}; rounds to reach each target accuracy of the "
          f"global model (mean ± std over the seeds that reach it; × none)\n")
    print("| algorithm | " + " | ".join(f"rounds to {100 * t:g} % (reached)" for t in targets)
          + " | final global accuracy | per seed, rounds to each target |")
    print("| --- |" + " ---: |" * (len(targets) + 1) + " --- |")
    for name in a.algorithms:
        r = [x for x in rows if x["algorithm"] == name]
        cells = []
        for t in targets:
            reached = [n for x in r if (n := rounds_to(x["global_accuracy"], t)) is not None]
            cells.append(f"{mean_std(reached, '.1f')} ({len(reached)}/{len(r)})")
        acc = [100 * x["final_global_accuracy"] for x in r]
        per = "; ".join(f"s{x['seed']}: " + "/".join(str(rounds_to(x["global_accuracy"], t) or "×") for t in targets)
                        for x in r)
        print(f"| {name} | " + " | ".join(cells) + f" | {mean_std(acc, '.2f')} % | {per} |")

if __name__ == "__main__":
    main()
