"""Dense vs compacted latency in onnxruntime and ExecuTorch (XNNPACK), 1 and 2 threads, batch 1.

Models: VGG16 in FedMask's setting (the last 8 masked layers keep 20% of their units), the HAR MLP (same rule,
its 2 hidden layers) and the character LSTM (same rule: both LSTM layers and the 2 hidden FC layers) (onnxruntime only: ExecuTorch 1.4.1 unrolls the 80-step LSTM and
lowering takes minutes). Beside each measured speedup: the FLOP-reduction ratio, the parameter-bytes ratio, and
the latency of a freshly built dense network of the compacted shapes — compaction should leave nothing behind, so
the compacted artifact should run within ~5% of it.

    .venv/bin/python benchmarks/bench_export.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore")

from edgemask.export.compact import compact, count_flops  # noqa: E402
from edgemask.export.compact.graph import StackedLSTM  # noqa: E402
from edgemask.export.formats import FORMATS, ExportSettings, FormatContext  # noqa: E402
from edgemask.trainer.models import MaskedModel, build_model, model_sites  # noqa: E402
from edgemask.trainer.models.masking import all_ones_masks  # noqa: E402

MIN_TIME, MIN_RUNS = 0.25, 20


def fedmask_masks(model: nn.Module, last: int, keep: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """All-ones masks, except whole units killed (1 − keep of them) in the last ``last`` masked layers (not out)."""
    g = torch.Generator().manual_seed(seed)
    sites = [s for s in model_sites(model) if s.name != "out"]
    masks = all_ones_masks(model, tuple(sites))
    for s in sites[-last:]:
        n = s.hidden if s.kind == "lstm" else masks[s.weights[0]].shape[0]
        dead = torch.randperm(n, generator=g)[: n - max(1, round(keep * n))]
        if s.kind == "lstm":
            for w in s.weights:
                masks[w][2 * n: 3 * n][dead] = 0
        else:
            masks[s.weights[0]][dead] = 0
    return masks


class FreshVGG(nn.Module):
    """A VGG built directly at the compacted widths (batch norm already folded: conv with bias)."""

    def __init__(self, chans: list[int], pools: list[bool], flat: int, hidden: tuple[int, int], classes: int):
        super().__init__()
        self.pools = pools
        c = 3
        for i, o in enumerate(chans):
            setattr(self, f"conv{i}", nn.Conv2d(c, o, 3, padding=1))
            c = o
        self.fc1, self.fc2, self.out = nn.Linear(flat, hidden[0]), nn.Linear(*hidden), nn.Linear(hidden[1], classes)

    def forward(self, x):
        for i, p in enumerate(self.pools):
            x = torch.relu(getattr(self, f"conv{i}")(x))
            if p:
                x = torch.max_pool2d(x, 2, 2)
        x = torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1)))))
        return self.out(x)


def fresh_like(name: str, cm: nn.Module) -> nn.Module:
    if name == "vgg16":
        convs = [getattr(cm, f"conv{i}") for i, _ in cm.plan]
        return FreshVGG([c.out_channels for c in convs], [p for _, p in cm.plan], cm.fc1.in_features,
                        (cm.fc1.out_features, cm.fc2.out_features), cm.out.out_features).eval()
    if name == "har_mlp":
        from edgemask.trainer.models.small import MLP

        return MLP(cm.fc1.in_features, (cm.fc1.out_features, cm.fc2.out_features), cm.out.out_features).eval()
    if name == "char_lstm":
        fresh = build_model("char_lstm", (80,), cm.out.out_features, hidden=8).eval()
        layers = [getattr(cm.lstm, f"layer{i}") for i in range(cm.lstm.num_layers)]
        fresh.lstm = StackedLSTM([nn.LSTM(l.input_size, l.hidden_size, batch_first=True) for l in layers])
        fresh.fc1 = nn.Linear(cm.fc1.in_features, cm.fc1.out_features)
        fresh.fc2 = nn.Linear(cm.fc2.in_features, cm.fc2.out_features)
        fresh.out = nn.Linear(cm.out.in_features, cm.out.out_features)
        return fresh.eval()
    raise KeyError(name)


def runner(fmt: str, path: Path, x: np.ndarray, threads: int):
    if fmt == "onnx":
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        call = lambda: sess.run(None, {name: x})  # noqa: E731
    else:
        from executorch.extension.pybindings.portable_lib import _unsafe_reset_threadpool
        from executorch.runtime import Runtime

        _unsafe_reset_threadpool(threads)
        method = Runtime.get().load_program(path).load_method("forward")
        xt = [torch.from_numpy(x)]
        call = lambda: method.execute(xt)  # noqa: E731
    for _ in range(10):
        call()
    return call


def median_ms(call) -> float:
    samples, start = [], time.perf_counter()
    while len(samples) < MIN_RUNS or time.perf_counter() - start < MIN_TIME:
        t = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t)
    return 1e3 * statistics.median(samples)


CASES = [  # name, input shape, classes, args, layers killed, formats
    ("vgg16", (3, 32, 32), 10, {}, 8, ("onnx", "pte")),
    ("har_mlp", (561,), 6, {}, 2, ("onnx", "pte")),
    ("char_lstm", (80,), 80, {}, 3, ("onnx",)),  # the LSTM and both hidden FC layers
]


def main() -> None:
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix="bench_export."))
    rows = []
    for name, shape, classes, args, last, fmts in CASES:
        t0 = time.time()
        base = build_model(name, shape, classes, **args).eval()
        x = torch.randint(0, classes, (1, *shape)) if name == "char_lstm" else torch.randn(1, *shape)
        masked = MaskedModel(base, model_sites(base), fedmask_masks(base, last, 0.2))
        res = compact(masked, x)
        dense = compact(MaskedModel(base, model_sites(base), {}), x).module  # same treatment: BN folded
        fresh = fresh_like(name, res.module)
        pbytes = lambda m: sum(p.numel() * p.element_size() for p in m.parameters())  # noqa: E731
        flop_ratio = count_flops(dense, (x,)) / count_flops(res.module, (x,))
        bytes_ratio = pbytes(dense) / pbytes(res.module)
        for fmt in fmts:
            paths = {}
            for tag, m in (("dense", dense), ("compacted", res.module), ("fresh", fresh)):
                f = FORMATS.get(fmt)
                paths[tag] = tmp / f"{name}.{tag}.{f.name}"
                f.write(m, paths[tag], FormatContext(x, ExportSettings()))
            for threads in (1, 2):
                calls = {tag: runner(fmt, p, x.numpy(), threads) for tag, p in paths.items()}
                lat = {tag: float("inf") for tag in calls}
                for _ in range(3):  # interleaved rounds, best median: drift on a shared CPU hits all three alike
                    for tag, call in calls.items():
                        lat[tag] = min(lat[tag], median_ms(call))
                rows.append((name, fmt, threads, lat["dense"], lat["compacted"], lat["fresh"],
                             lat["dense"] / lat["compacted"], flop_ratio, bytes_ratio,
                             lat["compacted"] / lat["fresh"] - 1))
        print(f"# {name}: done in {time.time() - t0:.0f} s", file=sys.stderr)
    head = ("model", "runtime", "thr", "dense ms", "compact ms", "fresh ms", "speedup", "FLOP ratio",
            "param-bytes ratio", "compact vs fresh")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        rt = {"onnx": "onnxruntime", "pte": "executorch"}[r[1]]
        print(f"| {r[0]} | {rt} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:.3f} | {r[6]:.2f}× | {r[7]:.2f}× | "
              f"{r[8]:.2f}× | {100 * r[9]:+.1f}% |")
    print("char_lstm in ExecuTorch: not measured (ExecuTorch 1.4.1 unrolls the 80-step LSTM; lowering takes "
          "minutes per model).")


if __name__ == "__main__":
    main()
