"""Per layer: measured speedup of the compacted VGG16 against its FLOP bound, onnxruntime and ExecuTorch, 1 and 2
threads, batch 1, CIFAR-sized input (3×32×32).

FedMask's setting: the last 8 masked layers (conv9..conv13, fc1, fc2 and conv8; ``out`` is never pruned) keep 20 %
of their units. The FLOP bound of a layer is ``F_dense / F_compacted`` (export.layers; input-side pruning by the
layer before counts too), the measured speedup ``t_dense / t_compacted``.

* onnxruntime: the runtime's own profiler (``enable_profiling``) in profiled runs, each operator attributed to its
  layer by the names in the manifest's layer records (profiling.layers); the ``(other)`` row is what no layer
  claims (pooling, layout reorders). Coverage: sum of operator times ÷ end-to-end latency of the profiled runs.
* ExecuTorch: the whole model's ETDump (executorch 1.5.1's event tracer) in profiled runs, read with the Inspector
  and the .pte's ETRecord; XNNPACK's operator events mapped to layers by order per kind (profiling.layers).

Dense and compacted are profiled in interleaved rounds (``--rounds``), each layer's best per-round median kept: a
disturbance of the shared CPU then hits both alike. An unchanged layer (conv1..conv7) is judged against its own band
(profiling.layers.unchanged_band: 0.8-1.25×, widened by its run-to-run spread over every dense run and by 2 ticks of
the whole-microsecond timer); a large one outside it marks the comparison SUSPECT and its end-to-end speedup is not
printed; a tiny one (conv1: < 2 % of the run) is shown, not judged.

``--cold-check`` tests why conv1, the first layer, reads slower in the dense model: each model is profiled back to
back and again with a sweep through ``--evict-mb`` of memory before every run (evicting every cache level). If the
dense model's larger last layers leave conv1's data cold, the sweep raises the compacted conv1 to the dense one's
time and leaves the dense one's about where it was; conv2 (after conv1 in both) is the control.

    .venv/bin/python benchmarks/bench_layers.py [--width 1.0] [--runs 50] [--rounds 3] [--cold-check]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from bench_export import fedmask_masks  # noqa: E402
from edgemask.devices.remote.runner.benchmark import profile_runs  # noqa: E402
from edgemask.export.compact import compact  # noqa: E402
from edgemask.export.formats import FORMATS, ExportSettings, FormatContext  # noqa: E402
from edgemask.export.layers import layer_records  # noqa: E402
from edgemask.export.formats.pte import etrecord_path  # noqa: E402
from edgemask.profiling.layers import (OTHER, TIMER_TICK_MS, attach_etdump, coverage, layer_ms,  # noqa: E402
                                       layer_runs_ms, layer_table, name_index, suspect_reason, time_text,
                                       unjudged_note)
from edgemask.trainer.models import MaskedModel, build_model, model_sites  # noqa: E402


def profiled(fmt: str, path: Path, x: np.ndarray, threads: int, runs: int, layers: list[dict],
             evict: np.ndarray | None = None) -> list[dict]:
    """One profiled session of the whole model: its runs with operators (ExecuTorch: from its ETDump). With
    ``evict``, each run (warm-up too) is preceded by a write over that buffer: every run starts cold."""
    if evict is None:
        prof = profile_runs(fmt, str(path), [x], threads, 10, runs)
    else:  # the runner's loop (devices.remote.runner.benchmark.profile_runs) with the sweep before each run
        from edgemask.devices.remote.runner.runtimes import RUNTIMES

        rt = RUNTIMES[fmt]()
        where = tempfile.mkdtemp(prefix="bench_layers-cold-")
        try:
            rt.load(str(path), threads, profile_dir=where)
            e2e = []
            for k in range(10 + runs):
                evict += 1.0
                t0 = time.perf_counter()
                rt.run(x)
                if k >= 10:
                    e2e.append((time.perf_counter() - t0) * 1e3)
            prof = rt.collect_profile(10, e2e, where)
        finally:
            shutil.rmtree(where, ignore_errors=True)
    if fmt == "pte":
        prof = attach_etdump(prof, path.parent, etrecord_path(path).name, layers)
    if not prof.get("available"):
        raise SystemExit(f"{path}: no per-operator profile: {prof.get('reason')}")
    return prof["runs"]


def cold_check(paths: dict, index: dict, recs: dict, x: np.ndarray, threads_list: list[int], runs: int,
               rounds: int, evict_mb: int) -> None:
    """conv1 and conv2, dense and compacted, back to back and with every run started cold (median of the runs
    of each round; the rounds' medians printed, interleaved as the main table's)."""
    buf = np.ones((evict_mb << 20) // 8)
    print(f"\n| runtime | thr | model | runs start | conv1 µs (per round) | conv2 µs (per round) |")
    print("|---|---|---|---|---|---|")
    for threads in threads_list:
        for fmt in ("onnx", "pte"):
            got: dict = {}
            for _ in range(rounds):
                for tag in ("dense", "compacted"):
                    for mode, ev in (("back to back", None), (f"cold ({evict_mb} MB swept)", buf)):
                        ms = layer_ms(profiled(fmt, paths[(fmt, tag)], x, threads, runs, recs[tag], ev),
                                      index[(fmt, tag)])
                        got.setdefault((tag, mode), []).append((ms.get("conv1", np.nan), ms.get("conv2", np.nan)))
            for (tag, mode), vals in got.items():
                c1 = ", ".join(f"{1e3 * a:.0f}" for a, _ in vals)
                c2 = ", ".join(f"{1e3 * b:.0f}" for _, b in vals)
                print(f"| {fmt} | {threads} | {tag} | {mode} | {c1} | {c2} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=float, default=1.0, help="VGG16 channel scale (1.0: the paper's)")
    ap.add_argument("--runs", type=int, default=50, help="profiled runs per artifact")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved profiling rounds per artifact")
    ap.add_argument("--cold-check", action="store_true",
                    help="also profile conv1/conv2 with every run started cold (why the first layer differs)")
    ap.add_argument("--evict-mb", type=int, default=256, help="memory swept before each run for --cold-check")
    ap.add_argument("--skip-table", action="store_true", help="only the --cold-check table")
    args = ap.parse_args()

    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench_layers."))
    t0 = time.time()
    base = build_model("vgg16", (3, 32, 32), 10, width=args.width).eval()
    x = torch.randn(1, 3, 32, 32)
    res = compact(MaskedModel(base, model_sites(base), fedmask_masks(base, 8, 0.2)), x)
    dense_res = compact(MaskedModel(base, model_sites(base), {}), x)  # same treatment: BN folded
    models = {"dense": dense_res.module, "compacted": res.module}
    onnx = {}
    for tag, m in models.items():
        onnx[tag] = tmp / f"{tag}.onnx"
        FORMATS.get("onnx").write(m, onnx[tag], FormatContext(x, ExportSettings()))
    recs = {tag: layer_records(base, m, (x,), (dense_res if tag == "dense" else res).layers,
                               {onnx[tag].name: onnx[tag]}) for tag, m in models.items()}
    batches = [x.numpy()]
    print(f"# exported in {time.time() - t0:.0f} s", file=sys.stderr)

    paths = {}
    for tag, m in models.items():
        paths[("onnx", tag)] = onnx[tag]
        paths[("pte", tag)] = tmp / f"{tag}.pte"
        FORMATS.get("pte").write(m, paths[("pte", tag)], FormatContext(x, ExportSettings()))
    index = {("onnx", tag): name_index(recs[tag], onnx[tag].name) for tag in models}
    index.update({("pte", tag): {r["name"]: r["name"] for r in recs[tag]} for tag in models})
    if args.cold_check:
        cold_check(paths, index, recs, batches[0], args.threads, args.runs, args.rounds, args.evict_mb)
    if args.skip_table:
        return
    tables, cover, ends, sums = {}, {}, {}, {}
    for threads in args.threads:
        for fmt in ("onnx", "pte"):
            best: dict = {tag: {} for tag in models}
            runs_of: dict = {tag: [] for tag in models}
            for _ in range(args.rounds):  # interleaved: dense, compacted, dense, ...
                for tag in models:
                    rs = profiled(fmt, paths[(fmt, tag)], batches[0], threads, args.runs, recs[tag])
                    runs_of[tag] += rs
                    for k, v in layer_ms(rs, index[(fmt, tag)]).items():
                        best[tag][k] = min(best[tag].get(k, float("inf")), v)
            for tag in models:
                rs = runs_of[tag]
                cover[(fmt, threads, tag)] = float(np.median([coverage(r) for r in rs]))
                ends[(fmt, threads, tag)] = float(np.median([r["end_to_end_ms"] for r in rs]))
                sums[(fmt, threads, tag)] = float(np.median([sum(op[2] for op in r["ops"]) / 1e3 for r in rs]))
            # the band widens by each layer's spread over every dense run (all rounds); its share is of the
            # dense run's summed operators
            rows = layer_table(recs["compacted"], best["dense"], best["compacted"],
                               layer_runs_ms(runs_of["dense"], index[(fmt, "dense")]), sums[(fmt, threads, "dense")],
                               TIMER_TICK_MS[fmt])
            tables[(fmt, threads)] = (rows, best["dense"].get(OTHER, 0.0), best["compacted"].get(OTHER, 0.0))
        print(f"# {threads} thread(s) done at {time.time() - t0:.0f} s", file=sys.stderr)

    head = ("runtime", "thr", "layer", "kept", "FLOP bound", "dense ms", "compact ms", "speedup", "speedup ÷ bound")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (fmt, threads), (rows, other_d, other_c) in tables.items():
        rt = "onnxruntime (profiler)" if fmt == "onnx" else "executorch (ETDump)"
        for r in rows:
            flag = " ⚑" if r.flagged else ""
            if r.unchanged and r.measured:  # the band each unchanged layer is held to, and the verdict
                lo, hi = r.band
                verdict = ("SUSPECT" if r.suspect else f"tiny ({r.tiny_text()}), not judged" if r.out_of_band
                           else "within")
                flag += f" unchanged, band {lo:.2f}-{hi:.2f}×: {verdict}" + (f"; {r.cause}" if r.cause else "")
            realized = f"{r.realized:.2f}" if r.realized == r.realized else "—"
            print(f"| {rt} | {threads} | {r.layer} | {r.kept}/{r.total} | {r.flop_bound:.2f}× | "
                  f"{time_text(r.dense_ms, r.tick_ms)} | {time_text(r.compacted_ms, r.tick_ms)} | {r.speedup_text} | "
                  f"{realized}{flag} |")
        other = f"{other_d / other_c:.2f}×" if other_c >= TIMER_TICK_MS[fmt] else "—"
        print(f"| {rt} | {threads} | {OTHER} | | | {time_text(other_d)} | {time_text(other_c)} | {other} | |")
        tot = {tag: sums[(fmt, threads, tag)] for tag in models}
        e2e = {tag: ends[(fmt, threads, tag)] for tag in models}
        why, tiny = suspect_reason(rows), unjudged_note(rows)
        headline = f"SUSPECT: {why}" if why else f"{e2e['dense'] / e2e['compacted']:.2f}× e2e"
        headline += f" ({tiny})" if tiny else ""
        print(f"| {rt} | {threads} | **total** (operators per run, median / end to end) | | {res.flop_ratio:.2f}× | "
              f"{tot['dense']:.3f} / {e2e['dense']:.3f} | {tot['compacted']:.3f} / {e2e['compacted']:.3f} | "
              f"{headline} | coverage dense {100 * cover[(fmt, threads, 'dense')]:.0f} %, compacted "
              f"{100 * cover[(fmt, threads, 'compacted')]:.0f} % |")
    print(f"# total {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
