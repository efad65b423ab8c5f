"""The papers' own settings on one host: FedMask's IC-CIFAR10 (VGG16, 400 devices, 20 a round) and PerFedMask's
CIFAR-10 c = 1 (ResNet18, 100 devices, every one every round), from their configs in ``configs/``, at fewer devices
and smaller widths as asked. Prints per phase the seconds of one run, its peak host RSS and GPU memory, and the
projection to the config's own rounds.

    python benchmarks/bench_scale.py [--cases fedmask,perfedmask] [--devices 50,100,200,400] [--widths 0.125]
                                     [--rounds 1] [--device cpu] [--data-root DIR]

Each (case, devices, width) runs in a fresh process, so its peak RSS is its own. Without ``--data-root`` holding
the CIFAR-10 python batches, a stand-in is written once under ``--cache`` (CIFAR-10's python batch format,
50,000 + 10,000 images: a fixed colour pattern per class plus noise, so the masks have something to learn).

Phases (exclusive seconds: a phase inside another counts once, in the inner one):

* ``data``: reading and partitioning the dataset;
* ``setup``: the algorithm's ``setup()`` outside local training (FedMask's top-k and bookkeeping, PerFedMask's
  MILP); ``setup train``: local training inside it (ClientPruning's epoch);
* ``train``: the rounds' local training (the stacked forward/backward passes, by the engine);
* ``tasks``: building each selected device's local task (FedMask's start m^T ⊙ m_k);
* ``aggregate``: the uploads (``client_updates``) and the server's ``aggregate``;
* ``eval``: the stacked evaluation forward passes; ``eval glue``: the rest of an evaluation (each device's model);
* ``other``: the rest of ``simulate`` (the model, FLOP and byte accounting, the history).

``outside`` is the share of the rounds' time spent outside the stacked passes (tasks, aggregate, eval glue,
other), the figure #36 holds to 20 %; data and set-up are once a run, not in it. The projection: data and set-up
+ the config's rounds × a round's time outside evaluation + its evaluations (every ``eval_every`` rounds) × one
evaluation's time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = {"fedmask": ROOT / "configs" / "ic-cifar10-fedmask.toml",
           "perfedmask": ROOT / "configs" / "perfedmask-cifar10-c1.toml"}
PHASES = ("data", "setup", "setup train", "train", "tasks", "aggregate", "eval", "eval glue", "other")


def write_standin(directory: Path, seed: int = 0) -> Path:
    """CIFAR-10's python batches (5 × 10,000 train, 10,000 test): class c's images are its fixed random colour
    pattern plus Gaussian noise (σ = 48 of 255), clipped to uint8. Written once; a complete directory is reused."""
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    if all((directory / n).is_file() for n in names):
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    patterns = rng.integers(0, 256, (10, 3072)).astype(np.float32)
    for name in names:
        labels = rng.integers(0, 10, 10_000)
        data = np.clip(patterns[labels] + rng.normal(0, 48, (10_000, 3072)), 0, 255).astype(np.uint8)
        tmp = directory / f".{name}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"labels": labels.tolist(), b"data": data}, f, protocol=2)
        tmp.replace(directory / name)
    return directory


def case_config(case: str, devices: int, width: float, rounds: int, device: str, data_root: Path):
    from edgemask.trainer.config import TrainConfig

    cfg = TrainConfig.load(CONFIGS[case])
    data = dataclasses.replace(cfg.data, root=str(data_root), num_clients=devices)
    model = dataclasses.replace(cfg.model, args={**cfg.model.args, "width": width})
    training = dataclasses.replace(cfg.training, rounds=rounds, eval_every=1, device=device)
    return cfg, cfg.replace(data=data, model=model, training=training)


class PhaseClock:
    """Exclusive seconds per phase: a wrapped call's time, less the wrapped calls inside it."""

    def __init__(self) -> None:
        self.seconds = {p: 0.0 for p in PHASES}
        self.calls = {p: 0 for p in PHASES}
        self.stack: list[list[float]] = []

    def wrap(self, owner, attr: str, phase, inner: str | None = None) -> None:
        fn = getattr(owner, attr)
        clock = self

        def timed(*args, **kwargs):
            name = phase if inner is None or not clock.stack else inner
            clock.stack.append([0.0])
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter() - t0
                children = clock.stack.pop()[0]
                clock.seconds[name] += elapsed - children
                clock.calls[name] += 1
                if clock.stack:
                    clock.stack[-1][0] += elapsed

        setattr(owner, attr, timed)


def run_one(case: str, devices: int, width: float, rounds: int, device: str, data_root: Path) -> dict:
    """One simulate() of the case, its phases timed; peak RSS and GPU memory of this process."""
    import torch

    from edgemask.trainer import engines, simulation
    from edgemask.trainer.algorithms import ALGORITHMS

    base, cfg = case_config(case, devices, width, rounds, device, data_root)
    clock = PhaseClock()
    algo_cls = ALGORITHMS.get(cfg.algorithm.name)
    clock.wrap(algo_cls, "setup", "setup")
    for engine in (engines.BatchedEngine, engines.SequentialEngine):
        clock.wrap(engine, "train", "train", inner="setup train")  # inside setup: ClientPruning's epoch
        clock.wrap(engine, "evaluate", "eval")
    clock.wrap(algo_cls, "local_task", "tasks")
    clock.wrap(algo_cls, "client_updates", "aggregate")
    clock.wrap(algo_cls, "aggregate", "aggregate")
    clock.wrap(simulation, "evaluate_clients", "eval glue")
    clock.wrap(simulation, "build_dataset", "data")
    # setup's own engine calls land in "setup train" (the clock's stack is non-empty), the rounds' in "train"
    t0 = time.perf_counter()
    result = simulation.simulate(cfg)
    total = time.perf_counter() - t0
    clock.seconds["other"] = total - sum(clock.seconds.values())
    peak_gpu = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    evals = clock.calls["eval glue"]
    s = clock.seconds
    per_round = (s["train"] + s["tasks"] + s["aggregate"] + s["other"]) / rounds
    per_eval = (s["eval"] + s["eval glue"]) / max(evals, 1)
    full_rounds, every = base.training.rounds, base.training.eval_every
    evaluations = -(-full_rounds // every)
    projection = s["data"] + s["setup"] + s["setup train"] + full_rounds * per_round + evaluations * per_eval
    stacked = s["train"] + s["eval"]
    round_time = total - s["data"] - s["setup"] - s["setup train"]
    return {"case": case, "devices": devices, "width": width, "rounds": rounds, "device": device,
            "seconds": s, "total": total, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "peak_gpu": peak_gpu, "outside": 1 - stacked / round_time if round_time else float("nan"),
            "projection": projection, "full_rounds": full_rounds,
            "accuracy": result.summary["mean_accuracy"], "threads": torch.get_num_threads()}


def table(rows: list[dict]) -> str:
    head = ("case", "devices", "width", *PHASES, "total s", "outside", "peak RSS GB", "GPU GB", "projection")
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        s = r["seconds"]
        lines.append(" | ".join([r["case"], str(r["devices"]), f"{r['width']:g}", *(f"{s[p]:.2f}" for p in PHASES),
                                 f"{r['total']:.1f}", f"{100 * r['outside']:.0f} %", f"{r['peak_rss'] / 1e9:.2f}",
                                 f"{r['peak_gpu'] / 1e9:.2f}",
                                 f"{r['projection'] / 60:.1f} min / {r['full_rounds']} rounds"]))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="fedmask,perfedmask")
    ap.add_argument("--devices", default="50,100,200,400")
    ap.add_argument("--widths", default="0.125")
    ap.add_argument("--rounds", type=int, default=1, help="rounds run (each evaluated)")
    ap.add_argument("--device", default="cpu", help="training.device: cpu or cuda")
    ap.add_argument("--data-root", type=Path, default=None, help="the CIFAR-10 python batches (default: a stand-in)")
    ap.add_argument("--cache", type=Path, default=ROOT / "workspace" / "bench-data" / "cifar-standin")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # case:devices:width, run in this process (a child's)
    args = ap.parse_args()
    root = args.data_root or write_standin(args.cache)
    if args.one:
        case, devices, width = args.one.split(":")
        print(json.dumps(run_one(case, int(devices), float(width), args.rounds, args.device, root)))
        return
    rows = []
    for case in args.cases.split(","):
        for width in (float(w) for w in args.widths.split(",")):
            for devices in (int(d) for d in args.devices.split(",")):
                cmd = [sys.executable, __file__, "--one", f"{case}:{devices}:{width}", "--rounds", str(args.rounds),
                       "--device", args.device, "--data-root", str(root)]
                p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
                if p.returncode != 0:
                    print(f"{case} {devices} devices width {width:g}: failed (exit {p.returncode}): "
                          f"{(p.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
                    continue
                rows.append(json.loads(p.stdout.strip().splitlines()[-1]))
                print(table(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
