"""``edgemask demo``: the whole pipeline on embedded defaults — no hardware, no downloads.

FedAvg and FedMask on scikit-learn's digits (8 clients, 2 classes each) → every FedMask client compacted and
exported (plus the dense baselines) to ONNX and ExecuTorch → profiled on the built-in ``local`` device through
the same Connection and remote runner an SSH board uses → results store, report, and a summary.

The model (edgemask/configs/demo-*.toml: a 64-3072-2048-10 MLP) is sized so that what is measured is the model,
not the runner: its dense batch-1 latency on one thread is about half a millisecond, far above the runner's own
per-call overhead (tens of microseconds), and a batch-1 MLP is memory-bound, so a compacted client's speedup
should follow its parameter-byte ratio. The runner (edgemask/configs/demo-campaign.toml) uses one thread and a
timed window of at least 3 s and 500 runs per setting, long enough for the median and the CV to settle.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

from edgemask.workspace import Workspace

CONFIGS = Path(__file__).resolve().parent / "configs"


def _stage(name: str) -> None:
    print(f"\n== {name}", file=sys.stderr, flush=True)


def run_demo(ws: Workspace, rounds: int | None = None, formats: list[str] | None = None) -> dict:
    from edgemask.cli import _progress_printer
    from export import export_run
    from profiling.campaign import load_campaign, run_campaign
    from profiling.report import write_report
    from trainer.config import TrainConfig
    from trainer.simulation import train

    formats = formats or ["onnx", "pte"]
    ws.root.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    runs = {}
    t0 = time.perf_counter()
    _stage("train")
    for algo in ("fedavg", "fedmask"):
        cfg = TrainConfig.load(CONFIGS / f"demo-{algo}.toml")
        if rounds is not None:
            cfg = cfg.replace(training=dataclasses.replace(cfg.training, rounds=rounds))
        runs[algo] = train(cfg, ws.runs, progress=_progress_printer(f"train {cfg.run_id}"))
        print(f"wrote {runs[algo]}", file=sys.stderr)
    timings["train"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _stage("export")
    export_run(runs["fedavg"], ws.artifacts, [], formats)  # FedAvg's personalized model is the global one
    export_run(runs["fedmask"], ws.artifacts, "all", formats)
    timings["export"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _stage("profile (local device, remote runner)")
    campaign_file = ws.root / "demo-campaign.toml"
    text = (CONFIGS / "demo-campaign.toml").read_text()
    text = text.replace('formats = ["onnx", "pte"]', "formats = [" + ", ".join(f'"{f}"' for f in formats) + "]")
    campaign_file.write_text(text)
    cfg = load_campaign(campaign_file, known_devices=["local"])
    results_dir = cfg.results_dir(ws.root)
    if results_dir.exists():  # a demo always measures afresh: its artifacts were just rebuilt
        shutil.rmtree(results_dir)
    res = run_campaign(cfg, ws.root, progress=True)
    if res.failed:
        raise SystemExit(f"edgemask demo: {len(res.failed)} profiling jobs failed: {res.failed[0].reason}")
    timings["profile"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    _stage("report")
    html, md = write_report(results_dir, ws.root)
    timings["report"] = time.perf_counter() - t0

    print()
    print(summary(runs, results_dir, ws.artifacts))
    print(f"\nworkspace: {ws.root}\n  runs:      {ws.runs}\n  artifacts: {ws.artifacts}\n"
          f"  results:   {results_dir}\n  report:    {html}\n  summary:   {md}")
    print("stage wall time: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    return {"timings": timings, "runs": runs, "results": results_dir, "report": html}


# What the FedAvg and FedMask dense baselines are: FedMask's "dense" is the frozen random weights it masks, run
# without a mask; it is the right latency baseline (the same network before compaction), not an accuracy one.
DENSE_LABELS = {"fedavg": "FedAvg's global model", "fedmask": "frozen random weights, no mask"}
CV_STEADY = 0.10  # the report's threshold (profiling.stats.DEFAULT_CV_THRESHOLD)

LEGEND = """\
What the numbers are:
  mean pers. acc    each client's accuracy on its own test split after training, averaged over the clients
  bytes comm.       bytes uploaded + downloaded over all rounds (FedMask: 1 bit per mask element); vs FedAvg's
  acc (test, n)     the exported file run in its runtime on the first n samples of a test split: the client's
                    own; a dense baseline's, client-000's. FedMask's dense baseline is its frozen random
                    weights without a mask: near or below chance, as expected (the mask is the model)
  params            parameters of the exported model (compacted: dead units removed)
  bytes ÷, FLOPs ÷  the dense baseline's file bytes and FLOPs over this model's: the speedup a memory-bound
                    or a compute-bound model would get (a batch-1 MLP is memory-bound)
  p50 ms            median batch-1 latency on this machine (local device, 1 runtime thread), over `runs` runs
  CV                standard deviation / mean of those runs; above 10 % the setting is flagged high-cv
                    (usually a busy machine: rerun on an idle one before quoting the numbers)
  speedup           the dense baseline's p50 (same run, same format) / this p50"""


def summary(runs: dict[str, Path], results_dir: Path, artifacts: Path) -> str:
    """The demo's closing summary: per algorithm and format, then per measured setting, then what each number
    is. The one place the summary is assembled: the report's per-setting verdict table slots in here."""
    return "\n\n".join([summary_table(runs, results_dir), setting_table(results_dir, artifacts), LEGEND])


def setting_table(results_dir: Path, artifacts: Path) -> str:
    """One line per measured setting (artifact × format): accuracy on its named samples, size and FLOP ratios
    against its run's dense baseline, p50, CV and the measured speedup; then how many settings are steady and
    how many compacted clients beat their baseline."""
    import numpy as np

    from edgemask.manifest import load_manifest
    from profiling.stats import cv
    from profiling.store import load_results

    df = load_results(results_dir)
    df = df[df["ok"]].copy()
    df["p50"] = [float(np.median(x)) for x in df["latency_ms"]]
    df["cv"] = [cv(x) for x in df["latency_ms"]]
    key = ["run_id", "format", "variant", "device", "threads"]
    dense = df[df["kind"] == "dense"].set_index(key)
    head = ("artifact", "format", "acc (test, n)", "params", "bytes ÷", "FLOPs ÷", "p50 ms", "CV", "runs",
            "speedup")
    lines, steady, faster, compacted = [head], 0, 0, 0
    for _, r in df.sort_values(["run_id", "format", "kind", "client_id"], key=_dense_first).iterrows():
        base = dense.loc[tuple(r[k] for k in key)]
        f = load_manifest(artifacts / r["run_id"] / r["client_id"]).file_for(r["format"], r["variant"])
        name = f"{r['run_id']}/{r['client_id']}"
        if r["kind"] == "dense":
            name += f" ({DENSE_LABELS.get(r['algorithm'], 'dense baseline')})"
        speedup = base["p50"] / r["p50"]
        steady += r["cv"] <= CV_STEADY
        if r["kind"] != "dense":
            compacted += 1
            faster += speedup > 1
        lines.append((name, r["format"], f"{f.accuracy:.3f} ({f.accuracy_samples})", f"{r['params_compacted']:,}",
                      f"{base['model_bytes'] / r['model_bytes']:.2f}×", f"{base['flops_dense'] / r['flops_compacted']:.2f}×",
                      f"{r['p50']:.3f}", f"{r['cv']:.1%}" + ("" if r["cv"] <= CV_STEADY else " high-cv"),
                      str(len(r["latency_ms"])), f"{speedup:.2f}×"))
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    row = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                  for i, (c, w) in enumerate(zip(cells, widths)))
    out = [row(lines[0]), "  ".join("-" * w for w in widths), *map(row, lines[1:])]
    out.append(f"{steady} of {len(df)} settings steady (CV ≤ {CV_STEADY:.0%}); "
               f"{faster} of {compacted} compacted clients faster than their dense baseline")
    return "\n".join(out)


def _dense_first(col):
    return col.map({"dense": "0"}).fillna(col) if col.name == "kind" else col


def summary_table(runs: dict[str, Path], results_dir: Path) -> str:
    """Per algorithm: mean personalized accuracy, bytes communicated, parameters and p50 latency dense vs
    compacted (mean over the algorithm's client artifacts), per format."""
    import json

    import numpy as np

    from profiling.store import load_results

    df = load_results(results_dir)
    rows = []
    for algo, run_path in runs.items():
        summary = json.loads((run_path / "summary.json").read_text())
        run_id = run_path.name
        d = df[(df["run_id"] == run_id) & df["ok"]]
        for fmt in sorted(d["format"].unique()):
            f = d[d["format"] == fmt]
            dense = f[f["kind"] == "dense"]
            comp = f[f["kind"] != "dense"]
            if comp.empty:  # no personal structure (FedAvg): every client runs the dense model
                comp = dense
            p50 = lambda g: float(np.mean([np.percentile(x, 50) for x in g["latency_ms"]])) if len(g) else float("nan")
            rows.append((
                algo, fmt, summary["mean_accuracy"], summary["bytes_up"] + summary["bytes_down"],
                int(dense["params_dense"].iloc[0]) if len(dense) else -1,
                float(comp["params_compacted"].astype(float).mean()),
                p50(dense), p50(comp),
            ))
    base = {r[1]: r[3] for r in rows if r[0] == "fedavg"}
    head = ("algorithm", "format", "mean pers. acc", "bytes comm.", "vs FedAvg", "params dense",
            "params compacted", "p50 dense ms", "p50 compacted ms", "speedup")
    lines = [head]
    for algo, fmt, acc, nbytes, pd_, pc, ld, lc in rows:
        ratio = nbytes / base[fmt] if base.get(fmt) else float("nan")
        lines.append((algo, fmt, f"{acc:.4f}", f"{nbytes:,}", f"{ratio:.4f}×", f"{pd_:,}", f"{pc:,.0f}",
                      f"{ld:.4f}", f"{lc:.4f}", f"{ld / lc:.2f}×"))
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(head))]
    fmt_row = lambda r: "  ".join(str(c).rjust(w) for c, w in zip(r, widths))
    return "\n".join([fmt_row(lines[0]), "  ".join("-" * w for w in widths), *map(fmt_row, lines[1:])])
