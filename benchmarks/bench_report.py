"""How long `edgemask report` takes on a campaign of N clients, measured and predicted, and what it draws.

Builds a synthetic but well-formed workspace and results store with the project's own writers: a FedMask run
directory (``trainer.run_dir.write_run``: per-client masks, history, summary with each client's accuracy), one
manifest per client and the dense baseline (``edgemask.manifest.write_manifest``, stand-in model files with their
true sizes and digests, per-layer kept units, FLOPs and ONNX graph names), the campaign's own plan
(``plan_campaign``: with ``sample_clients = K`` it measures K clients spread over their kept units and the dense
baseline) and store (``ResultsStore.record``: timed latency samples, power, and profiled per-operator runs).
Latencies follow a per-layer model (fixed cost + per-layer intercept + time per FLOP) with noise, so the
predictor has something true to fit. Nothing runs on a device.

Then it times ``profiling.report.write_report`` in process, per phase (each named function's cumulative time,
wrapped where the report calls it), and ``edgemask report`` as a user runs it (a fresh process, imports included).

    .venv/bin/python benchmarks/bench_report.py [--clients 400] [--sample 40] [--formats onnx,pte]
        [--devices 1] [--samples 500] [--keep DIR]

``--sample 0`` measures every client (no prediction): ``--clients 8 --sample 0`` is the demo's size.
"""

from __future__ import annotations

import argparse
import functools
import math
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgemask.devices.inventory import FORMAT_RUNTIME  # noqa: E402
from edgemask.devices.records import Measurement  # noqa: E402
from edgemask.fileio import sha256_file  # noqa: E402
from edgemask.manifest import SAMPLE_IO, ArtifactFile, Manifest, TensorSpec, write_manifest, write_sample_io  # noqa: E402
from edgemask.profiling.campaign import parse_campaign, plan_campaign  # noqa: E402
from edgemask.profiling.store import ResultsStore  # noqa: E402

RUN = "bench-report"
IN, HIDDEN, OUT = 64, (256, 128), 10  # the demo's MLP shape: fc1 64→256, fc2 256→128, out 128→10
LAYERS = ("fc1", "fc2", "out")
# per-layer time, ms: intercept + per FLOP (a 1-GFLOP/s-ish board); a fixed per-inference cost on top
COEF = {"fc1": (0.004, 1.0e-6), "fc2": (0.006, 1.2e-6), "out": (0.002, 1.5e-6)}
FIXED_MS = 0.03
FORMAT_SPEED = {"onnx": 1.0, "pte": 1.3}


def layer_flops(kept: dict[str, int]) -> dict[str, int]:
    k1, k2 = kept["fc1"], kept["fc2"]
    return {"fc1": 2 * IN * k1, "fc2": 2 * k1 * k2, "out": 2 * k2 * OUT}


def _manifest(ws: Path, client: str, kept: dict[str, int], formats: tuple[str, ...]) -> None:
    """One artifact directory, written by the contract's writer: stand-in model files (never run), a real
    sample_io, per-layer units, FLOPs and ONNX graph names."""
    d = ws / "artifacts" / RUN / client
    d.mkdir(parents=True, exist_ok=True)
    dense = {"fc1": HIDDEN[0], "fc2": HIDDEN[1], "out": OUT}
    fd, fc = layer_flops(dense), layer_flops(kept)
    params = lambda k: IN * k["fc1"] + k["fc1"] + k["fc1"] * k["fc2"] + k["fc2"] + k["fc2"] * OUT + OUT  # noqa: E731
    nbytes = 4 * params(kept)
    files = []
    for fmt in formats:
        path = d / f"model.fp32.{fmt}"
        path.write_bytes((f"{client}/{fmt}|".encode() * (nbytes // 8 + 1))[:nbytes])
        files.append(ArtifactFile(format=fmt, variant="fp32", file=path.name, sha256=sha256_file(path),
                                  bytes=nbytes, runtime=FORMAT_RUNTIME[fmt]))
    onnx_file = "model.fp32.onnx"
    layers = [{"name": n, "kept": kept[n], "total": dense[n], "flops_dense": fd[n], "flops_compacted": fc[n],
               "graph_names": {onnx_file: [f"/{n}/Gemm", f"/{n}/Gemm_output_0"]} if "onnx" in formats else {}}
              for n in LAYERS]
    write_sample_io(d / SAMPLE_IO, np.zeros((8, IN), np.float32), np.zeros((8, OUT), np.float32),
                    np.zeros(8, np.int64))
    write_manifest(d, Manifest(
        run_id=RUN, client_id=client, kind="dense" if client == "dense" else "compacted", algorithm="fedmask",
        model="mlp", dataset="digits", inputs=[TensorSpec("input", [1, IN], "float32")],
        outputs=[TensorSpec("output", [1, OUT], "float32")], files=files,
        sample_io={"file": SAMPLE_IO, "sha256": sha256_file(d / SAMPLE_IO), "count": 8},
        params={"dense": params(dense), "compacted": params(kept)},
        flops={"dense": sum(fd.values()), "compacted": sum(fc.values())}, layers=layers,
        tolerance={"limit": 1e-5, "rtol": 0.0, "max_abs_diff": {}}, created="2026-12-01T10:00:00Z"))


def _run_dir(ws: Path, kept: dict[str, dict[str, int]], accuracy: dict[str, float]) -> None:
    """The training run's directory by the trainer's writer: per-client masks keeping the manifests' units,
    a 5-round history (accuracy, bytes), summary.json with each client's accuracy."""
    import torch

    from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig
    from edgemask.trainer.data import DataConfig
    from edgemask.trainer.models import build_model, model_sites
    from edgemask.trainer.models.masking import all_ones_masks
    from edgemask.trainer.run_dir import ClientState, write_run

    cfg = TrainConfig(run=RunConfig(seed=0, run_id=RUN), data=DataConfig(name="digits", num_clients=len(kept)),
                      model=ModelConfig("mlp", {"hidden": list(HIDDEN)}), algorithm=AlgorithmConfig("fedmask"))
    torch.manual_seed(0)
    model = build_model("mlp", (IN,), OUT, hidden=HIDDEN)
    base = all_ones_masks(model, tuple(s for s in model_sites(model) if s.name != "out"))
    states = {}
    for c, k in kept.items():
        masks = {n: m.clone() for n, m in base.items()}
        masks["fc1.weight"][k["fc1"]:] = 0
        masks["fc2.weight"][k["fc2"]:] = 0
        states[c] = ClientState(masks=masks)
    history = []
    for rnd in range(5):
        for c, acc in accuracy.items():
            history += [{"round": rnd, "client": c, "metric": "accuracy", "value": acc * (0.6 + 0.1 * rnd)},
                        {"round": rnd, "client": c, "metric": "bytes_up", "value": 4000.0},
                        {"round": rnd, "client": c, "metric": "bytes_down", "value": 12000.0}]
    summary = {"run_id": RUN, "num_clients": len(kept),
               "clients": {c: {"accuracy": a} for c, a in accuracy.items()}}
    write_run(ws / "runs" / RUN, cfg, model.state_dict(), states, history, summary)


def build(root: Path, clients: int, sample: int, formats: tuple[str, ...], devices: int, samples: int,
          seed: int = 0) -> Path:
    """The workspace and the campaign's store; returns the results directory."""
    rng = np.random.default_rng(seed)
    ws = root / "ws"
    names = [f"client-{i:03d}" for i in range(clients)]
    # widths around FedMask's kept share, varied per client and layer
    kept = {c: {"fc1": int(rng.integers(16, HIDDEN[0] + 1)), "fc2": int(rng.integers(8, HIDDEN[1] + 1)), "out": OUT}
            for c in names}
    accuracy = {c: float(np.clip(0.55 + 0.35 * (k["fc1"] / HIDDEN[0]) ** 0.5 + rng.normal(0, 0.04), 0, 1))
                for c, k in kept.items()}
    _manifest(ws, "dense", {"fc1": HIDDEN[0], "fc2": HIDDEN[1], "out": OUT}, formats)
    for c in names:
        _manifest(ws, c, kept[c], formats)
    _run_dir(ws, kept, accuracy)
    device_names = [f"board-{chr(ord('a') + i)}" for i in range(devices)]
    cfg = parse_campaign({
        "campaign": {"name": "bench-report", "formats": list(formats), "devices": device_names, "threads": [1],
                     "repetitions": 2, "retries": 0, "sample_clients": sample, "sample_seed": 7},
        "artifacts": [{"run": RUN, "clients": "all", "dense": True}],
        "runner": {"min_runs": 50, "min_seconds": 1.0, "profile_layers": True, "profile_runs": 10,
                   "profile_warmup": 2}})
    plan = plan_campaign(cfg, ws)
    results = cfg.results_dir(ws)
    with ResultsStore.open(results / "results.sqlite") as store:
        store.save_campaign(cfg)
        store.save_artifacts(plan.artifacts.values())
        store.save_skipped(plan.skipped)
        for job in plan.jobs:
            info = plan.artifacts[job.artifact]
            k = info.manifest["layers"]
            per = {lay["name"]: COEF[lay["name"]][0] + COEF[lay["name"]][1] * lay["flops_compacted"] for lay in k}
            slow = FORMAT_SPEED[job.format] * (1 + 0.15 * device_names.index(job.device))
            p50 = slow * (FIXED_MS + sum(per.values())) * (1 + rng.normal(0, 0.02))
            lat = tuple(p50 * (1 + np.abs(rng.normal(0, 0.03, samples))))
            loops = max(1, math.ceil(1200.0 / sum(lat)))  # sample_min_ms: a timed window of at least 1.2 s
            runs = []
            for _ in range(10):
                if job.format == "onnx":
                    ops = [[f"/{n}/Gemm", "Gemm", round(1000 * slow * t * (1 + rng.normal(0, 0.02))),
                            "CPUExecutionProvider"] for n, t in per.items()]
                else:
                    ops = [[n, "Fully Connected", round(1000 * slow * t * (1 + rng.normal(0, 0.02))), "XNNPACK"]
                           for n, t in per.items()]
                ops.append(["/act/Relu", "Relu", 2.0, "CPUExecutionProvider"])
                runs.append({"end_to_end_ms": p50 * 1.1, "total_us": sum(o[2] for o in ops), "ops": ops})
            store.record(job, Measurement(
                device=job.device, artifact=job.artifact, format=job.format, variant=job.variant,
                threads=job.threads, ok=True, latency_ms=lat, load_ms=5.0, first_inference_ms=1.0,
                peak_rss_kb=40_000, rss_growth_kb=int(info.manifest["params"]["compacted"] * 4 / 1024) + 500,
                output_max_abs_diff=1e-7, output_check_passed=True, accuracy=accuracy.get(job.artifact.split("/")[1],
                                                                                            0.1),
                power_source="ina3221:VDD_IN", power_w=tuple(3.0 + rng.normal(0, 0.1, 20)), power_rate_hz=50.0,
                idle_power_w=2.0, timed_window_s=sum(lat) * loops / 1e3, inferences_per_sample=loops,
                runtime_version="bench",
                state_before={"temp_c": 40.0}, state_after={"temp_c": 41.0},
                artifact_sha256=info.file_for(job.format, job.variant).sha256,
                profile={"available": True, "profiler": "bench", "blocks": [], "runs": runs}))
    return results


class PhaseTimer:
    """Cumulative seconds per wrapped function (a phase may be called once per figure or setting)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, module, name: str, label: str | None = None) -> None:
        fn = getattr(module, name, None)
        if fn is None:
            return
        label = label or name

        @functools.wraps(fn)
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds[label] += time.perf_counter() - t0
                self.calls[label] += 1

        setattr(module, name, timed)


def time_report(results: Path, ws: Path) -> tuple[float, PhaseTimer]:
    from edgemask.profiling import plots, report

    t = PhaseTimer()
    for name in ("_load", "summarize", "_predictions", "write_tidy", "ledger_part", "runtime_table", "_run_curves",
                 "breakdowns", "_markdown", "_html"):
        t.wrap(report, name)
    for name in ("latency_distributions", "speedup_per_client", "accuracy_vs_communication", "energy_per_inference",
                 "accuracy_vs_latency", "measured_and_predicted", "layer_time_stacks"):
        t.wrap(plots, name, f"plot {name}")
    t.wrap(plots, "to_png", "render PNGs (to_png)")
    t0 = time.perf_counter()
    report.write_report(results, ws)
    return time.perf_counter() - t0, t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=400)
    ap.add_argument("--sample", type=int, default=40, help="sample_clients (0: measure every client)")
    ap.add_argument("--formats", default="onnx,pte")
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--samples", type=int, default=500, help="timed latency samples per repetition")
    ap.add_argument("--keep", type=Path, help="build here and keep it (to look at the plots)")
    args = ap.parse_args()
    formats = tuple(args.formats.split(","))
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-report-"))
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = build(root, args.clients, args.sample, formats, args.devices, args.samples)
    built = time.perf_counter() - t0
    total, timer = time_report(results, root / "ws")
    t0 = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "edgemask"), "report", "--results", str(results), "--workspace",
                    str(root / "ws")], check=True, stdout=subprocess.DEVNULL)
    cli = time.perf_counter() - t0
    measured = args.sample or args.clients
    print(f"campaign: {args.clients} clients, {min(measured, args.clients)} measured + dense, formats "
          f"{'/'.join(formats)}, {args.devices} device(s), {args.samples} samples × 2 reps per setting "
          f"(built in {built:.1f} s)")
    print(f"{'phase':<36} {'calls':>5} {'seconds':>8}")
    for label, s in sorted(timer.seconds.items(), key=lambda kv: -kv[1]):
        print(f"{label:<36} {timer.calls[label]:>5} {s:>8.2f}")
    print(f"{'write_report (in process, total)':<36} {'':>5} {total:>8.2f}")
    print(f"{'edgemask report (fresh process)':<36} {'':>5} {cli:>8.2f}")
    print(f"results: {results}")


if __name__ == "__main__":
    main()
