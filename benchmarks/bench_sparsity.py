"""Which whole units FedMask's structured sparsity kills, measured after training, over the restart scale s
(``init_scale``: each round's real-valued mask restarts at ±s, Alg. 1 line 14 leaves the magnitude open) × λ_R
(Eq. 10; 2e-4 is the paper's value for its centralized MNIST study, §3.5 / Table 2 — §4.2 gives none for the
federated runs).

Per (s, λ_R): train the config (default: the embedded digits FedMask run, configs/digits-fedmask.toml, with only
``init_scale`` and ``lambda_r`` changed; the paper's binarized forward unless ``--forward soft``), then for every
client's personalized model and every hidden layer of the MLP:

* row-dead: units whose mask row is all zero (:func:`edgemask.trainer.models.masking.unit_alive`) — they output zero;
* col-dead: units whose column is zero in the next layer's mask — nobody reads them (group lasso's column term);
* removable: the units export's compaction actually removes (:func:`edgemask.export.compact.compact`, proven equal to
  the masked model here by :func:`edgemask.export.verify.verify_compaction`): the union of both, plus units read only by
  removed rows.

Percentages are means over the clients (and seeds); removable, params and FLOPs over the clients whose model is
not cut ("cut": a layer with every unit dead — the model outputs a constant and export refuses it). params /
FLOPs: the compacted model's, as % of the dense model's. density: mask elements kept. acc local / returned: mean
accuracy on the device's last locally trained mask and on the mask the server sends back (m^T ⊙ m_k). The head's
units (the classes) are never removed, not listed.

    PYTHONPATH=. OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_sparsity.py
        [--config configs/digits-fedmask.toml] [--scales 1,0.3,0.1] [--lambdas 0,2e-4,2e-3] [--seeds 0]
        [--forward binary|soft] [--rounds N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edgemask.export.compact import AllDeadLayerError, compact  # noqa: E402
from edgemask.export.verify import verify_compaction  # noqa: E402
from edgemask.trainer.config import TrainConfig  # noqa: E402
from edgemask.trainer.models.masking import any_nonzero, unit_alive  # noqa: E402
from edgemask.trainer.run_dir import load_run  # noqa: E402
from edgemask.trainer.simulation import train  # noqa: E402

PAPER_LAMBDA = 2e-4  # FedMask §3.5 / Table 2 (centralized MNIST); §4.2 gives no λ_R


def client_sparsity(masked, x) -> tuple[dict[str, tuple[int, float, float, float]], float, float]:
    """Per hidden layer: (units, row-dead, col-dead, removable) fractions; and the compacted params and FLOPs
    as fractions of the dense model's. ``masked``: a chain MLP's :class:`MaskedModel` (each layer's only
    consumer is the next one). A model with a layer entirely dead is cut (it outputs a constant, and export
    refuses it): removable and the ratios are NaN."""
    sites = [s for s in masked.sites if s.weights[0] in masked.masks]
    try:
        res = compact(masked, x[:1])
        verify_compaction(masked, res, x)  # raises if compaction changed the output
    except AllDeadLayerError:
        res = None
    out = {}
    for site, consumer in zip(sites, sites[1:]):
        units = int(masked.masks[site.weights[0]].shape[0])
        row_dead = ~unit_alive(site, masked.masks)
        col_dead = ~any_nonzero(masked.masks[consumer.weights[0]], 0)  # (in_features,) of the next layer
        stat = next((s for s in res.layers if s.name == site.name), None) if res else None
        out[site.name] = (units, float(row_dead.float().mean()), float(col_dead.float().mean()),
                          1 - stat.kept / stat.total if stat else float("nan"))
    if res is None:
        return out, float("nan"), float("nan")
    return out, res.params_compacted / res.params_dense, res.flops_compacted / res.flops_dense


def measure(cfg: TrainConfig, root: Path) -> dict:
    run = load_run(train(cfg, root))
    layers: dict[str, list] = {}
    params, flops = [], []
    for cid in run.client_ids:
        per_layer, p, f = client_sparsity(run.build_model(cid), run.dataset.client(cid).test_x)
        for name, v in per_layer.items():
            layers.setdefault(name, []).append(v)
        params.append(p)
        flops.append(f)
    accs = run.summary.get("mean_accuracies", {})
    return {"accuracy": run.summary["mean_accuracy"], "returned": accs.get("returned_mask", float("nan")),
            "density": run.summary["mask_density"], "layers": layers, "cut": int(np.isnan(params).sum()),
            "params": params, "flops": flops}


def floats(text: str) -> list[float]:
    return [float(v) for v in text.split(",")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/digits-fedmask.toml")
    ap.add_argument("--scales", default="1,0.3,0.1", help="restart scales s (init_scale), comma-separated")
    ap.add_argument("--lambdas", default="0,2e-4,2e-3", help="λ_R values, comma-separated")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="run seeds (default: the config's)")
    ap.add_argument("--forward", default="binary", choices=("binary", "soft"))
    ap.add_argument("--rounds", type=int, default=None, help="override training.rounds")
    args = ap.parse_args()
    torch.set_num_threads(1)
    base = TrainConfig.load(args.config)
    if base.algorithm.name != "fedmask" or base.model.name not in ("mlp", "har_mlp"):
        sys.exit(f"{args.config}: this benchmark needs algorithm 'fedmask' on an MLP ('mlp' or 'har_mlp'), "
                 f"got {base.algorithm.name!r} on {base.model.name!r}")
    t = base.training
    rounds = args.rounds if args.rounds is not None else t.rounds
    seeds = args.seeds if args.seeds is not None else [base.run.seed]
    a = base.algorithm.args
    print(f"# {args.config}: {base.data.name}, {base.data.num_clients} clients, participation {t.participation}, "
          f"{rounds} rounds × {t.local_epochs} local epochs, model {base.model.name} {base.model.args or ''}, "
          f"prune_rate {a.get('prune_rate', 0.2)} on the last {a.get('prune_last', 2)} masked layers, forward "
          f"{args.forward}, seeds {seeds}; % = mean over clients and seeds; paper λ_R = {PAPER_LAMBDA:g} (§3.5)")
    print(f"{'s':>5} {'λ_R':>7} {'layer':<6} {'units':>5} {'row-dead %':>10} {'col-dead %':>10} {'removable %':>11} "
          f"{'acc local':>9} {'acc ret.':>8} {'density':>7} {'params %':>8} {'FLOPs %':>8} {'cut':>5}")
    with tempfile.TemporaryDirectory() as d:
        for scale in floats(args.scales):
            for lam in floats(args.lambdas):
                ms = []
                for seed in seeds:
                    cfg = base.replace(
                        algorithm=replace(base.algorithm, args={**a, "lambda_r": lam, "init_scale": scale,
                                                                "forward": args.forward}),
                        training=replace(t, rounds=rounds),
                        run=replace(base.run, seed=seed, run_id=f"sparsity-{scale:g}-{lam:g}-{seed}"))
                    ms.append(measure(cfg, Path(d)))
                acc, ret = np.mean([m["accuracy"] for m in ms]), np.mean([m["returned"] for m in ms])
                dens = np.mean([m["density"] for m in ms])
                params = np.array([p for m in ms for p in m["params"]])
                flops = np.array([f for m in ms for f in m["flops"]])
                p = 100 * np.nanmean(params) if not np.isnan(params).all() else float("nan")
                f = 100 * np.nanmean(flops) if not np.isnan(flops).all() else float("nan")
                cut, n = sum(m["cut"] for m in ms), len(params)
                for name in ms[0]["layers"]:
                    rows = [v for m in ms for v in m["layers"][name]]
                    r = np.array([v[1:] for v in rows]) * 100  # (clients × seeds, 3)
                    row, col = r[:, :2].mean(0)
                    rem = np.nanmean(r[:, 2]) if not np.isnan(r[:, 2]).all() else float("nan")
                    print(f"{scale:>5g} {lam:>7g} {name:<6} {rows[0][0]:>5} {row:>10.1f} {col:>10.1f} {rem:>11.1f} "
                          f"{acc:>9.3f} {ret:>8.3f} {dens:>7.3f} {p:>8.1f} {f:>8.1f} {cut:>2}/{n}", flush=True)


if __name__ == "__main__":
    main()
