"""How far float32 arithmetic moves each zoo model's outputs at full width (issue #37): the measurements behind
export verification's rule |Δ| ≤ atol + rtol·|y_ref| (``edgemask.export.verify.Tolerance``; docs/contracts.md,
"Verification").

Every zoo model at its full width (the papers' sizes; the user models of ``tests/export/user_models.py`` at
theirs), batch norms calibrated on the inputs (train-mode statistics, then random affine) and the head scaled so
the largest |logit| is ``LOGIT_SCALE`` as a trained classifier's are (the error of a sum grows with its terms, so
the output's magnitude matters), masked two ways, seed 0:

* ``units``: whole units only, 30 % of each masked layer's units dead (what structured compaction removes);
* ``fedmask``: FedMask-like (``configs/ic-cifar10-fedmask.toml``): the last 8 masked layers keep 20 % of their
  elements (``prune_rate``) with 20 % of their units dead, the earlier ones every element; the head unmasked.

Per model × mask it compacts, and compares on the same random inputs (``--samples``, as export's real ones):

* ``compact``: the compacted torch model against the masked one (export's ``verify_compaction``), and the worst of
  its compared layers (each against the masked model's output of that layer, as its per-layer search does);
* each format's fp32 file in its runtime against the compacted torch model (export's per-format check), and,
  ``vs masked``, against the masked model (what ``sample_io`` holds and a device checks against).

Columns: max |Δ|; max |y_ref|; ``rel``: max |Δ| / max |y_ref|, the error on the tensor's own scale;
``rtol@atol``: the smallest rtol that passes at ``--atol`` (max over elements of (|Δ| − atol)₊ / |y_ref|: large
where an element near 0, the sum of large terms that cancel, differs by more than atol); ``atol@rtol``: the
smallest atol that passes at ``--rtol`` (max of (|Δ| − rtol·|y_ref|)₊); ``use``: the largest
|Δ| / (atol + rtol·|y_ref|) under ``--atol``/``--rtol`` (1 is the limit; the rule's headroom is 1/use);
``use@1e-5``: the same under the former absolute 1e-5 (above 1: the former rule refused it).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_tolerance.py                    # every model, onnx/pte/tflite
    PYTHONPATH=. .venv/bin/python benchmarks/bench_tolerance.py --models vgg16 --formats onnx
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "export"))
warnings.filterwarnings("ignore")

import user_models  # noqa: E402,F401 - registers user_resnet, user_mobilenet
from edgemask.errors import EdgemaskError  # noqa: E402
from edgemask.export.compact import compact  # noqa: E402
from edgemask.export.formats import FORMATS, FormatContext  # noqa: E402
from edgemask.export.verify import ATOL, RTOL, Tolerance  # noqa: E402
from edgemask.trainer.models import MaskedModel, build_model, model_sites  # noqa: E402

# name -> (input shape, classes, args): full width, the shapes of the datasets each model serves
MODELS = {
    "vgg16": ((3, 32, 32), 10, {}),  # FedMask IC-CIFAR10
    "resnet18": ((3, 32, 32), 10, {}),  # FedSelect CIFAR-10
    "char_lstm": ((80,), 80, {}),  # Shakespeare next character
    "tiny_mobilenet": ((3, 32, 32), 10, {}),
    "user_resnet": ((3, 32, 32), 10, {}),
    "user_mobilenet": ((3, 32, 32), 10, {}),
    "har_mlp": ((561,), 6, {}),
    "fedpews_cnn": ((1, 28, 28), 10, {}),
    "mlp": ((64,), 10, {}),
    "cnn": ((1, 8, 8), 10, {}),
}
MASKS = ("units", "fedmask")
LOGIT_SCALE = 20.0  # largest |logit| on the calibration inputs: a trained CIFAR classifier's order


def inputs(name: str, n: int, seed: int) -> torch.Tensor:
    shape, classes, _ = MODELS[name]
    g = torch.Generator().manual_seed(seed)
    if name == "char_lstm":
        return torch.randint(0, classes, (n, *shape), generator=g)  # (n, 80) token ids
    return torch.randn(n, *shape, generator=g)  # (n, C, H, W) or (n, features)


def calibrate_norms(model: nn.Module, x: torch.Tensor, seed: int) -> None:
    """Batch norms as a trained network has them: running statistics of the activations they see, then a random
    affine (γ ∈ [0.5, 1.5], β ∈ [−0.5, 0.5]) so no unit is a plain standardisation."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average over the calibration batches
    model.train()
    with torch.no_grad():
        for chunk in x.split(16):
            model(chunk)
    model.eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in norms:
            m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
            m.bias.copy_(torch.rand(m.num_features, generator=g) - 0.5)


def scale_head(masked: MaskedModel, x: torch.Tensor) -> None:
    """Scale the (unmasked) head's weight and bias so the masked model's largest |logit| on ``x`` is
    ``LOGIT_SCALE``."""
    head = getattr(masked.base, getattr(masked.base, "head", ("out",))[0])
    with torch.no_grad():
        k = LOGIT_SCALE / float(masked(x).abs().max())
        head.weight.mul_(k)
        if head.bias is not None:
            head.bias.mul_(k)


def masks_for(model: nn.Module, kind: str, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    head = tuple(getattr(model, "head", ()))
    sites = [s for s in model_sites(model) if s.name not in head]
    masks = {}
    for i, s in enumerate(sites):
        pruned = kind == "fedmask" and i >= len(sites) - 8
        keep, kill = (0.2, 0.2) if pruned else (1.0, 0.0 if kind == "fedmask" else 0.3)
        shapes = [s.mask_shape(params[w]) for w in s.weights]
        ms = [(torch.rand(sh, generator=g) < keep).float() for sh in shapes]
        if s.kind == "lstm":  # a dead hidden unit: its g-gate rows of weight_ih and weight_hh (masking.py)
            h = s.hidden
            for layer in range(len(ms) // 2):
                dead = torch.rand(h, generator=g) < kill
                for m in ms[2 * layer: 2 * layer + 2]:
                    m[2 * h: 3 * h][dead] = 0
        else:
            ms[0][torch.rand(ms[0].shape[0], generator=g) < kill] = 0
        masks.update(zip(s.weights, ms))
    return masks


class Row:
    """One comparison: its largest |Δ|, |y_ref|, the rtol it needs at ``atol``, and its share of two rules."""

    def __init__(self, ref: torch.Tensor, got: torch.Tensor, atol: float, rule: Tolerance) -> None:
        ref, got = torch.as_tensor(ref, dtype=torch.float64), torch.as_tensor(got, dtype=torch.float64)
        d, a = (got - ref).abs(), ref.abs()
        self.max_abs = float(d.max())
        self.max_ref = float(a.max())
        self.rel = self.max_abs / self.max_ref if self.max_ref else float("inf")
        over = (d - atol).clamp_min(0)
        self.rtol_needed = float(torch.where(over > 0, over / a, torch.zeros_like(over)).max())
        self.atol_needed = float((d - rule.rtol * a).clamp_min(0).max())
        self.use = float((d / (rule.atol + rule.rtol * ref.abs())).max())
        self.use_abs = self.max_abs / 1e-5

    def worse(self, other: "Row | None") -> "Row":
        return self if other is None or self.use > other.use else other


def layer_rows(masked, res, x, atol: float, rule: Tolerance) -> tuple[str, Row | None]:
    """The worst compared layer (by its share of the rule), as verify_compaction's per-layer search sees it."""
    from edgemask.export.verify import _record

    cmods = dict(res.module.named_modules())
    pairs = {n: res.folded.get(n, n) for n in res.kept_units if n in cmods}
    _, ref, _ = _record(masked, [f"base.{m}" for m in pairs.values()], (x,))
    _, got, _ = _record(res.module, list(pairs), (x,))
    worst, where = None, ""
    for n, m in pairs.items():
        if n not in got or f"base.{m}" not in ref:
            continue
        dim = 1 if isinstance(cmods[n], (nn.Conv1d, nn.Conv2d)) else -1
        r = ref[f"base.{m}"].index_select(dim, res.kept_units[n])
        row = Row(r, got[n], atol, rule)
        if row.worse(worst) is row:
            worst, where = row, n
    return where, worst


def measure(name: str, kind: str, formats: list[str], n: int, atol: float, rule: Tolerance, seed: int):
    shape, classes, args = MODELS[name]
    torch.manual_seed(seed)
    model = build_model(name, shape, classes, **args).eval()
    x = inputs(name, n, seed)
    calib = inputs(name, 64, seed + 1)
    calibrate_norms(model, calib, seed)
    masked = MaskedModel(model, model_sites(model), masks_for(model, kind, seed))
    scale_head(masked, calib)
    t = time.perf_counter()
    res = compact(masked, x[:1])
    with torch.no_grad():
        ref = masked(x).float()
        cmp = res.module(x).float()
    out = [("compact", Row(ref, cmp, atol, rule))]
    where, lay = layer_rows(masked, res, x, atol, rule)
    if lay is not None:
        out.append((f"layer {where}", lay))
    with TemporaryDirectory() as tmp:
        for f in formats:
            fmt = FORMATS.get(f)
            path = Path(tmp) / fmt.filename("fp32")
            try:
                fmt.write(res.module, path, FormatContext(x[:1]), "fp32")
                got = torch.from_numpy(fmt.run(path, x.numpy()))
            except EdgemaskError as e:
                print(f"  {name} {kind} {f}: {e}", file=sys.stderr)
                continue
            out.append((f, Row(cmp, got, atol, rule)))
            out.append((f"{f} vs masked", Row(ref, got, atol, rule)))
    dead = sum(s.total - s.kept for s in res.layers)
    total = sum(s.total for s in res.layers)
    return out, f"{res.params_compacted / res.params_dense:.0%} params, {dead}/{total} units removed", \
        time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated (default: all)")
    ap.add_argument("--masks", default=",".join(MASKS))
    ap.add_argument("--formats", default="onnx,pte,tflite", help="those not installed are left out")
    ap.add_argument("--samples", type=int, default=64, help="inputs per comparison")
    ap.add_argument("--atol", type=float, default=ATOL, help="atol for rtol@atol and for the rule's use")
    ap.add_argument("--rtol", type=float, default=RTOL, help="rtol of the rule whose use is shown")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    formats = []
    for f in a.formats.split(","):
        try:
            FORMATS.get(f).check_available()
            formats.append(f)
        except EdgemaskError as e:
            print(f"left out: {e}", file=sys.stderr)
    rule = Tolerance(a.atol, a.rtol)
    lines = [f"samples {a.samples}, seed {a.seed}, torch threads {torch.get_num_threads()}, head scaled to "
             f"|logit| {LOGIT_SCALE:g}; rtol@atol at atol {a.atol:g}; atol@rtol at rtol {a.rtol:g}; use under "
             f"{rule}; use@1e-5 under the former absolute 1e-5",
             "| model | mask | compared | max \\|Δ\\| | max \\|y_ref\\| | rel | rtol@atol | atol@rtol | use | use@1e-5 |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    worst: dict[str, Row] = {}
    for name in a.models.split(","):
        for kind in a.masks.split(","):
            rows, what, secs = measure(name, kind, formats, a.samples, a.atol, rule, a.seed)
            for label, r in rows:
                lines.append(f"| {name} | {kind} | {label} | {r.max_abs:.2e} | {r.max_ref:.3g} | {r.rel:.1e} | "
                             f"{r.rtol_needed:.1e} | {r.atol_needed:.1e} | {r.use:.3f} | {r.use_abs:.2f} |")
                key = label.split(" ")[0] + (" vs masked" if label.endswith("vs masked") else "")
                worst[key] = r.worse(worst.get(key))
            print(f"  ({name} {kind}: {what}; {secs:.0f} s)", file=sys.stderr)
    print("\n".join(lines))  # after the converters' own output
    print("\nworst of each comparison over the models above (by use):")
    print("| compared | max \\|Δ\\| | rel | rtol@atol | atol@rtol | use | headroom 1/use |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for key, r in worst.items():
        print(f"| {key} | {r.max_abs:.2e} | {r.rel:.1e} | {r.rtol_needed:.1e} | {r.atol_needed:.1e} | {r.use:.3f} | "
              f"{1 / r.use if r.use else float('inf'):.0f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
