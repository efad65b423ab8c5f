"""How far the engines agree on one run (issue #45): the local batched engine, ``--sequential`` and
``--engine flower`` on FedMask's IC-CIFAR10 config (``configs/ic-cifar10-fedmask.toml``) at a smaller width and
device count, on CIFAR-shaped stand-in images (``benchmarks/bench_scale.py``'s ``write_standin``).

    python benchmarks/engines_agreement.py [--devices 400] [--width 0.125] [--rounds 1] [--seed 0]
                                           [--engines batched,sequential,flower[,flower-sequential]]
                                           [--spread-seeds 1,2,3,4] [--out DIR] [--reuse]

Each engine runs in a fresh process, one after another (its history and every client's local mask are saved under
``--out``; ``--reuse`` reads a saved run instead of running it again). Then, per pair of engines, per history
metric: how many values differ by more than 1e-5 (``|a − b| > 1e-5 · max(1, |a|)``, the tests' tolerance), the
largest difference, and how many are not bit for bit; the masks' Hamming distance (elements of a client's local
mask that differ, the largest over the clients and how many clients differ at all); each engine's mean accuracy;
with ``--spread-seeds``, the first engine's mean accuracy over those seeds too (its standard deviation: how far two
runs apart by their seed alone land). The figures are in docs/training-engine.md, "How far the engines agree".

Flower runs on its simulation engine (Ray, ``--flower-workers`` CPUs, one torch thread each), as
``edgemask train --engine flower`` does; ``flower-sequential`` (not run by default) is the same with
``training.batched = false``, the server setting up and evaluating one device at a time.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
# batched: `edgemask train`; sequential: `--sequential`; flower: `--engine flower` (the server sets up and evaluates
# with the config's engine, batched); flower-sequential: `--engine flower` with `training.batched = false`
ENGINES = ("batched", "sequential", "flower", "flower-sequential")
TOL = 1e-5


def config(devices: int, width: float, rounds: int, data_root: Path, engine: str, seed: int = 0):
    """The IC-CIFAR10 FedMask config at ``devices`` and ``width``, ``rounds`` rounds, evaluated after each."""
    from edgemask.trainer.config import TrainConfig

    cfg = TrainConfig.load(ROOT / "configs" / "ic-cifar10-fedmask.toml")
    return cfg.replace(
        run=dataclasses.replace(cfg.run, seed=seed),
        data=dataclasses.replace(cfg.data, root=str(data_root), num_clients=devices),
        model=dataclasses.replace(cfg.model, args={**cfg.model.args, "width": width}),
        training=dataclasses.replace(cfg.training, rounds=rounds, eval_every=1,
                                     batched=engine not in ("sequential", "flower-sequential")))


def run_engine(cfg, engine: str, workers: int = 2) -> dict:
    """One run by ``engine``: its history rows, each client's local mask (``{weight: packed bits}``, np.packbits of
    the flattened mask) and the mean accuracy."""
    t0 = time.perf_counter()
    if engine.startswith("flower"):
        from edgemask.trainer.flower import simulate_flower

        (res,) = simulate_flower([cfg], workers=workers)
    else:
        from edgemask.trainer.simulation import simulate

        res = simulate(cfg)
    algo = res.algorithm
    masks = {cid: {w: np.packbits(m.bool().reshape(-1).numpy()) for w, m in algo.client_state(cid).masks.items()}
             for cid in algo.client_ids}
    return {"history": res.history, "masks": masks, "mean_accuracy": res.summary["mean_accuracy"],
            "elements": sum(int(m.numel()) for m in algo.client_state(algo.client_ids[0]).masks.values()),
            "seconds": time.perf_counter() - t0}


def hamming(a: dict, b: dict) -> dict[str, int]:
    """Per client, the elements of its local mask that differ between runs ``a`` and ``b``."""
    return {cid: sum(int(np.unpackbits(a["masks"][cid][w] ^ b["masks"][cid][w]).sum()) for w in a["masks"][cid])
            for cid in a["masks"]}


def differ(a: float, b: float) -> bool:
    if np.isnan(a) and np.isnan(b):
        return False
    return not abs(a - b) <= TOL * max(1.0, abs(a))


def compare(a: dict, b: dict) -> tuple[list[tuple], dict]:
    """Per metric (rows: metric, values, unequal, differing by more than :data:`TOL`, largest difference), and the
    masks' Hamming distances (:func:`hamming`)."""
    ka = [(r["round"], r["client"], r["metric"]) for r in a["history"]]
    kb = [(r["round"], r["client"], r["metric"]) for r in b["history"]]
    if ka != kb:
        raise SystemExit("the two histories hold different rows")
    per: dict[str, list] = {}
    for ra, rb in zip(a["history"], b["history"]):
        d = per.setdefault(ra["metric"], [0, 0, 0, 0.0])
        va, vb = ra["value"], rb["value"]
        d[0] += 1
        if not (va == vb or (np.isnan(va) and np.isnan(vb))):
            d[1] += 1
            d[3] = max(d[3], abs(va - vb))
        d[2] += differ(va, vb)
    rows = [(m, *v) for m, v in sorted(per.items())]
    ham = list(hamming(a, b).values())
    return rows, {"max": max(ham), "clients": sum(h > 0 for h in ham), "of": len(ham), "elements": a["elements"],
                  "mean": float(np.mean(ham))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=400)
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spread-seeds", default="", help="more seeds run by the first engine alone: the spread of "
                    "the mean accuracy across seeds, to judge the engines' differences by")
    ap.add_argument("--engines", default=",".join(ENGINES[:3]))
    ap.add_argument("--flower-workers", type=int, default=2)
    ap.add_argument("--data-root", type=Path, help="the CIFAR-10 python batches (default: the stand-in)")
    ap.add_argument("--cache", type=Path, default=ROOT / "workspace" / "bench-data" / "cifar-standin")
    ap.add_argument("--out", type=Path, default=ROOT / "workspace" / "bench-data" / "engines-agreement")
    ap.add_argument("--reuse", action="store_true", help="read a saved engine's run instead of running it")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child: run this engine and save it
    args = ap.parse_args()
    root = args.data_root
    if root is None:
        from bench_scale import write_standin

        root = write_standin(args.cache)
    tag = f"d{args.devices}-w{args.width}-r{args.rounds}-s{args.seed}"
    if args.one:
        cfg = config(args.devices, args.width, args.rounds, root, args.one, args.seed)
        out = run_engine(cfg, args.one, args.flower_workers)
        with open(args.out / f"{tag}-{args.one}.pkl", "wb") as f:
            pickle.dump(out, f)
        return
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise SystemExit(f"--engines: unknown {', '.join(unknown)}; valid: {', '.join(ENGINES)}")
    args.out.mkdir(parents=True, exist_ok=True)

    def run(engine: str, seed: int) -> dict:  # in its own process
        path = args.out / f"d{args.devices}-w{args.width}-r{args.rounds}-s{seed}-{engine}.pkl"
        if not (args.reuse and path.is_file()):
            cmd = [sys.executable, __file__, "--one", engine, "--devices", str(args.devices), "--width",
                   str(args.width), "--rounds", str(args.rounds), "--seed", str(seed), "--flower-workers",
                   str(args.flower_workers), "--data-root", str(root), "--out", str(args.out)]
            subprocess.run(cmd, check=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        with open(path, "rb") as f:
            return pickle.load(f)

    runs = {e: run(e, args.seed) for e in engines}  # one after another
    spread = {args.seed: runs[engines[0]]}
    spread.update({int(s): run(engines[0], int(s)) for s in args.spread_seeds.split(",") if s.strip()})
    print(f"FedMask IC-CIFAR10, VGG16 width {args.width}, {args.devices} devices, {args.rounds} round(s), "
          f"seed {args.seed}")
    for e, r in runs.items():
        print(f"  {e:<18} mean accuracy {r['mean_accuracy']:.4f}  ({r['seconds']:.0f} s)")
    if len(spread) > 1:
        for name in ("mean_accuracy", "mean_accuracy_returned_mask"):
            acc = [next(row["value"] for row in r["history"] if row["metric"] == name) for r in spread.values()]
            print(f"  {engines[0]} {name} over seeds {', '.join(map(str, spread))}: "
                  f"{', '.join(f'{a:.4f}' for a in acc)}; sd {np.std(acc, ddof=1):.4f}, range {np.ptp(acc):.4f}")
    for a, b in itertools.combinations(engines, 2):
        rows, ham = compare(runs[a], runs[b])
        n, u, d = (sum(r[i] for r in rows) for i in (1, 2, 3))
        print(f"\n{a} vs {b}: {d} of {n} values differ by more than {TOL:g} ({u} not bit for bit); local masks: "
              f"{ham['clients']} of {ham['of']} clients differ, Hamming distance max {ham['max']} mean "
              f"{ham['mean']:.1f} (of {ham['elements']} elements)")
        if u:
            print(f"  {'metric':<34} {'values':>7} {'unequal':>7} {'> tol':>7} {'max |a-b|':>11}")
        for m, k, uk, dk, mx in rows:
            if uk:
                print(f"  {m:<34} {k:>7} {uk:>7} {dk:>7} {mx:>11.4g}")


if __name__ == "__main__":
    main()
