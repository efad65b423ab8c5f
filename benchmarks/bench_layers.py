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
disturbance of the shared CPU then hits both alike. A comparison whose unchanged layers (conv1..conv7) measure
outside profiling.layers.UNCHANGED_BAND is marked SUSPECT and its end-to-end speedup is not printed.

    .venv/bin/python benchmarks/bench_layers.py [--width 1.0] [--runs 50] [--rounds 3]
"""

from __future__ import annotations

import argparse
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
from edgemask.profiling.layers import (OTHER, attach_etdump, coverage, layer_ms, layer_table, name_index,  # noqa: E402
                              suspect_reason)
from edgemask.trainer.models import MaskedModel, build_model, model_sites  # noqa: E402


def profiled(fmt: str, path: Path, x: np.ndarray, threads: int, runs: int, layers: list[dict]) -> list[dict]:
    """One profiled session of the whole model: its runs with operators (ExecuTorch: from its ETDump)."""
    prof = profile_runs(fmt, str(path), [x], threads, 10, runs)
    if fmt == "pte":
        prof = attach_etdump(prof, path.parent, etrecord_path(path).name, layers)
    if not prof.get("available"):
        raise SystemExit(f"{path}: no per-operator profile: {prof.get('reason')}")
    return prof["runs"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=float, default=1.0, help="VGG16 channel scale (1.0: the paper's)")
    ap.add_argument("--runs", type=int, default=50, help="profiled runs per artifact")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved profiling rounds per artifact")
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
            tables[(fmt, threads)] = (layer_table(recs["compacted"], best["dense"], best["compacted"]),
                                      best["dense"].get(OTHER, 0.0), best["compacted"].get(OTHER, 0.0))
        print(f"# {threads} thread(s) done at {time.time() - t0:.0f} s", file=sys.stderr)

    head = ("runtime", "thr", "layer", "kept", "FLOP bound", "dense ms", "compact ms", "speedup", "speedup ÷ bound")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (fmt, threads), (rows, other_d, other_c) in tables.items():
        rt = "onnxruntime (profiler)" if fmt == "onnx" else "executorch (ETDump)"
        for r in rows:
            flag = " ⚑" if r.flagged else ""
            flag += " (unchanged: outside band)" if r.out_of_band else ""
            print(f"| {rt} | {threads} | {r.layer} | {r.kept}/{r.total} | {r.flop_bound:.2f}× | {r.dense_ms:.3f} | "
                  f"{r.compacted_ms:.3f} | {r.speedup:.2f}× | {r.realized:.2f}{flag} |")
        print(f"| {rt} | {threads} | {OTHER} | | | {other_d:.3f} | {other_c:.3f} | "
              f"{other_d / other_c if other_c else float('nan'):.2f}× | |")
        tot = {tag: sums[(fmt, threads, tag)] for tag in models}
        e2e = {tag: ends[(fmt, threads, tag)] for tag in models}
        why = suspect_reason(rows)
        headline = f"SUSPECT: {why}" if why else f"{e2e['dense'] / e2e['compacted']:.2f}× e2e"
        print(f"| {rt} | {threads} | **total** (operators per run, median / end to end) | | {res.flop_ratio:.2f}× | "
              f"{tot['dense']:.3f} / {e2e['dense']:.3f} | {tot['compacted']:.3f} / {e2e['compacted']:.3f} | "
              f"{headline} | coverage dense {100 * cover[(fmt, threads, 'dense')]:.0f} %, compacted "
              f"{100 * cover[(fmt, threads, 'compacted')]:.0f} % |")
    print(f"# total {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
