"""FedPeWS Table 2: rounds to reach the target accuracy and final accuracy of the global model, FedAvg vs
FedAvg+PeWS, on the same seeds.

    python benchmarks/fedpews_table2.py configs/fedpews-synthetic32k.toml --seeds 0 1 2 [--algorithms fedavg fedpews]

Prints one JSON line per (algorithm, seed) as it finishes, then mean ± std per algorithm.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainer.config import AlgorithmConfig, RunConfig, TrainConfig  # noqa: E402
from trainer.simulation import simulate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "fedpews"])
    a = ap.parse_args()
    base = TrainConfig.load(a.config)
    rows = []
    for seed in a.seeds:
        for name in a.algorithms:
            args = base.algorithm.args if name == base.algorithm.name else {}
            if name == "fedprox" and "mu" in base.algorithm.args:
                args = {"mu": base.algorithm.args["mu"]}
            cfg = base.replace(run=RunConfig(seed=seed), algorithm=AlgorithmConfig(name, args))
            s = simulate(cfg).summary
            row = {"algorithm": name, "seed": seed, "rounds_to_target": s.get("rounds_to_target"),
                   "target": s.get("target_accuracy"), "final_global_accuracy": s.get("global_accuracy"),
                   "wall_seconds": round(s["wall_seconds"], 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    for name in a.algorithms:
        r = [x for x in rows if x["algorithm"] == name]
        reached = [x["rounds_to_target"] for x in r if x["rounds_to_target"] is not None]
        acc = [x["final_global_accuracy"] for x in r]
        print(json.dumps({"algorithm": name, "seeds": [x["seed"] for x in r], "reached": len(reached),
                          "rounds_mean": statistics.mean(reached) if reached else None,
                          "rounds_std": statistics.stdev(reached) if len(reached) > 1 else None,
                          "final_mean": statistics.mean(acc), "final_std": statistics.stdev(acc) if len(acc) > 1 else None}))


if __name__ == "__main__":
    main()
