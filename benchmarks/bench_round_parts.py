"""Where a batched round's time goes (issue 8), next to the hand-written reference of ``bench_batched.py``: the
round's parts (tasks, seeds, batch orders, grouping, the stacked training), and one step's parts (forward, loss,
backward, update) for our vmapped forward and the reference's hand-written one, on the same stacked parameters
and batch. Medians over the rounds, in one run, the loops interleaved round by round.

    python benchmarks/bench_round_parts.py [--model mlp|cnn] [--rounds 150] [--threads N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from bench_batched import OurLoop, Reference
from edgemask.trainer.allocator import tune_host_allocator
from edgemask.trainer.batched import compatible_groups, local_train_batched
from edgemask.trainer.batched_ops import BatchedLayers, vmap_clients
from edgemask.trainer.sampling import batch_orders
from edgemask.trainer.simulation import phase_streams, seed_tasks, train_clients
from edgemask.trainer.task_functions import Fn, resolve


class Clock:
    """Named durations, appended per round."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.t = time.perf_counter()

    def start(self) -> None:
        self.t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.times.setdefault(name, []).append(now - self.t)
        self.t = now


def round_parts(ours: OurLoop, ref: Reference, rnd: int, clock: Clock) -> None:
    algo, cids = ours.algo, ours.cids
    clock.start()
    pairs = [(cid, algo.local_task(cid, rnd)) for cid in cids]
    clock.lap("ours: local_task × clients")
    seed_tasks(algo, rnd, 0, pairs)
    clock.lap("ours: seeds")
    data = [algo.dataset.client(cid) for cid in cids]
    orders = batch_orders([d.num_train for d in data], [t.epochs for _, t in pairs], algo.cfg.run.seed, rnd,
                          phase_streams(algo, 0, pairs))
    clock.lap("ours: batch orders (the reference has them too)")
    tasks = [t for _, t in pairs]
    compatible_groups(tasks)
    clock.lap("ours: grouping (local_train_batched does it again)")
    t = algo.cfg.training
    local_train_batched(tasks, [(d.train_x, d.train_y) for d in data], orders, t.batch_size)
    clock.lap("ours: local_train_batched (grouping, stacking, steps, results)")
    train_clients(algo, cids, rnd)
    clock.lap("ours: train_clients, whole")
    ref.round(rnd)
    clock.lap("reference: round, whole (aggregate included)")


def step_parts(ours: OurLoop, ref: Reference, x: torch.Tensor, y: torch.Tensor, clock: Clock) -> None:
    algo = ours.algo
    C = x.shape[0]
    forward = vmap_clients(resolve(Fn("model"), algo.model_spec), BatchedLayers())  # the mode inside vmap, as the loop runs it
    for name in ("ours", "reference"):
        clock.start()
        P = {k: v.unsqueeze(0).expand(C, *v.shape).clone().requires_grad_(True)
             for k, v in algo.global_params.items()}
        clock.lap(f"step, {name}: stack")
        if name == "ours":
            logits = forward(P, {}, x, {})
        else:
            logits = ref.forward(P, x)
        clock.lap(f"step, {name}: forward")
        ce = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none")
        total = ce.view(C, -1).mean(1).sum()
        clock.lap(f"step, {name}: loss")
        grads = torch.autograd.grad(total, list(P.values()))
        clock.lap(f"step, {name}: backward")
        with torch.no_grad():
            for p, g in zip(P.values(), grads):
                p.sub_(g, alpha=0.05)
        clock.lap(f"step, {name}: update")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = ap.parse_args()
    tune_host_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    ours, ref = OurLoop(args.model, True), Reference(args.model, layout="wx")
    data = ours.algo.dataset.client(ours.cids[0])
    C, B = len(ours.cids), ours.algo.cfg.training.batch_size
    x = data.train_x[torch.arange(B) % len(data.train_y)].unsqueeze(0).expand(C, B, *data.train_x.shape[1:])
    y = data.train_y[torch.arange(B) % len(data.train_y)].unsqueeze(0).expand(C, B)
    x = x.contiguous()
    clock = Clock()
    warm = max(1, args.rounds // 5)
    for rnd in range(args.rounds + warm):
        round_parts(ours, ref, rnd, clock)
        step_parts(ours, ref, x, y, clock)
        if rnd < warm:
            clock.times.clear()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; FedAvg, {C} clients, {args.model}, "
          f"batch {B}; medians of {args.rounds} rounds")
    print("\n| part | ms |\n| --- | ---: |")
    for name, ts in clock.times.items():
        print(f"| {name} | {1e3 * float(np.median(ts)):.3f} |")


if __name__ == "__main__":
    main()
