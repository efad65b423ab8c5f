"""A client's local round measured on the board against FedScale's 3× assumption (issue #39).

Takes the demo's runs (``demo-fedavg``, ``demo-fedmask``: `edgemask demo` first, or ``--train`` trains them),
exports the FedAvg model and the chosen FedMask clients with their inference files and both training formats
(``torch-train``; ``pte-train``, ExecuTorch's portable training kernels) into a workspace of its own, measures
them on the ``local`` device through the remote runner, and prints per client × training format: the client's
batch-1 inference p50 (onnx), the step p50, the local round measured, the 3× assumption's figure (3 × the
round's samples × the dense model's batch-1 p50, what `edgemask replay` assumed before) and their ratio.

    python benchmarks/bench_training.py --workspace workspace --clients 3
    python benchmarks/bench_training.py --workspace workspace --clients 2 --formats torch-train --arm64   # as root

``--arm64`` measures on the fleet's aarch64 STAND-IN instead (tests/fleet: Debian arm64 under qemu-user as a
Cortex-A72 with a Pi's wheels; not a Raspberry Pi: its times are an emulator's). Run it on an idle machine (the
verdicts say when it was not).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import pandas as pd

CONFIGS = Path(__file__).resolve().parents[1] / "cli" / "configs"

CAMPAIGN = """
[campaign]
name = "training-bench"
formats = {formats}
variants = ["fp32"]
devices = ["{device}"]
threads = [1]
repetitions = 1
timeout_s = 1800
cooldown_s = 0
retries = 0
remeasure_unstable = 1

[[artifacts]]
run = "demo-fedavg"
clients = []
dense = true

[[artifacts]]
run = "demo-fedmask"
clients = {clients}
dense = true

[runner]
warmup_runs = 20
warmup_seconds = 1.0
min_runs = 200
min_seconds = 3.0
sample_min_ms = 10.0

[training_runner]
warmup_runs = 3
min_runs = 20
min_seconds = 2.0
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", default="workspace", help="the workspace holding runs/demo-fedavg and "
                    "runs/demo-fedmask (default: ./workspace)")
    ap.add_argument("--out", default="workspace/bench-training", help="this benchmark's own workspace")
    ap.add_argument("--clients", type=int, default=3, help="FedMask clients measured (the first N)")
    ap.add_argument("--formats", default="torch-train,pte-train", help="training formats measured")
    ap.add_argument("--train", action="store_true", help="train the demo's runs first (8 rounds each)")
    ap.add_argument("--arm64", action="store_true", help="measure on the fleet's aarch64 stand-in (root; cached "
                    "root filesystem, see tests/fleet/standin.py)")
    args = ap.parse_args()

    from edgemask.export import export_run
    from edgemask.profiling.campaign import load_campaign, run_campaign
    from edgemask.profiling.report import write_report
    from edgemask.profiling.training import training_table

    src, out = Path(args.workspace), Path(args.out)
    runs = {r: src / "runs" / r for r in ("demo-fedavg", "demo-fedmask")}
    if args.train:
        from edgemask.trainer.config import TrainConfig
        from edgemask.trainer.simulation import train

        for algo in ("fedavg", "fedmask"):
            train(TrainConfig.load(CONFIGS / f"demo-{algo}.toml"), src / "runs")
    missing = [str(p) for p in runs.values() if not p.is_dir()]
    if missing:
        print(f"bench_training: {', '.join(missing)} missing; run `edgemask demo` first or pass --train",
              file=sys.stderr)
        return 2
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for name, path in runs.items():
        if not (out / "runs" / name).exists():
            shutil.copytree(path, out / "runs" / name)
    train_formats = [f for f in args.formats.split(",") if f]
    formats = ["onnx", *train_formats]
    clients = [f"client-{i:03d}" for i in range(args.clients)]
    t0 = time.perf_counter()
    export_run(out / "runs" / "demo-fedavg", out / "artifacts", [], formats)
    export_run(out / "runs" / "demo-fedmask", out / "artifacts", clients, formats)
    t_export = time.perf_counter() - t0
    campaign = out / "training-bench.toml"
    device = "pi-standin" if args.arm64 else "local"
    campaign.write_text(CAMPAIGN.format(formats="[" + ", ".join(f'"{f}"' for f in formats) + "]",
                                        clients="[" + ", ".join(f'"{c}"' for c in clients) + "]", device=device))
    standin = None
    if args.arm64:
        import tempfile

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from fleet.standin import StandIn, arm64_rootfs, sweep, write_inventory

        sweep()
        standin = StandIn.start(device, "aarch64", Path(tempfile.mkdtemp(prefix="edgemask-bench-")), cores=1.0,
                                sensor="hwmon", lower=arm64_rootfs())
        write_inventory(out / "devices.toml", standin.spec(), name=device,
                        runtimes=("onnxruntime", "executorch", "torch"))
    try:
        cfg = load_campaign(campaign, known_devices=[device])
        results_dir = cfg.results_dir(out)
        if results_dir.exists():
            shutil.rmtree(results_dir)
        t0 = time.perf_counter()
        res = run_campaign(cfg, out, progress=True)
        t_profile = time.perf_counter() - t0
    finally:
        if standin is not None:
            standin.teardown()
    if res.failed:
        print(f"bench_training: {len(res.failed)} jobs failed: {res.failed[0].reason}", file=sys.stderr)
        return 1
    write_report(results_dir, out)
    results = pd.read_parquet(results_dir / "results.parquet")
    table = training_table(results)
    table = table[table["assumed_from"].fillna("").str.contains("onnx")]
    infer = results[(results["workload"] != "train") & (results["format"] == "onnx")].set_index("artifact")
    where = "the aarch64 STAND-IN (qemu-user, not a Pi)" if args.arm64 else "local device"
    print(f"\nexport {t_export:.0f} s, profile {t_profile:.0f} s; {where}, 1 thread; "
          f"3× = 3 × round samples × the dense model's onnx batch-1 p50\n")
    head = ("artifact", "format", "infer p50 ms", "step p50 ms", "steps", "round measured s", "3x assumed s",
            "measured/3x", "verdict")
    rows = [head]
    for t in table.itertuples():
        p50 = float(infer.loc[t.artifact, "p50_ms"]) if t.artifact in infer.index else float("nan")
        rows.append((t.artifact, t.format, f"{p50:.3f}", f"{t.step_p50_ms:.1f}", f"{t.steps_per_round:.0f}",
                     f"{t.local_round_ms / 1e3:.2f}", f"{t.assumed_round_ms / 1e3:.3f}",
                     f"{t.measured_over_assumed:.1f}", t.verdict))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    for i, r in enumerate(rows):
        print("  ".join(str(c).ljust(w) if j < 2 else str(c).rjust(w) for j, (c, w) in enumerate(zip(r, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
