"""Per layer: measured speedup of the compacted VGG16 against its FLOP bound, onnxruntime and ExecuTorch, 1 and 2
threads, batch 1, CIFAR-sized input (3×32×32).

FedMask's setting: the last 8 masked layers (conv9..conv13, fc1, fc2 and conv8; ``out`` is never pruned) keep 20 %
of their units. The FLOP bound of a layer is ``F_dense / F_compacted`` (export.layers; input-side pruning by the
layer before counts too), the measured speedup ``t_dense / t_compacted``.

* onnxruntime: the runtime's own profiler (``enable_profiling``) in profiled runs, each operator attributed to its
  layer by the names in the manifest's layer records (profiling.layers); the ``(other)`` row is what no layer
  claims (pooling, layout reorders). Coverage: sum of operator times ÷ end-to-end latency of the profiled runs.
* ExecuTorch: the pip runtime has no event tracer (no ETDump; the runner says so), and XNNPACK reports a delegate
  call as one block anyway; so each layer (conv with its folded BN, + ReLU) is lowered on its own, dense and
  compacted, and timed alone ("isolated").

    .venv/bin/python benchmarks/bench_layers.py [--width 1.0] [--runs 50]
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
warnings.filterwarnings("ignore")

from bench_export import fedmask_masks, median_ms, runner  # noqa: E402
from devices.remote.runner import profile_runs  # noqa: E402
from export.compact import compact  # noqa: E402
from export.compact.graph import get_module  # noqa: E402
from export.formats import FORMATS, ExportSettings, FormatContext  # noqa: E402
from export.layers import layer_records  # noqa: E402
from profiling.layers import OTHER, coverage, layer_ms, layer_table, name_index  # noqa: E402
from trainer.models import MaskedModel, build_model, model_sites  # noqa: E402


def layer_inputs(model: nn.Module, names: list[str], x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Layer -> the input it sees in ``model(x)`` (batch 1)."""
    seen: dict[str, torch.Tensor] = {}
    hooks = [get_module(model, n).register_forward_pre_hook(
        lambda m, i, n=n: seen.__setitem__(n, i[0].detach().clone())) for n in names]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    return seen


def isolated_call(model: nn.Module, name: str, x: torch.Tensor, path: Path, threads: int):
    """The layer alone (+ ReLU, which XNNPACK fuses into it as in the full graph), lowered, ready to time."""
    alone = nn.Sequential(copy.deepcopy(get_module(model, name)), nn.ReLU()).eval()
    if not path.exists():
        FORMATS.get("pte").write(alone, path, FormatContext(x, ExportSettings()))
    return runner("pte", path, x.numpy(), threads)


def best_of_rounds(calls: dict, rounds: int = 3) -> dict:
    """Interleaved rounds, best median per call: drift on a shared CPU hits dense and compacted alike."""
    best = {k: float("inf") for k in calls}
    for _ in range(rounds):
        for k, call in calls.items():
            best[k] = min(best[k], median_ms(call))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=float, default=1.0, help="VGG16 channel scale (1.0: the paper's)")
    ap.add_argument("--runs", type=int, default=50, help="profiled runs per artifact")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
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
    names = [r["name"] for r in recs["compacted"]]
    inputs = {tag: layer_inputs(m, names, x) for tag, m in models.items()}
    batches = [x.numpy()]
    print(f"# exported in {time.time() - t0:.0f} s", file=sys.stderr)

    tables, cover, ends, sums = {}, {}, {}, {}
    for threads in args.threads:
        ms = {}
        for tag in models:
            prof = profile_runs("onnx", str(onnx[tag]), batches, threads, 10, args.runs)
            ms[tag] = layer_ms(prof["runs"], name_index(recs[tag], onnx[tag].name))
            cover[("onnx", threads, tag)] = float(np.median([coverage(r) for r in prof["runs"]]))
            ends[("onnx", threads, tag)] = float(np.median([r["end_to_end_ms"] for r in prof["runs"]]))
            sums[("onnx", threads, tag)] = float(np.median([sum(op[2] for op in r["ops"]) / 1e3
                                                            for r in prof["runs"]]))
        tables[("onnx", threads)] = (layer_table(recs["compacted"], ms["dense"], ms["compacted"]),
                                     ms["dense"].get(OTHER, 0.0), ms["compacted"].get(OTHER, 0.0))
        calls = {(tag, n): isolated_call(models[tag], n, inputs[tag][n], tmp / f"{tag}.{n}.pte", threads)
                 for tag in models for n in names}
        for tag in models:
            path = tmp / f"{tag}.pte"
            if not path.exists():
                FORMATS.get("pte").write(models[tag], path, FormatContext(x, ExportSettings()))
            calls[(tag, None)] = runner("pte", path, x.numpy(), threads)
        best = best_of_rounds(calls)
        ms = {tag: {n: best[(tag, n)] for n in names} for tag in models}
        for tag in models:
            ends[("pte", threads, tag)] = best[(tag, None)]
            sums[("pte", threads, tag)] = sum(ms[tag].values())
        tables[("pte", threads)] = (layer_table(recs["compacted"], ms["dense"], ms["compacted"]), None, None)
        print(f"# {threads} thread(s) done at {time.time() - t0:.0f} s", file=sys.stderr)

    head = ("runtime", "thr", "layer", "kept", "FLOP bound", "dense ms", "compact ms", "speedup", "speedup ÷ bound")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for (fmt, threads), (rows, other_d, other_c) in tables.items():
        rt = "onnxruntime (profiler)" if fmt == "onnx" else "executorch (isolated)"
        for r in rows:
            flag = " ⚑" if r.flagged else ""
            print(f"| {rt} | {threads} | {r.layer} | {r.kept}/{r.total} | {r.flop_bound:.2f}× | {r.dense_ms:.3f} | "
                  f"{r.compacted_ms:.3f} | {r.speedup:.2f}× | {r.realized:.2f}{flag} |")
        if other_d is not None:
            print(f"| {rt} | {threads} | {OTHER} | | | {other_d:.3f} | {other_c:.3f} | "
                  f"{other_d / other_c if other_c else float('nan'):.2f}× | |")
        tot = {tag: sums[(fmt, threads, tag)] for tag in models}
        e2e = {tag: ends[(fmt, threads, tag)] for tag in models}
        what = "operators per run, median" if fmt == "onnx" else "sum of isolated layers"
        extra = (f"; coverage dense {100 * cover[('onnx', threads, 'dense')]:.0f} %, compacted "
                 f"{100 * cover[('onnx', threads, 'compacted')]:.0f} %" if fmt == "onnx" else "")
        print(f"| {rt} | {threads} | **total** ({what} / end to end) | | {res.flop_ratio:.2f}× | "
              f"{tot['dense']:.3f} / {e2e['dense']:.3f} | {tot['compacted']:.3f} / {e2e['compacted']:.3f} | "
              f"{e2e['dense'] / e2e['compacted']:.2f}× e2e | {extra} |")
    print(f"# total {time.time() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
