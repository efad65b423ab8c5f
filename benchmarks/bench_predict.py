"""Held-out error of the sampled campaign's predictor (profiling/predict.py), per runtime, on this host's `local`
device, through the real pipeline: export -> campaign (profiled per-layer runs + timed runs) -> store -> fit.

Cases:
* ``demo``: the demo's FedMask run (cli/configs/demo-fedmask.toml: 8 clients, 64-3072-2048-10 MLP, trained here
  with its embedded config), ONNX and ExecuTorch, the demo's runner protocol (timed window shortened to
  ``--seconds``);
* ``vgg16``: VGG16 in FedMask's IC-CIFAR10 setting with ``--clients`` clients (default 16): the last 8 masked layers
  keep a share drawn per client and layer from 10–40 % (around FedMask's 20 %, varied so widths differ),
  ONNX and ExecuTorch. CIFAR-10 is a stand-in: random pixels in the standard batch format (latency does not
  depend on them).

Per-layer times: onnxruntime's profiler events by graph name; ExecuTorch's ETDump (XNNPACK) events, mapped to layers
through the .pte's ETRecord (``profiling.layers.attach_etdump``). Every client is measured; each is then predicted
from a fit on all the others (leave-one-out). Per case and runtime: clients, share within ±10 % and ±5 %, worst
|error|; then per client measured vs predicted. A runtime whose layers could not be timed is listed with the
predictor's reason (``profiling.predict.setting_inputs``).

    .venv/bin/python benchmarks/bench_predict.py [--cases demo,vgg16] [--clients 16] [--seconds 1.0]
        [--demo-formats onnx,pte] [--vgg16-formats onnx,pte]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from bench_export import fedmask_masks  # noqa: E402
from bench_export_jobs import write_cifar_standin  # noqa: E402
from edgemask.export import export_run  # noqa: E402
from edgemask.profiling.campaign import parse_campaign, run_campaign  # noqa: E402
from edgemask.profiling.predict import error_summary, held_out_table, leave_one_out, setting_inputs  # noqa: E402
from edgemask.profiling.stats import summarize  # noqa: E402
from edgemask.profiling.store import ResultsStore  # noqa: E402
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig  # noqa: E402
from edgemask.trainer.data import DataConfig  # noqa: E402
from edgemask.trainer.models import build_model  # noqa: E402
from edgemask.trainer.run_dir import ClientState, write_run  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "cli" / "configs"


def demo_run(ws: Path) -> Path:
    from edgemask.trainer.simulation import train

    cfg = TrainConfig.load(CONFIGS / "demo-fedmask.toml")
    return train(cfg, ws / "runs")


def vgg_run(ws: Path, clients: int, seed: int = 0) -> Path:
    root = write_cifar_standin(ws / "cifar-10-batches-py", per_batch=60 * clients // 5 + 60)
    cfg = TrainConfig(run=RunConfig(seed=0, run_id="bench-vgg16-predict"),
                      data=DataConfig(name="cifar10", num_clients=clients, root=str(root)),
                      model=ModelConfig("vgg16", {}), algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    model = build_model("vgg16", (3, 32, 32), 10)
    g = torch.Generator().manual_seed(seed)
    states = {}
    for i in range(clients):
        keep = float(0.1 + 0.3 * torch.rand(1, generator=g))
        states[f"client-{i:03d}"] = ClientState(masks=fedmask_masks(model, 8, keep, seed=i))
    return write_run(ws / "runs" / cfg.run.run_id, cfg, model.state_dict(), states, [],
                     {"run_id": cfg.run.run_id, "clients": {}})


def measure(ws: Path, run: Path, formats: tuple[str, ...], seconds: float, name: str) -> dict:
    export_run(run, ws / "artifacts", formats=formats, progress=False)
    camp = parse_campaign({
        "campaign": {"name": name, "formats": list(formats), "devices": ["local"], "threads": [1],
                     "repetitions": 2, "retries": 0, "remeasure_unstable": 1},
        "artifacts": [{"run": run.name, "clients": "all", "dense": False}],
        "runner": {"warmup_runs": 20, "warmup_seconds": 0.3, "min_runs": 50, "min_seconds": seconds,
                   "sample_min_ms": 10.0, "profile_layers": True, "profile_warmup": 5, "profile_runs": 20}})
    run_campaign(camp, ws, progress=False)
    with ResultsStore.open(camp.results_dir(ws) / "results.sqlite") as store:
        summary = summarize(store.to_dataframe())
        data = (store.artifacts(), store.profiles(), store.profiled_runs(), store.operator_samples())
    settings, why = setting_inputs(summary, *data)  # why: the predictor's reason where a runtime has no layer times
    return {"settings": settings, "reasons": {k[2]: u.reason for k, u in why.items()}, "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="demo,vgg16")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--demo-formats", default="onnx,pte", help="formats of the demo case")
    ap.add_argument("--vgg16-formats", default="onnx,pte", help="formats of the vgg16 case")
    args = ap.parse_args()
    ws = Path(tempfile.mkdtemp(prefix="bench_predict."))
    load0 = os.getloadavg()
    rows, details, notes = [], [], []
    for case in args.cases.split(","):
        t0 = time.time()
        if case == "demo":
            run, formats = demo_run(ws), tuple(args.demo_formats.split(","))
        else:
            run, formats = vgg_run(ws, args.clients), tuple(args.vgg16_formats.split(","))
        got = measure(ws, run, formats, args.seconds, f"predict-{case}")
        for (run_id, device, fmt, variant, threads), clients in sorted(got["settings"].items()):
            held = leave_one_out(clients)
            s = error_summary(held)
            rows.append((case, fmt, s["n"], s["within_10"], s["within_5"], s["worst"]))
            details.append((case, fmt, held_out_table(clients)))
        for fmt in formats:
            if fmt not in {k[2] for k in got["settings"]}:  # in the table too, not only below it
                rows.append((case, fmt, None, float("nan"), float("nan"), float("nan")))
                notes.append(f"{case}, {fmt}: no per-layer times ({got['reasons'].get(fmt, 'none profiled')})")
        valid = got["summary"]["valid"].mean() if len(got["summary"]) else float("nan")
        notes.append(f"{case}: {len(got['summary'])} settings measured, {100 * valid:.0f} % VALID; "
                     f"{time.time() - t0:.0f} s")
        print(f"# {case} done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    load1 = os.getloadavg()
    print("| case | runtime | held-out clients | within ±10 % | within ±5 % | worst |")
    print("|---|---|---|---|---|---|")
    for case, fmt, n, w10, w5, worst in rows:
        if not n:
            why = "no per-layer times: see below" if n is None else "a held-out error needs 2 measured"
            print(f"| {case} | {fmt} | 0 ({why}) | — | — | — |")
            continue
        print(f"| {case} | {fmt} | {n} | {100 * w10:.0f} % | {100 * w5:.0f} % | {100 * worst:.1f} % |")
    for case, fmt, table in details:
        print(f"\n{case}, {fmt}: per client (leave-one-out)\n")
        print("| client | measured p50 ms | predicted ms | error |")
        print("|---|---|---|---|")
        for r in table.itertuples():
            print(f"| {r.artifact} | {r.measured_ms:.3f} | {r.predicted_ms:.3f} | {100 * r.error:+.1f} % |")
    print()
    for n in notes:
        print(f"- {n}")
    print(f"- host: {os.cpu_count()} cores; load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end "
          f"(shared with other processes: latencies carry their disturbance)")


if __name__ == "__main__":
    main()
