"""The device store's bytes (issue #45): per device, what each table's record holds (from the model's shapes, at
the paper's width, nothing trained), and what a run reads and writes — the set-up, a round without evaluation (its
devices' records only) and an evaluation (every device's) — measured on a short FedMask run.

    python benchmarks/bench_store.py [--cases fedmask,ic-emnist] [--devices 400] [--width 0.125] [--rounds 3]
                                     [--rss 400,2000]

The record sizes come from ``FedMask._layouts`` on the model built on the meta device (as ``edgemask train``'s
estimate builds it); the measured run is IC-CIFAR10's config on the CIFAR-10 stand-in (``bench_scale.py``'s) at
``--devices`` and ``--width``, ``eval_every`` past the rounds so that only the last round evaluates.

``--rss N,M``: peak host RSS (``ru_maxrss`` of a fresh process) of one FedMask round at each device count, 20
devices a round, on a model whose masks are large and whose training is cheap (an MLP 5-2048-2048-4 on FedPeWS's
synthetic 32,000 samples, split evenly: about 1.6 MB of masks per device, 3.2 GB at 2,000 devices were they on the
heap), so that two device counts compare in minutes on two cores; run it under the code before and after a change (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_scale  # noqa: E402


PAPER_DEVICES = {"fedmask": 400, "ic-emnist": 2414}  # FedMask, Table 4


def mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB"


def layouts(case: str, width: float) -> tuple[dict[str, int], int]:
    """Each table's record bytes for a device of ``case`` at ``width``, and the RAM a round's device adds."""
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.data.base import data_sizes
    from edgemask.trainer.device_store import record_bytes
    from edgemask.trainer.footprint import of_shapes

    cfg = TrainConfig.load(ROOT / "configs" / bench_scale.CASES[case].config)
    cfg = cfg.replace(model=dataclasses.replace(cfg.model, args=bench_scale.scaled_args(cfg.model.name,
                                                                                          cfg.model.args, width)))
    sizes = {"fedmask": ((3, 32, 32), 10), "ic-emnist": ((1, 28, 28), 62)}.get(case)
    if sizes is None:
        s = data_sizes(cfg.data, cfg.run.seed)
        sizes = (s.input_shape, s.num_classes)
    algo = of_shapes(cfg, *sizes)
    shapes = {w: s.mask_shape(algo.global_params[w]) for s in algo.sites for w in s.weights}
    tables = {name: record_bytes(layout) for name, layout in algo._layouts(shapes).items()}
    return tables, algo.client_state_bytes() - sum(tables.values())


def measured(devices: int, width: float, rounds: int, data_root: Path) -> list[tuple[str, int, int, int]]:
    """``(phase, devices it concerns, bytes read, bytes written)`` of a FedMask run: the set-up, each round."""
    import edgemask.trainer.simulation as sim

    _, cfg = bench_scale.case_config("fedmask", devices, width, rounds, "cpu", data_root)
    cfg = cfg.replace(training=dataclasses.replace(cfg.training, eval_every=rounds + 1))
    held, rows, last = {}, [], [(0, 0)]

    def ready(algo):
        held["algo"] = algo
        r, w = algo.store.io()
        rows.append(("set-up (ClientPruning)", devices, r, w))
        last[0] = (r, w)

    k = bench_scale.per_round(cfg)

    def round_row(rnd: int, io: tuple[int, int]) -> None:
        rows.append((f"round {rnd}", k, io[0] - last[0][0], io[1] - last[0][1]))
        last[0] = io

    def progress(rnd, total, _):
        if rnd and not rows[-1][0].startswith("evaluation"):  # an evaluated round's row is in already
            round_row(rnd, held["algo"].store.io())

    real = sim.evaluate_clients

    def evaluate_clients(algo, rnd, *a, **kw):  # the evaluation's own reads, apart from its round's
        round_row(rnd + 1, algo.store.io())
        out = real(algo, rnd, *a, **kw)
        r, w = algo.store.io()
        rows.append(("evaluation of every device", devices, r - last[0][0], w - last[0][1]))
        last[0] = (r, w)
        return out

    sim.evaluate_clients = evaluate_clients
    try:
        sim.simulate(cfg, progress=progress, ready=ready)
    finally:
        sim.evaluate_clients = real
    return rows


def rss_one(devices: int) -> int:
    """Peak RSS (bytes) of this process after one FedMask round of ``devices`` devices (:func:`main`'s ``--rss``)."""
    import resource

    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.simulation import simulate

    cfg = TrainConfig.from_dict({
        "data": {"name": "synthetic", "num_clients": devices, "partition": "iid", "options": {"size": "32k"}},
        "model": {"name": "mlp", "args": {"hidden": [2048, 2048]}},
        "algorithm": {"name": "fedmask", "args": {"prune_last": 2}},
        "training": {"rounds": 1, "participation": (20 + 0.5) / devices, "batch_size": 20, "eval_every": 1}})
    simulate(cfg)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="fedmask,ic-emnist")
    ap.add_argument("--devices", type=int, default=400)
    ap.add_argument("--width", type=float, default=0.125)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=ROOT / "workspace" / "bench-data")
    ap.add_argument("--rss", default=None, help="device counts: peak RSS of one round at each (see above)")
    ap.add_argument("--one-rss", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_rss is not None:
        print(rss_one(args.one_rss))
        return 0
    if args.rss:
        import subprocess

        print("| devices | a round | peak RSS |\n| ---: | ---: | ---: |")
        for n in (int(x) for x in args.rss.split(",")):
            out = subprocess.run([sys.executable, __file__, "--one-rss", str(n)], check=True, capture_output=True,
                                 text=True).stdout.split()[-1]
            print(f"| {n:,} | 20 | {int(out) / 1e9:.2f} GB |", flush=True)
        return 0

    print("| case (full width) | table | bytes per device |\n| --- | --- | ---: |")
    for case in args.cases.split(","):
        tables, ram = layouts(case, 1.0)
        for name, n in tables.items():
            print(f"| {case} | {name} | {n:,} |")
        total = sum(tables.values())
        devices = PAPER_DEVICES[case]
        at = f" (× {devices:,} devices: {mb(total * devices)} on disk)"
        print(f"| {case} | **all tables** | **{total:,}**{at} |")
        print(f"| {case} | in RAM while its round lasts (the start's bits) | {ram:,} |")

    root = bench_scale.standin("cifar10", args.cache)
    tables, _ = layouts("fedmask", args.width)
    per = sum(tables.values())
    print(f"\nFedMask IC-CIFAR10 at width {args.width:g}, {args.devices} devices, CIFAR-10 STAND-IN: a device's records "
          f"{per:,} bytes ({', '.join(f'{k} {v:,}' for k, v in tables.items())})\n")
    print("| phase | devices | read | written | read per device | written per device |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for what, k, r, w in measured(args.devices, args.width, args.rounds, root):
        print(f"| {what} | {k} | {mb(r)} | {mb(w)} | {r / k / per:.2f} records | {w / k / per:.2f} records |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
