"""``edgemask demo``: the whole pipeline on embedded defaults — no hardware, no downloads.

FedAvg and FedMask on scikit-learn's digits (8 clients, 2 classes each) → every FedMask client compacted and
exported (plus the dense baselines) to ONNX and ExecuTorch → profiled on the built-in ``local`` device through
the same Connection and remote runner an SSH board uses → results store, report, and a summary.

The model (cli/configs/demo-*.toml: a 64-3072-2048-10 MLP) is sized so that what is measured is the model,
not the runner: its dense batch-1 latency on one thread is about half a millisecond, far above the runner's own
per-call overhead (tens of microseconds), and a batch-1 MLP is memory-bound, so a compacted client's speedup
should follow its parameter-byte ratio. The runner (cli/configs/demo-campaign.toml) uses one thread and a
timed window of at least 3 s and 500 runs per setting, long enough for the median and the CV to settle.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

from edgemask.targets import DEMO_FORMATS
from edgemask.workspace import Workspace

CONFIGS = Path(__file__).resolve().parent / "configs"


def _stage(name: str) -> None:
    print(f"\n== {name}", file=sys.stderr, flush=True)


def run_demo(ws: Workspace, rounds: int | None = None, formats: list[str] | None = None) -> dict:
    from edgemask.cli.progress import progress_printer
    from edgemask.export import export_run
    from edgemask.profiling.campaign import load_campaign, run_campaign
    from edgemask.profiling.report import write_report
    from edgemask.trainer.config import TrainConfig
    from edgemask.trainer.simulation import train

    formats = formats or list(DEMO_FORMATS)
    ws.root.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    runs = {}
    t0 = time.perf_counter()
    _stage("train")
    for algo in ("fedavg", "fedmask"):
        cfg = TrainConfig.load(CONFIGS / f"demo-{algo}.toml")
        if rounds is not None:
            cfg = cfg.replace(training=dataclasses.replace(cfg.training, rounds=rounds))
        with progress_printer(f"train {cfg.run_id}") as progress:  # closed on an error too: it prints below
            runs[algo] = train(cfg, ws.runs, progress=progress)
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
    print(summary(runs, results_dir))
    print(f"\nworkspace: {ws.root}\n  runs:      {ws.runs}\n  artifacts: {ws.artifacts}\n"
          f"  results:   {results_dir}\n  report:    {html}\n  summary:   {md}")
    print("stage wall time: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    return {"timings": timings, "runs": runs, "results": results_dir, "report": html}


# What the FedAvg and FedMask dense baselines are: FedMask's "dense" is the frozen random weights it masks, run
# without a mask; it is the right latency baseline (the same network before compaction), not an accuracy one.
LEGEND = """\
What the numbers are:
  mean pers. acc    each client's accuracy on its own test split after training, averaged over the clients
                    (FedMask: on the device's last locally trained mask, the personalized model exported)
  returned mask     FedMask only: the same on the mask the server sends back, m^T ⊙ m_k (docs/fedmask.md)
  bytes comm.       bytes uploaded + downloaded over all rounds (FedMask: 1 bit per mask element); vs FedAvg's
  setting           <run>/<client> measured on a device: `dense` is the run's uncompacted model. FedMask's
                    dense model is its frozen random weights without a mask (the mask is the model): the right
                    latency baseline (the same network before compaction), not an accuracy one
  runs              timed latency samples; each is the mean of ~10 ms of back-to-back batch-1 inferences
                    (torch-train: each sample one local training step of a minibatch, the format's own p50)
  p50, p99 ms       median and 99th percentile of those samples, per inference, on this machine (local
                    device, 1 runtime thread)
  CV                standard deviation / mean of the samples
  speedup           the dense baseline's p50 (same run, format, device, threads) / this p50; marked † when
                    either verdict is INVALID (then it is not a number to quote)
  FLOP bound        dense FLOPs / compacted FLOPs: the speedup if time followed FLOPs
  param bytes       dense / compacted parameter bytes: the speedup a memory-bound model would get
  verdict           VALID when every rule above holds; INVALID names the rules that failed (a busy machine
                    shows as high-cv: rerun on an idle one before quoting the numbers)"""


def summary(runs: dict[str, Path], results_dir: Path) -> str:
    """The demo's closing summary: training per algorithm, then the report's verdict-led table of every measured
    setting (:func:`edgemask.profiling.report.summary_table`, the same rows as summary.md), then what each number is.
    Latency and speedup appear only in the second table, where each carries its verdict."""
    from edgemask.profiling.report import summary_table as settings_table

    return "\n\n".join([training_table(runs, results_dir), settings_table(results_dir), LEGEND,
                        local_round_table(results_dir), replay_line(runs, results_dir)])


def local_round_table(results_dir: Path) -> str:
    """Per exported model: its local round measured on the device (the torch-train step, one local round of the
    client's real sample count and epochs) against FedScale's 3× assumption for the same round (3 × its samples ×
    the dense model's onnx batch-1 p50): what `edgemask replay` now uses, and what it used before."""
    import pandas as pd

    from edgemask.profiling.training import training_table as rounds_table

    path = results_dir / "results.parquet"
    t = rounds_table(pd.read_parquet(path)) if path.is_file() else pd.DataFrame()
    if t.empty:
        return "local training: no training format was measured (export and profile with --formats ...,torch-train)"
    t = t[t["assumed_from"].fillna("").str.endswith("onnx/fp32")]
    head = ("model", "format", "step p50 ms", "steps", "round measured s", "3× assumed s", "measured ÷ 3×", "verdict")
    rows = [head] + [(r.artifact, r.format, f"{r.step_p50_ms:.1f}", f"{r.steps_per_round:.0f}",
                      f"{r.local_round_ms / 1e3:.2f}", f"{r.assumed_round_ms / 1e3:.2f}",
                      f"{r.measured_over_assumed:.2f}×", r.verdict) for r in t.itertuples()]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(head))]
    cell = lambda i, c: str(c).ljust(widths[i]) if i in (0, 1, len(head) - 1) else str(c).rjust(widths[i])  # noqa: E731
    text = ["  ".join(cell(i, c) for i, c in enumerate(r)).rstrip() for r in rows]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(["Local training on the device: one local round of each model's exported training step (its "
                       "client's samples × epochs, in the run's minibatches), against FedScale's 3 × samples × the "
                       "dense model's batch-1 inference p50 (onnx) that `edgemask replay` assumed before", *text])


def replay_line(runs: dict[str, Path], results_dir: Path) -> str:
    """The summary's last line: the runs replayed under the local device's measured ONNX costs at the trace's
    assumed bandwidth (:func:`edgemask.profiling.replay.one_line`)."""
    from edgemask.errors import EdgemaskError
    from edgemask.profiling.replay import one_line

    traces = sorted((results_dir / "traces").glob("*-onnx-fp32-t1")) or sorted((results_dir / "traces").glob("*"))
    if not traces:
        return "replay: no device trace was written (see the report's notes)"
    workspace = next(iter(runs.values())).parent.parent
    try:
        return one_line(workspace, [p.name for p in runs.values()], traces[0])
    except EdgemaskError as exc:
        return f"replay: {exc}"


def training_table(runs: dict[str, Path], results_dir: Path) -> str:
    """Per algorithm: mean personalized accuracy, bytes communicated (and their ratio to FedAvg's), and the
    parameters of the dense model and of its exported clients (mean over the client artifacts)."""
    import json

    from edgemask.profiling.store import load_results

    df = load_results(results_dir)
    rows = []
    for algo, run_path in runs.items():
        summary = json.loads((run_path / "summary.json").read_text())
        d = df[(df["run_id"] == run_path.name) & df["ok"]]
        dense, comp = d[d["kind"] == "dense"], d[d["kind"] != "dense"]
        if comp.empty:  # no personal structure (FedAvg): every client runs the dense model
            comp = dense
        returned = summary.get("mean_accuracies", {}).get("returned_mask")
        rows.append((algo, summary["mean_accuracy"], returned, summary["bytes_up"] + summary["bytes_down"],
                     int(dense["params_dense"].iloc[0]) if len(dense) else -1,
                     float(comp["params_compacted"].astype(float).mean())))
    base = next((r[3] for r in rows if r[0] == "fedavg"), None)
    head = ("algorithm", "mean pers. acc", "returned mask", "bytes comm.", "vs FedAvg", "params dense",
            "params compacted")
    lines = [head]
    for algo, acc, returned, nbytes, pd_, pc in rows:
        ratio = nbytes / base if base else float("nan")
        lines.append((algo, f"{acc:.4f}", "—" if returned is None else f"{returned:.4f}", f"{nbytes:,}",
                      f"{ratio:.4f}×", f"{pd_:,}", f"{pc:,.0f}"))
    widths = [max(len(str(r[i])) for r in lines) for i in range(len(head))]
    fmt_row = lambda r: "  ".join(str(c).rjust(w) for c, w in zip(r, widths))
    return "\n".join([fmt_row(lines[0]), "  ".join("-" * w for w in widths), *map(fmt_row, lines[1:])])
