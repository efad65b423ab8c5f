"""The per-layer model of a training step (issue #46): fit on a sample of clients, predict the held-out clients'
measured steps and local rounds, on the `local` device or (``--device arm64-standin``) the fleet's aarch64
stand-in (qemu-user, a Cortex-A72 model: NOT a Raspberry Pi).

Per case a run is trained (``simulate``, 1 round: a step's cost depends on the tensors it trains and the model's
shapes, not on what the masks learned), every client's local step exported as ``torch-train``, and each measured by
the real runner on the `local` device (``devices.benchmark.run_benchmark``) with its profiled steps after the timed
ones. Clients are measured ``--reps`` times round-robin (a shared machine's load falls on all of them alike); a
client's step, round and profiled steps are those of its repetition with the smallest p50 (``--estimator min``: the
one least disturbed by other processes, as timeit takes its minimum) or the medians over repetitions with the
profiled steps pooled (``median``). Then ``--sample`` clients (spread over their trained parameters, as ``predict.choose_sample`` spreads over
kept units; seeded) are fitted and the others predicted (``profiling.train_predict``), and every client is also
predicted leave-one-out (clients only; the run's dense baseline, no client, is predicted apart: FedMask's trains the
same tensors ungated, so its step skips the gate ops every client's has). Printed per case: the share of held-out steps within ±10 % (target ≥ 90 %), the worst, the
refused ones with why, the same for local rounds, and the line in the trained fraction (``profiling.budgets``) on
the same split for comparison. For PerFedMask, ``edgemask budgets``' two cost models on the same measurements
(:func:`budgets_effect`): the deadline misses of the layers each model's budgets give, as measured.

Cases:
* ``fedmask-mlp``: the demo's FedMask (``cli/configs/demo-fedmask.toml``: MLP 64-3072-2048-10 on digits, 8
  clients); every client's step trains the same tensors (the masks' scores of its masked layers), so held-out error
  is the clients' own spread;
* ``perfedmask-digits``: ``configs/digits-perfedmask.toml`` (MLP 64-1024-1024-1024-10) with ``--pfm-clients``
  devices whose budgets cycle through :data:`PFM_BUDGETS`, so P^mask gives them different layers;
* ``vgg16-cifar``: VGG16 at ``--vgg-width`` in FedMask's IC-CIFAR10 setting (``configs/ic-cifar10-fedmask.toml``:
  the last 8 masked layers, prune rate 0.2, 2 classes per client) on a STAND-IN CIFAR-10 (random pixels in the
  dataset's own file format; no download; a step's time does not depend on pixel values), 8 clients.

    .venv/bin/python benchmarks/bench_train_predict.py [--cases fedmask-mlp,perfedmask-digits,vgg16-cifar]
        [--reps 3] [--sample 4] [--threads 1] [--device local|arm64-standin]

The machine these figures come from may be shared (other processes on its cores): say so beside them.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
warnings.filterwarnings("ignore")


# PerFedMask's budgets ψ_n / d_w, cycled over the devices: with 15 devices P^mask gives them fc2, fc3, fc1 + fc2,
# fc1 + fc3 and the whole body (fc1 is 3 % of d_w, fc2 and fc3 48.5 % each); at 0.04 a device trains nothing
# (P^mask shares no layer with it), so it has no step to measure
PFM_BUDGETS = (0.04, 0.5, 0.52, 0.55, 1.0)


def _config(case: str, tmp: Path, args) -> dict:
    if case == "fedmask-mlp":
        cfg = tomllib.loads((ROOT / "cli" / "configs" / "demo-fedmask.toml").read_text())
    elif case == "perfedmask-digits":
        cfg = tomllib.loads((ROOT / "configs" / "digits-perfedmask.toml").read_text())
        n = args.pfm_clients
        cfg["data"]["num_clients"] = n
        cfg["algorithm"]["args"] = {"budgets": [PFM_BUDGETS[i % len(PFM_BUDGETS)] for i in range(n)],
                                    "finetune_epochs": 0}
    elif case == "vgg16-cifar":
        from bench_export_jobs import write_cifar_standin

        cfg = tomllib.loads((ROOT / "configs" / "ic-cifar10-fedmask.toml").read_text())
        cfg["data"].update(root=str(write_cifar_standin(tmp / "cifar-10-batches-py")), num_clients=8)
        cfg["model"]["args"] = {"width": args.vgg_width}
        cfg["training"].update(participation=1.0, local_epochs=1, eval_every=1)
    else:
        raise SystemExit(f"unknown case {case!r}")
    cfg["run"]["run_id"] = case
    cfg["training"]["rounds"] = 1
    return cfg


def build(case: str, tmp: Path, args) -> list[Path]:
    """Train the case's run one round, export every client's torch-train step; the artifact directories."""
    from edgemask.export import export_run
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.simulation import simulate

    cfg = TrainConfig.from_dict(_config(case, tmp, args))
    t0 = time.perf_counter()
    run = simulate(cfg).write(tmp / "runs" / cfg.run_id)
    export_run(run, tmp / "artifacts", "all", ["torch-train"], progress=False)
    arts = sorted(p for p in (tmp / "artifacts" / cfg.run_id).iterdir()
                  if json.loads((p / "manifest.json").read_text()).get("training"))
    print(f"  {case}: trained and exported {len(arts)} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    return arts


ARM64_STANDIN = "arm64-standin"


class Arm64StandIn:
    """The fleet's aarch64 stand-in (tests/fleet/standin.py): a Debian bookworm arm64 root filesystem with a Pi's
    runtimes, its own sshd, every binary under qemu-user as a Cortex-A72, one CPU's worth of quota. A STAND-IN, NOT
    a Raspberry Pi: its steps are an emulator's, so its figures test the predictor on another machine's costs, not a
    Pi's. Needs root and the fleet's cached root filesystem (built on first use, about 20 minutes). Slow: on the
    2-core project machine one measurement of the demo's FedMask step (deploy, load torch, 3 warm-up + 10 timed +
    5 profiled steps) took about 4.5 minutes, so pass few ``--reps`` and ``--min-runs``."""

    def __init__(self, ws: Path) -> None:
        sys.path.insert(0, str(ROOT / "tests"))
        from fleet.standin import PI4, FleetUnavailable, StandIn, arm64_rootfs, require_host, sweep

        try:
            require_host(aarch64=True)
        except FleetUnavailable as e:
            raise SystemExit(f"--device {ARM64_STANDIN}: the aarch64 stand-in cannot run here: {e}") from None
        sweep()
        ws.mkdir(parents=True, exist_ok=True)
        self.dev = StandIn.start("pi-bench", "aarch64", ws, lower=arm64_rootfs(), **PI4)

    def __enter__(self):
        from fleet.standin import PI_TRAINING_RUNTIMES

        return self.dev.spec(workdir="/root/training", runtimes=PI_TRAINING_RUNTIMES)

    def __exit__(self, *exc) -> None:
        self.dev.teardown()


def measure(arts: list[Path], args, ws: Path):
    """Each artifact ``--reps`` times round-robin: per artifact its manifest, timed step p50s, rounds and profiled
    runs, on ``--device`` (the local device, or the aarch64 stand-in: :class:`Arm64StandIn`)."""
    from contextlib import nullcontext

    from edgemask.devices.inventory import local_device
    from edgemask.devices.records import RunnerSettings

    settings = RunnerSettings(warmup_runs=3, warmup_seconds=0.2, min_runs=args.min_runs, min_seconds=args.min_seconds,
                              idle_seconds=0.0, threads=args.threads, profile_layers=True,
                              profile_runs=args.profile_runs, profile_warmup=3)
    with (Arm64StandIn(ws / "fleet") if args.device == ARM64_STANDIN else nullcontext(local_device(ws))) as dev:
        return _measure_on(dev, arts, args, settings)


def _measure_on(dev, arts, args, settings):
    from edgemask.devices.benchmark import run_benchmark
    from edgemask.devices.connection import open_connection

    got = {a.name: {"manifest": json.loads((a / "manifest.json").read_text()), "p50": [], "rounds": [], "runs": []}
           for a in arts}
    with open_connection(dev) as conn:
        for rep in range(args.reps):
            for a in arts:
                m = run_benchmark(conn, dev, a, "torch-train", settings=settings, train_rounds=args.rounds,
                                  timeout=3600)
                if not m.ok:
                    raise SystemExit(f"{a}: {m.error}")
                g = got[a.name]
                g["p50"].append(float(np.median(m.latency_ms)))
                g["rounds"].append(list(m.training["round_ms"]))
                if not m.profile.get("available"):
                    raise SystemExit(f"{a}: no profile: {m.profile.get('reason')}")
                g["runs"].append(m.profile["runs"])
    return got


def clients(got, estimator: str = "min") -> list:
    """Each client from its repetitions. ``min``: the repetition with the smallest timed p50, its round and its
    profiled steps (the least disturbed by other processes on a shared machine, as timeit's minimum); ``median``:
    the median p50 and round over repetitions, the profiled steps pooled."""
    from edgemask.profiling.train_predict import client_step

    out = []
    for g in got.values():
        if g["runs"] and isinstance(g["runs"][0], dict):  # kept before repetitions were kept apart: pooled
            g = {**g, "runs": [g["runs"]], "rounds": [g["rounds"]], "p50": g["p50"]}
            estimator = "median"
        if estimator == "min":
            i = int(np.argmin(g["p50"]))
            runs, step, rounds = g["runs"][i], g["p50"][i], g["rounds"][i]
        else:
            runs, step = [r for rep in g["runs"] for r in rep], statistics.median(g["p50"])
            rounds = [r for rep in g["rounds"] for r in rep]
        out.append(client_step(g["manifest"], {"available": True, "runs": runs}, step,
                               statistics.median(rounds) if rounds else None))
    return out


def spread_sample(cs, k: int, seed: int) -> list[str]:
    from edgemask.profiling.predict import choose_sample

    return choose_sample({c.artifact: c.trained_params for c in cs}, k, seed)


def line_errors(train, test) -> list[float]:
    """The line in the trained fraction on the same split: |error| of each held-out step (NaN: one fraction)."""
    f = np.array([c.trained_params for c in train], dtype=float)
    t = np.array([c.step_ms for c in train])
    if len(np.unique(f)) < 2:
        return [abs(float(np.median(t)) / c.step_ms - 1) for c in test]
    s, a = np.polyfit(f, t, 1)
    return [abs((a + s * c.trained_params) / c.step_ms - 1) for c in test]


def report(case: str, got, args) -> None:
    from edgemask.profiling.train_predict import error_summary, held_out, held_out_lines, leave_one_out

    every = clients(got, args.estimator)
    reps = max(len(g["p50"]) for g in got.values())
    cs = [c for c in every if not c.artifact.endswith("/dense")]  # the clients; the dense baseline apart
    dense = [c for c in every if c.artifact.endswith("/dense")]
    names = set(spread_sample(cs, args.sample, args.seed))
    train = [c for c in cs if c.artifact in names]
    test = [c for c in cs if c.artifact not in names]
    print(f"\n== {case}: {len(cs)} clients measured ({reps} repetitions each, round-robin; per client the {args.estimator} over them), fitted on "
          f"{len(train)} ({', '.join(sorted(c.artifact.split('/')[-1] for c in train))}), {len(test)} held out")
    for label, held in (("sample -> held out", held_out(train, test)), ("leave-one-out", leave_one_out(cs)),
                        ("the run's dense baseline (no client) by the sample's fit", held_out(train, dense))):
        e = error_summary(held)
        print(f"  {label}: {e['n']} clients, {e['refused']} refused; steps within ±10 %: "
              f"{100 * e['within_10']:.0f} %, worst {100 * e['worst']:.1f} %; rounds worst "
              f"{100 * e['worst_round']:.1f} %; rounds within ±10 %: "
              f"{100 * _share([abs(h.round_error) for h in held if not math.isnan(h.round_error)]):.0f} %")
        for line in held_out_lines(held):
            print("    " + line)
    errs = line_errors(train, test)
    print(f"  the line in f on the same split: steps within ±10 %: {100 * _share(errs):.0f} %, worst "
          f"{100 * max(errs):.1f} %" if errs else "  (no held-out client)")


def budgets_effect(cs, args) -> None:
    """``edgemask budgets``' two cost models on these measurements, for ``configs/digits-perfedmask.toml``'s 8
    devices on one board: per deadline, each model's budgets, the layers P^mask then gives each device, and that
    round as MEASURED (the median step of the measured clients that train the same layers × the device's steps ×
    ρ, measured round ÷ (steps × p50)): how many devices miss the deadline, by how much at worst, and the parameters
    the budgets let them train. A layer set no measured client trains is counted as unjudged."""
    import pandas as pd

    from edgemask.cli.budgets import round_steps
    from edgemask.errors import ConfigError
    from edgemask.profiling.budgets import budgets_from_costs, fit_board_costs
    from edgemask.profiling.train_predict import fit, layer_budgets
    from edgemask.trainer.algorithms.perfedmask import layer_groups, solve_pmask
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.data import build_dataset
    from edgemask.trainer.models import build_model, head_names

    cfg = TrainConfig.load(ROOT / "configs" / "digits-perfedmask.toml")
    ds = build_dataset(cfg.data, cfg.run.seed)
    model = build_model(cfg.model.name, ds.input_shape, ds.num_classes, **cfg.model.args)
    params = dict(model.named_parameters())
    head = set(head_names(model))
    groups = layer_groups([n for n in params if n not in head])
    sizes = [sum(params[k].numel() for k in ps) for ps in groups.values()]
    d_w = sum(sizes)
    steps = round_steps(cfg, ds)
    boards = {c: "local" for c in steps}
    measured = [c for c in cs if c.measured]
    by_set: dict[frozenset, list[float]] = {}
    for c in measured:
        by_set.setdefault(frozenset(t.rsplit(".", 1)[0] for t in c.trained), []).append(c.step_ms)
    rho = statistics.median(c.round_ms / (c.steps_per_round * c.step_ms) for c in measured if c.round_ms)
    line = fit_board_costs(pd.DataFrame({"device": "local", "trained_params": [c.trained_params for c in measured],
                                         "step_p50_ms": [c.step_ms for c in measured]}), d_w)
    layers = {"local": fit(measured)}

    def solve(psi):
        return solve_pmask(sizes, psi, 60.0).masks.tolist()

    names = list(groups)
    half = statistics.median(steps.values()) * statistics.median(c.step_ms for c in measured) * rho
    print(f"\n  budgets' cost models, digits-perfedmask.toml's {len(steps)} devices on this board (deadlines: x the "
          f"median device's steps x the median measured step x rho, {half:.0f} ms):")
    for scale in (0.8, 1.0, 1.25, 1.6, 2.0):
        deadline_s = scale * half / 1e3
        fracs = {"line": {c: d["fraction"] for c, d in budgets_from_costs(steps, boards, line, deadline_s).items()}}
        try:
            fracs["layers"] = {c: d["fraction"] for c, d in
                               layer_budgets(steps, boards, layers, groups, sizes, deadline_s, solve)[0].items()}
        except ConfigError as e:
            fracs["layers"] = str(e)
        parts = []
        for name, f in fracs.items():
            if isinstance(f, str):
                parts.append(f"{name}: refused: {f}")
                continue
            m = solve([f[c] * d_w for c in steps])
            miss, worst, unjudged, trained = 0, 0.0, 0, 0
            for i, cid in enumerate(steps):
                chosen = frozenset(names[j] for j in range(len(names)) if m[i][j])
                trained += sum(sizes[j] for j in range(len(names)) if m[i][j])
                if not chosen:
                    continue
                if chosen not in by_set:
                    unjudged += 1
                    continue
                r = steps[cid] * statistics.median(by_set[chosen]) * rho / 1e3
                if r > deadline_s:
                    miss, worst = miss + 1, max(worst, r / deadline_s - 1)
            parts.append(f"{name}: {miss} miss (worst +{100 * worst:.0f} %), {unjudged} unjudged, trains "
                         f"{trained / (len(steps) * d_w):.2f} of d_w on average")
        print(f"    deadline {1e3 * deadline_s:.0f} ms: " + "; ".join(parts))


def _share(errs) -> float:
    return sum(e <= 0.10 + 1e-12 for e in errs) / len(errs) if errs else math.nan


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="fedmask-mlp,perfedmask-digits,vgg16-cifar")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--sample", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--min-runs", type=int, default=30)
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--profile-runs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--pfm-clients", type=int, default=15)
    ap.add_argument("--vgg-width", type=float, default=0.25)
    ap.add_argument("--estimator", choices=("min", "median"), default="min",
                    help="a client's step from its repetitions (see clients())")
    ap.add_argument("--device", choices=("local", ARM64_STANDIN), default="local",
                    help=f"where the steps run: this host, or {ARM64_STANDIN} (the fleet's qemu-user aarch64 "
                    "stand-in, a Cortex-A72 model under emulation: NOT a Raspberry Pi; needs root)")
    ap.add_argument("--keep", type=Path, default=None, help="keep the measurements (JSON) here")
    ap.add_argument("--from-kept", type=Path, default=None, help="report on measurements kept by --keep, measure "
                    "nothing")
    args = ap.parse_args()
    import os

    where = ("the local device" if args.device == "local" else
             "the aarch64 STAND-IN (qemu-user, Cortex-A72 model, one CPU's quota; NOT a Raspberry Pi)")
    print(f"bench_train_predict: torch-train on {where}, {args.threads} thread(s); this host has "
          f"{os.cpu_count()} CPUs and may be SHARED with other work: the figures carry its load")
    for case in args.cases.split(","):
        if args.from_kept:
            got = json.loads((args.from_kept / f"{case}.json").read_text())
        else:
            with tempfile.TemporaryDirectory(prefix=f"bench-train-predict-{case}-") as tmp:
                got = measure(build(case, Path(tmp), args), args, Path(tmp) / "ws")
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            (args.keep / f"{case}.json").write_text(json.dumps(got))
        report(case, got, args)
        if case == "perfedmask-digits":
            budgets_effect(clients(got, args.estimator), args)


if __name__ == "__main__":
    main()
