"""FedMask's open choices measured (docs/fedmask.md): per setting and seed, the accuracy on both masks, density,
units removable, bytes and training FLOPs; mean ± spread (sample standard deviation) over the seeds.

Each setting is ``name:key=value,key=value`` over ``[algorithm.args]`` (and ``model.width=…`` /
``model.name=…`` for the model, ``training.participation=…`` for the training); one table row per setting:

* acc local / acc returned: mean accuracy over clients on the device's last locally trained mask and on the mask
  the server sends back, m^T ⊙ m_k (summary.json ``mean_accuracies``);
* density: mean fraction of mask elements kept (``mask_density``);
* removable %: output units export's compaction removes (:func:`edgemask.export.compact.compact`), over every masked
  layer but the head, mean over clients whose model is not cut; params %: the compacted model's parameters / dense;
* MB: bytes up + down over the run, ClientPruning's upload included; FLOPs ×: ``vs_fedavg.flops_train_structured``
  (whole dead units free), elem FLOPs ×: ``vs_fedavg.flops_train`` (every zero element free).

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedmask_fidelity.py \\
        --config configs/digits-fedmask.toml --seeds 0 1 2 --settings soft:forward=soft binary:forward=binary
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgemask.export.compact import AllDeadLayerError, compact  # noqa: E402
from edgemask.trainer.config import TrainConfig  # noqa: E402
from edgemask.trainer.run_dir import load_run  # noqa: E402
from edgemask.trainer.simulation import train  # noqa: E402


def parse_setting(text: str) -> tuple[str, dict, dict, dict]:
    """``name:key=value,...`` -> (name, algorithm args, model overrides, training overrides); values parsed as
    JSON when they parse."""
    name, _, rest = text.partition(":")
    algo, model, training = {}, {}, {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        try:
            val = json.loads(v)
        except json.JSONDecodeError:
            val = v
        if k.startswith("model."):
            model[k[len("model."):]] = val
        elif k.startswith("training."):
            training[k[len("training."):]] = val
        else:
            algo[k] = val
    return name, algo, model, training


def removable(run) -> tuple[float, float]:
    """Mean over clients (not cut) of the fraction of non-head output units compaction removes, and of the
    compacted params / dense."""
    fr, pr = [], []
    for cid in run.client_ids:
        masked = run.build_model(cid)
        try:
            res = compact(masked, run.dataset.client(cid).test_x[:1])
        except AllDeadLayerError:
            continue
        layers = res.layers[:-1]  # the head's units are the classes: never removed
        fr.append(1 - sum(s.kept for s in layers) / sum(s.total for s in layers))
        pr.append(res.params_compacted / res.params_dense)
    return (float(np.mean(fr)), float(np.mean(pr))) if fr else (float("nan"), float("nan"))


def measure(cfg: TrainConfig, root: Path) -> dict:
    run = load_run(train(cfg, root))
    s = run.summary
    rem, params = removable(run)
    acc = s.get("mean_accuracies", {"local_mask": s["mean_accuracy"]})
    return {"local": acc["local_mask"], "returned": acc.get("returned_mask", float("nan")),
            "density": s["mask_density"], "removable": rem, "params": params,
            "mb": (s["bytes_up"] + s["bytes_down"] + s.get("bytes_up_setup", 0)) / 1e6, "flops": s["vs_fedavg"]["flops_train_structured"],
            "flops_element": s["vs_fedavg"]["flops_train"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/digits-fedmask.toml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--settings", nargs="+", default=["binary:forward=binary", "soft:forward=soft"])
    ap.add_argument("--json", default=None, help="also write every run's figures here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = TrainConfig.load(args.config)
    t = base.training
    rounds = args.rounds if args.rounds is not None else t.rounds
    print(f"# {args.config}, {rounds} rounds, seeds {args.seeds}; mean ± sd over seeds")
    cols = ("local", "returned", "density", "removable", "params", "mb", "flops", "flops_element")
    print(f"{'setting':<24} {'acc local':>13} {'acc returned':>13} {'density':>13} {'removable %':>13} "
          f"{'params %':>13} {'MB':>13} {'FLOPs ×':>13} {'elem FLOPs ×':>13}", flush=True)
    out = {}
    with tempfile.TemporaryDirectory() as d:
        for text in args.settings:
            name, a, m, tr = parse_setting(text)
            runs = []
            for seed in args.seeds:
                cfg = base.replace(algorithm=replace(base.algorithm, args={**base.algorithm.args, **a}),
                                   model=replace(base.model, name=m.get("name", base.model.name),
                                                 args={**base.model.args,
                                                       **{k: v for k, v in m.items() if k != "name"}}),
                                   training=replace(t, rounds=rounds, **tr),
                                   run=replace(base.run, seed=seed, run_id=f"fid-{name}-{seed}"))
                runs.append(measure(cfg, Path(d)))
            out[name] = runs
            cells = []
            for c in cols:
                v = np.array([r[c] for r in runs]) * (100 if c in ("removable", "params") else 1)
                cells.append(f"{v.mean():.3f}±{v.std(ddof=1) if len(v) > 1 else 0:.3f}")
            print(f"{name:<24} " + " ".join(f"{c:>13}" for c in cells), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
