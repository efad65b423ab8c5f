"""PerFedMask with budgets from a measured two-board mix against the poster's uniform budgets (issue #39).

1. Train ``configs/digits-perfedmask.toml`` (the poster's budgets: ν = 0.5 of the devices the whole body, the
   others half of it), export every client's local step (``torch-train``).
2. Measure the steps on two boards: the ``local`` device and a STAND-IN for a slower board (tests/fleet: an
   OpenSSH server in its own network namespace with ``--cores`` of a CPU, the host's Python; needs root and
   `sh tests/fleet/install.sh`). Neither is a real board; the mix shows the path and the effect of the choice.
3. ``edgemask budgets`` with the mix (``--mix``) and a deadline per local round (default: the fast board's
   half-body round for the median device on the slowest board: the fast board's devices may train everything,
   the slow board's about half), then train that config and compare.

    python benchmarks/perfedmask_budgets.py --cores 0.25   # as root

Prints per device its board, budget (uniform / measured), the predicted round, then both runs' accuracy.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

CAMPAIGN = """
[campaign]
name = "budgets"
formats = ["torch-train"]
variants = ["fp32"]
devices = ["local", "slow-standin"]
threads = [1]
repetitions = 1
timeout_s = 900
retries = 0
remeasure_unstable = 2

[[artifacts]]
run = "digits-perfedmask"
clients = "all"
dense = true

[training_runner]
warmup_runs = 3
min_runs = 20
min_seconds = 2.0
"""


def edgemask(*argv: str) -> str:
    p = subprocess.run([sys.executable, "-m", "edgemask.cli", *argv], capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"edgemask {' '.join(argv)} failed:\n{p.stderr[-2000:]}")
    return p.stdout


def measure(ws: Path, cores: float, period_us: int) -> Path:
    """Steps 1 and 2 in a new workspace ``ws``: the poster's run trained, its local steps exported and measured on
    ``local`` and the slow stand-in (``cores`` of a CPU, CFS period ``period_us``); returns the results directory."""
    from fleet.standin import CpuCgroup, StandIn, sweep, write_inventory

    from edgemask.profiling.campaign import load_campaign, run_campaign

    CpuCgroup.PERIOD_US = period_us
    if ws.exists():
        shutil.rmtree(ws)
    ws.mkdir(parents=True)
    config = ROOT / "configs" / "digits-perfedmask.toml"
    edgemask("train", "--config", str(config), "--workspace", str(ws))
    edgemask("export", "--run", "digits-perfedmask", "--formats", "torch-train", "--workspace", str(ws), "--jobs", "1")
    sweep()
    dev = StandIn.start("slow-standin", "x86_64", Path(tempfile.mkdtemp(prefix="edgemask-budgets-")),
                        cores=cores, sensor="hwmon")
    try:
        write_inventory(ws / "devices.toml", dev.spec(), name="slow-standin", runtimes=("onnxruntime", "torch"))
        (ws / "budgets.toml").write_text(CAMPAIGN)
        cfg = load_campaign(ws / "budgets.toml", known_devices=["local", "slow-standin"])
        res = run_campaign(cfg, ws, progress=True)
        if res.failed:
            raise SystemExit(f"{len(res.failed)} jobs failed: {res.failed[0].reason}")
    finally:
        dev.teardown()
    return ws / "results" / "budgets"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", default="workspace/perfedmask-budgets")
    ap.add_argument("--cores", type=float, default=0.25, help="the slow stand-in's CPU quota (cores)")
    ap.add_argument("--period-us", type=int, default=4000, help="the stand-in's CFS period: short, so a step of a "
                    "few ms is slowed evenly rather than run whole or held a period (the fleet's default 100 ms period "
                    "made a 4 ms step bimodal: CV > 100 %%)")
    ap.add_argument("--mix", default="local=0.3,slow-standin=0.7")
    ap.add_argument("--deadline", type=float, default=None, help="seconds per local round (default: see above)")
    args = ap.parse_args()

    from edgemask.profiling.budgets import fit_board_costs
    from edgemask.profiling.training import training_costs

    ws = Path(args.workspace).resolve()
    config = ROOT / "configs" / "digits-perfedmask.toml"
    results = measure(ws, args.cores, args.period_us)
    costs = training_costs(results)
    print(costs[["client_id", "device", "trained_params", "step_p50_ms", "local_round_ms", "verdict"]]
          .to_string(index=False))
    deadline = args.deadline
    if deadline is None:
        from edgemask.trainer.config import TrainConfig
        from edgemask.trainer.data import build_dataset
        from edgemask.trainer.models import build_model, head_names

        tc = TrainConfig.load(config)
        ds = build_dataset(tc.data, tc.run.seed)
        model = build_model(tc.model.name, ds.input_shape, ds.num_classes, **tc.model.args)
        d_w = sum(p.numel() for n, p in model.named_parameters() if n not in set(head_names(model)))
        fits = fit_board_costs(costs, d_w)
        steps = [-(-len(c.train_y) // tc.training.batch_size) * tc.training.local_epochs for c in ds.clients]
        slowest = max(fits.values(), key=lambda c: c.step_ms(1.0))
        deadline = float(np.median(steps)) * slowest.step_ms(0.5) / 1e3
        for b, c in fits.items():
            print(f"{b}: step_ms = {c.a_ms:.2f} + {c.s_ms:.2f} f (largest miss {c.max_miss_ms:.2f} ms)")
    out = ws / "digits-perfedmask-measured.toml"
    # the slow stand-in's steps are throttled by a CPU quota (CV 20-30 %): its rows are INVALID, used and named
    print(edgemask("budgets", "--config", str(config), "--results", str(results), "--mix", args.mix,
                   "--deadline", f"{deadline:.3f}", "--out", str(out), "--workspace", str(ws), "--allow-invalid"))
    edgemask("train", "--config", str(out), "--workspace", str(ws))
    uniform = json.loads((ws / "runs" / "digits-perfedmask" / "summary.json").read_text())
    measured = json.loads((ws / "runs" / "digits-perfedmask-measured" / "summary.json").read_text())
    print(f"deadline {deadline:.3f} s per local round, mix {args.mix} (stand-ins: local host; x86 sshd with "
          f"{args.cores:g} CPU)")
    print(f"{'device':<11} {'uniform psi/d_w':>15} {'measured psi/d_w':>16} {'board':<13} {'pred. round s':>13}")
    d_w = max(d["budget"] for d in uniform["devices"].values())
    for cid, d in measured["devices"].items():
        src = d.get("budget_from", {})
        print(f"{cid:<11} {uniform['devices'][cid]['budget'] / d_w:>15.3f} {d['budget'] / d_w:>16.3f} "
              f"{src.get('board', '?'):<13} {src.get('predicted_round_s', float('nan')):>13.3f}")
    for name, s in (("uniform (poster)", uniform), ("measured mix", measured)):
        acc = s.get("mean_accuracies", {})
        print(f"{name:<17} mean accuracy {s['mean_accuracy']:.4f}  "
              + "  ".join(f"{k} {v:.4f}" for k, v in acc.items() if isinstance(v, float)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
