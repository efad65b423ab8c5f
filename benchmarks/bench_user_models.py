"""Compaction of models users bring (issue #32): units kept per layer with batch norms found by tracing (now) vs
only those named in a hand-written ``norm_after`` map (before), for a ResNet-style and a MobileNet-style model
written with their own module names and no map (``tests/export/user_models.py``), and the zoo's models, whose
hand maps must give exactly what the trace gives.

Masks: the odd units of every masked layer but the head are dead (the user models, 3×16×16 input); the zoo
models use the tests' seeded random masks (``export_helpers.masked_case``, 40 % of units dead, seeds 1 and 2).
Each row's max |compacted − masked| is against its own masked model (before: the masked model whose batch norms
were not gated).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_user_models.py
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "export"))
warnings.filterwarnings("ignore")

import user_models  # noqa: E402,F401 - registers user_resnet, user_mobilenet
from edgemask.export.compact import compact  # noqa: E402
from export_helpers import MODEL_CASES, random_masks, randomize_norms, sample_input  # noqa: E402
from edgemask.trainer.models import MaskedModel, build_model, model_sites  # noqa: E402
from edgemask.trainer.models.masking import all_ones_masks, find_sites  # noqa: E402


def _before_sites(model):
    """Mask sites as export saw them before the trace: batch norms only from the model's ``norm_after``."""
    return find_sites(model, getattr(model, "norm_after", {}), tuple(getattr(model, "mask_exclude", ())))


def _run(model, sites, masks, x):
    masked = MaskedModel(model, sites, masks)
    res = compact(masked, x[:1])
    with torch.no_grad():
        diff = float((res.module(x) - masked(x)).abs().max())
    return res, diff


def user_table() -> None:
    for name in ("user_resnet", "user_mobilenet"):
        torch.manual_seed(0)
        model = build_model(name, (3, 16, 16), 10).eval()
        randomize_norms(model)
        x = torch.randn(16, 3, 16, 16, generator=torch.Generator().manual_seed(1))
        out = {}
        for label, sites in (("before", _before_sites(model)), ("now", model_sites(model))):
            masks = {k: v for k, v in all_ones_masks(model, sites).items() if not k.startswith(model.head[0] + ".")}
            for m in masks.values():
                m[1::2] = 0
            out[label] = _run(model, sites, masks, x)
        (rb, db), (rn, dn) = out["before"], out["now"]
        print(f"\n{name}: params dense {rb.params_dense:,}, compacted before {rb.params_compacted:,}, "
              f"now {rn.params_compacted:,}; max |compacted - masked| before {db:.1e}, now {dn:.1e}")
        print(f"| {'layer':<18} | dead | kept before | kept now | why dead units were kept (before; now) |")
        print(f"| {'-' * 18} | ---: | ---: | ---: | --- |")
        for b, n in zip(rb.layers, rn.layers):
            why = " / ".join("; ".join(f"{len(u)}: {r}" for r, u in s.why_kept) or "-" for s in (b, n))
            print(f"| {n.name:<18} | {n.dead:>4} | {b.kept:>4}/{b.total:<4} | {n.kept:>4}/{n.total:<4} | {why} |")


def zoo_table() -> None:
    print("\nzoo models, hand norm_after (before) vs trace (now), 40 % dead units, seeds 1 and 2")
    print("| model | seed | params compacted before | now | same kept units | max diff now |")
    print("| --- | ---: | ---: | ---: | --- | ---: |")
    for name in sorted(MODEL_CASES):
        shape, classes, args = MODEL_CASES[name]
        for seed in (1, 2):
            torch.manual_seed(seed)
            model = build_model(name, shape, classes, **args).eval()
            randomize_norms(model, seed)
            masks = random_masks(model, 0.4, seed)
            x = sample_input(name, 8, seed)
            rb, _ = _run(model, _before_sites(model), masks, x)
            rn, dn = _run(model, model_sites(model), masks, x)
            same = rb.kept_units.keys() == rn.kept_units.keys() and all(
                torch.equal(rb.kept_units[k], rn.kept_units[k]) for k in rb.kept_units)
            print(f"| {name} | {seed} | {rb.params_compacted:,} | {rn.params_compacted:,} | "
                  f"{'yes' if same else 'NO'} | {dn:.1e} |")


if __name__ == "__main__":
    user_table()
    if "--users-only" not in sys.argv:
        zoo_table()
