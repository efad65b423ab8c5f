"""PerFedMask under deadlines (issue #46, item 3): the poster's budgets against budgets from the boards, both trained
with the same ``[system]`` (trainer/system.py), so a device whose budget its board cannot train in time is left out
of the aggregate, as a deployment would leave it.

1. Measure (``perfedmask_budgets.measure``: the poster's run, its local steps on ``local`` and a slow x86 STAND-IN,
   an sshd with a fraction of a CPU; root and ``sh tests/fleet/install.sh``), or reuse ``--results``.
2. Fit each board's step line, step(f) = a + s·f (``edgemask budgets``' fit), and write it as the ``[system]``
   boards (``step_ms`` = a + s, ``step_ms_frozen`` = a) with the mix's shares.
3. For each seed × deadline D: the poster's config, and ``edgemask budgets --deadline D`` of it, each with
   ``[system] deadline_s`` = D + the dense model's download and upload at the bandwidth (a choice: budgets fit a
   device's compute to D; its transfer, at most the dense model both ways, is added so a measured budget is never
   late for its bytes), trained.

    python benchmarks/perfedmask_deadlines.py [--results WS/results/budgets] [--seeds 0,1,2] [--scales 0.75,1,1.5]

Prints per run: final mean personalized accuracy, the share of selected devices' updates left out, the simulated
time to the target accuracy (cumulative ``round_time_s``) and the whole run's simulated time.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from perfedmask_budgets import edgemask, measure  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workspace", default="workspace/perfedmask-deadlines")
    ap.add_argument("--results", default=None, help="a campaign of the poster run's torch-train steps "
                    "(perfedmask_budgets.py's results/budgets); default: measure again")
    ap.add_argument("--cores", type=float, default=0.25)
    ap.add_argument("--period-us", type=int, default=4000)
    ap.add_argument("--mix", default="local=0.3,slow-standin=0.7")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--scales", default="0.75,1,1.5", help="deadlines as multiples of perfedmask_budgets.py's "
                    "default (the slow board's half-body round for its median device)")
    ap.add_argument("--bandwidth", type=float, default=10_000.0, help="kbit/s per device")
    ap.add_argument("--target", type=float, default=0.4, help="mean accuracy for the time-to-accuracy column (the "
                    "rounds' evaluation, before PerFedMask's fine-tuning: 0.49 at best on the poster's run)")
    ap.add_argument("--from-runs", action="store_true", help="no measuring or training: the table of the runs "
                    "already under --workspace (e.g. at another --target)")
    args = ap.parse_args()

    from edgemask.profiling.budgets import fit_board_costs
    from edgemask.profiling.training import training_costs
    from edgemask.tomlio import dumps_toml
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.data import build_dataset
    from edgemask.trainer.models import build_model, head_names

    ws = Path(args.workspace).resolve()
    if args.from_runs:
        rows = []
        for seed in (int(s) for s in args.seeds.split(",")):
            for scale in (float(x) for x in args.scales.split(",")):
                for kind in ("poster", "measured"):
                    run = ws / "runs" / f"{kind}-s{seed}-d{scale:g}"
                    system = tomllib.loads((run / "config.toml").read_text())["system"]
                    rows.append({"seed": seed, "deadline_s": system["deadline_s"], "budgets": kind,
                                 **outcome(run, args.target)})
        print(f"PerFedMask, digits, the runs under {ws}; deadline_s includes the transfer; time = cumulative "
              f"round_time_s to {args.target:.0%} mean accuracy")
        return report(pd.DataFrame(rows))
    results = Path(args.results).resolve() if args.results else measure(ws, args.cores, args.period_us)
    mws = results.parent.parent  # the workspace that holds the measured run
    config = ROOT / "configs" / "digits-perfedmask.toml"
    tc = TrainConfig.load(config)
    ds = build_dataset(tc.data, tc.run.seed)
    model = build_model(tc.model.name, ds.input_shape, ds.num_classes, **tc.model.args)
    head = set(head_names(model))
    d_w = sum(p.numel() for n, p in model.named_parameters() if n not in head)
    dense_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    fits = fit_board_costs(training_costs(results).query("format == 'torch-train' and run_id == 'digits-perfedmask'"),
                           d_w)
    mix = {b: float(v) for b, v in (p.split("=") for p in args.mix.split(","))}
    steps = [-(-len(c.train_y) // tc.training.batch_size) * tc.training.local_epochs for c in ds.clients]
    slowest = max(fits.values(), key=lambda c: c.step_ms(1.0))
    base = float(np.median(steps)) * slowest.step_ms(0.5) / 1e3
    comm_s = 2 * dense_bytes * 8 / (args.bandwidth * 1e3)
    boards = {b: {"share": mix[b], "step_ms": c.step_ms(1.0), "step_ms_frozen": max(c.step_ms(0.0), 0.0),
                  "source": f"{results} (step = {c.a_ms:.2f} + {c.s_ms:.2f} f ms, largest miss {c.max_miss_ms:.2f})"}
              for b, c in fits.items() if b in mix}
    for b, c in fits.items():
        print(f"{b}: step_ms = {c.a_ms:.2f} + {c.s_ms:.2f} f (largest miss {c.max_miss_ms:.2f} ms)")
    rows = []
    cfgs = ws / "configs"
    cfgs.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        for scale in (float(x) for x in args.scales.split(",")):
            deadline = base * scale
            d = tomllib.loads(config.read_text())
            d["run"].update(seed=seed, run_id=f"poster-s{seed}-d{scale:g}")
            d["system"] = {"deadline_s": deadline + comm_s, "bandwidth_kbps": args.bandwidth, "boards": boards}
            poster = cfgs / f"poster-s{seed}-d{scale:g}.toml"
            poster.write_text(dumps_toml(d))
            measured = cfgs / f"measured-s{seed}-d{scale:g}.toml"
            edgemask("budgets", "--config", str(poster), "--results", str(results), "--mix", args.mix,
                     "--deadline", f"{deadline:.4f}", "--out", str(measured), "--measured-run", "digits-perfedmask",
                     "--run-id", f"measured-s{seed}-d{scale:g}", "--workspace", str(mws), "--allow-invalid")
            for kind, path in (("poster", poster), ("measured", measured)):
                edgemask("train", "--config", str(path), "--workspace", str(ws))
                run = ws / "runs" / TrainConfig.load(path).run_id
                rows.append({"seed": seed, "deadline_s": deadline, "budgets": kind, **outcome(run, args.target)})
                print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    print(f"\nPerFedMask, digits, 8 devices, mix {args.mix} (stand-ins), [system] deadline = D + {comm_s:.3f} s "
          f"(the dense model both ways at {args.bandwidth:g} kbit/s); time = cumulative round_time_s to "
          f"{args.target:.0%} mean accuracy")
    return report(table)


def report(table: pd.DataFrame) -> int:
    """Every run's row, then per deadline and budgets the mean ± spread over seeds."""
    print(table.to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    agg = table.groupby(["deadline_s", "budgets"]).agg(acc_mean=("mean_accuracy", "mean"),
                                                       acc_std=("mean_accuracy", "std"),
                                                       dropped=("dropped_share", "mean"),
                                                       reached=("time_to_target_s", "count"),
                                                       runs=("time_to_target_s", "size"),
                                                       time_to_target=("time_to_target_s", "mean"))
    print("\nacross seeds (time_to_target: the mean over the runs that reached the target, `reached` of `runs`):")
    print(agg.to_string(float_format=lambda x: f"{x:.4f}"))
    return 0


def outcome(run: Path, target: float) -> dict:
    """Final mean accuracy, the share of selected updates left out, time to ``target`` and in all."""
    summary = json.loads((run / "summary.json").read_text())
    h = pd.read_parquet(run / "history.parquet")
    server = h[h["client"] == "server"].pivot_table(index="round", columns="metric", values="value")
    server = server[server.index < summary["rounds"]]  # the fine-tuning evaluation has no round time
    cum = server["round_time_s"].cumsum()
    hit = cum[server["mean_accuracy"] >= target]
    return {"mean_accuracy": summary["mean_accuracy"],
            "dropped_share": float(server["devices_dropped"].sum() / server["devices_selected"].sum()),
            "time_to_target_s": float(hit.iloc[0]) if len(hit) else math.nan,
            "total_time_s": float(cum.iloc[-1])}


if __name__ == "__main__":
    sys.exit(main())
