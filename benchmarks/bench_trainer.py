"""Client updates per second for FedAvg and FedMask on the digits CNN and on VGG16 (CIFAR-shaped random data),
and FedMask's communication and compute ratios to FedAvg, all from one run.

    .venv/bin/python benchmarks/bench_trainer.py [--clients 4] [--samples 32] [--batch 8] [--vgg-width 1.0]

The VGG16 data is a FederatedDataset built here from random tensors (3×32×32, 2 classes per client), so no
dataset is needed. One round of E = 1 local epoch per client; FedMask's one-shot pruning epoch is not timed.
"""

from __future__ import annotations

import argparse
import time

import torch

from edgemask.trainer.accounting import dense_reference, forward_flops, layer_positions
from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.config import TrainConfig
from edgemask.trainer.data import build_dataset
from edgemask.trainer.data.base import ClientData, FederatedDataset
from edgemask.trainer.local_training import local_train
from edgemask.trainer.sampling import batch_order
from edgemask.trainer.engines import engine_for


def random_cifar(clients: int, samples: int) -> FederatedDataset:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(clients):
        y = torch.tensor([(2 * i + j % 2) % 10 for j in range(samples)])
        out.append(ClientData(f"client-{i:03d}", torch.randn(samples, 3, 32, 32, generator=g), y,
                              torch.randn(8, 3, 32, 32, generator=g), y[:8]))
    return FederatedDataset("random-cifar", (3, 32, 32), 10, tuple(out))


def bench(algo_name: str, model: str, model_args: dict, ds: FederatedDataset, batch: int) -> dict:
    args = {"prune_last": 8 if model == "vgg16" else 2, "lambda_r": 2e-4} if algo_name == "fedmask" else {}
    cfg = TrainConfig.from_dict({"data": {"name": "digits", "num_clients": len(ds.clients)},
                                 "model": {"name": model, "args": model_args},
                                 "algorithm": {"name": algo_name, "args": args},
                                 "training": {"local_epochs": 1, "batch_size": batch,
                                              "lr": 100.0 if algo_name == "fedmask" else 0.05, "momentum": 0.9}})
    algo = ALGORITHMS.get(algo_name)(cfg, ds, engine_for(cfg.training))
    algo.model.train()
    algo.setup()
    pos = layer_positions(algo.model, algo.sites, ds.clients[0].train_x[:1])
    ref = dense_reference(algo.model, algo.sites, pos)
    def one_round(rnd: int):
        ups, flops = [], 0
        for i, cid in enumerate(algo.client_ids):
            d = algo.dataset.client(cid)
            task = algo.local_task(cid, rnd)
            res = local_train(task, d.train_x, d.train_y, batch_order(d.num_train, 1, 0, rnd, i), batch, 0.9)
            ups.append(algo.client_updates(rnd, [(cid, res)])[0])
            fwd = forward_flops(algo.model, algo.sites, algo.eval_masks(cid), pos)
            flops += (fwd + algo.backward_flops(cid, fwd)) * res.samples_seen
        algo.aggregate(rnd, ups)
        return ups, flops

    one_round(0)  # warm-up: first-call costs (allocator, autograd graph caches) are not a client's cost
    t0 = time.perf_counter()
    ups, flops = one_round(1)
    dt = time.perf_counter() - t0
    seen = sum(u.samples_seen for u in ups)
    return {"ups": len(ups) / dt, "bytes_up": sum(u.bytes_up for u in ups) / len(ups),
            "flops": flops, "fedavg_flops": 3 * ref["flops_fwd"] * seen, "fedavg_bytes": ref["bytes"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--samples", type=int, default=32, help="training samples per client (VGG16)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vgg-width", type=float, default=1.0)
    a = p.parse_args()
    torch.manual_seed(0)
    digits_cfg = TrainConfig.from_dict({"data": {"name": "digits", "num_clients": a.clients}})
    setups = [("digits cnn", "cnn", {}, build_dataset(digits_cfg.data, 0)),
              (f"vgg16 (width {a.vgg_width:g}), random 3×32×32", "vgg16", {"width": a.vgg_width},
               random_cifar(a.clients, a.samples))]
    print(f"{'model':<36} {'fedavg upd/s':>12} {'fedmask upd/s':>13} {'upload MB fedavg':>16} "
          f"{'fedmask':>10} {'comm ratio':>10} {'compute ratio':>13}")
    for label, model, margs, ds in setups:
        fa = bench("fedavg", model, margs, ds, a.batch)
        fm = bench("fedmask", model, margs, ds, a.batch)
        print(f"{label:<36} {fa['ups']:>12.2f} {fm['ups']:>13.2f} {fa['bytes_up'] / 1e6:>16.4f} "
              f"{fm['bytes_up'] / 1e6:>10.4f} {fm['bytes_up'] / fa['bytes_up']:>10.4f} "
              f"{fm['flops'] / fm['fedavg_flops']:>13.3f}")
    print("comm ratio: FedMask upload / FedAvg upload per client update; compute ratio: FedMask training FLOPs "
          "(masked, dead units free) / FedAvg's dense FLOPs on the same samples")


if __name__ == "__main__":
    main()
