"""Trainer speed (issue 8): client updates/s of the sequential loop, the batched loop, and a hand-written batched
reference loop for the same workload, measured in one run so the ratios share the machine's load.

Workload: FedAvg, 100 clients, digits split 2 classes per client, 1 local epoch, batch 16, lr 0.05, on the MLP
64-128-64-10 (``mlp``, hidden (128, 64)) and the small CNN (``cnn``). Every loop uses the same per-client orders
(``trainer.sampling.batch_orders``). Two hand-written references: the issue's, ``y = x Wᵀ + b`` per layer, and
the same with ``yᵀ = W xᵀ + b`` (the weight gradient laid out like the weight, as ``trainer.batched_ops`` does),
so that our gain from that layout is not counted as a gain over hand-written code. The rounds are interleaved,
each timed round running the four loops in a fresh random order, so a busy machine slows all of them alike and
no loop always runs after the same other one (which loop ran just before moves a loop's time by up to ~20 % here:
caches and freed memory). Each loop's median round is reported, and "paired" ratios are the median over rounds
of the ratio within the same round.
"train" times local training only (for ours: ``simulation.train_clients``, i.e. ``local_task`` + orders +
training + results); "round" adds the uploads and the server's aggregate.

All loops run under the allocator settings ``simulate()`` makes (:mod:`edgemask.trainer.allocator`);
``--default-allocator`` keeps glibc's defaults, under which every loop pays page faults for memory the heap gave back
the step before.

    python benchmarks/bench_batched.py [--rounds 40] [--models mlp,cnn] [--threads N] [--epochs E]
                                       [--default-allocator]
"""

from __future__ import annotations

import time

T_PROCESS = time.perf_counter()

import argparse  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from edgemask.trainer.algorithms import ALGORITHMS  # noqa: E402
from edgemask.trainer.allocator import tune_host_allocator  # noqa: E402
from edgemask.trainer.config import AlgorithmConfig, ModelConfig, RunConfig, TrainConfig, TrainingConfig  # noqa: E402
from edgemask.trainer.data import DataConfig, build_dataset  # noqa: E402
from edgemask.trainer.engines import engine_for  # noqa: E402
from edgemask.trainer.sampling import batch_orders  # noqa: E402
from edgemask.trainer.simulation import train_clients  # noqa: E402

T_IMPORTS = time.perf_counter() - T_PROCESS
MODEL_ARGS = {"mlp": {"hidden": [128, 64]}, "cnn": {}}


def config(model: str, batched: bool, epochs: int = 1) -> TrainConfig:
    return TrainConfig(run=RunConfig(seed=0), data=DataConfig(name="digits", num_clients=100,
                                                              partition="pathological", classes_per_client=2),
                       model=ModelConfig(model, MODEL_ARGS[model]), algorithm=AlgorithmConfig("fedavg"),
                       training=TrainingConfig(rounds=1000, local_epochs=epochs, batch_size=16, lr=0.05,
                                               batched=batched))


class OurLoop:
    """The trainer's own round: train_clients (sequential or batched), then uploads and FedAvg's aggregate."""

    def __init__(self, model: str, batched: bool, epochs: int = 1) -> None:
        t = time.perf_counter()
        cfg = config(model, batched, epochs)
        ds = build_dataset(cfg.data, cfg.run.seed)
        self.algo = ALGORITHMS.get("fedavg")(cfg, ds, engine_for(cfg.training))
        self.algo.model.train()
        self.cids = list(self.algo.client_ids)
        self.setup_s = time.perf_counter() - t

    def round(self, rnd: int) -> tuple[float, float, dict[str, torch.Tensor]]:
        t = time.perf_counter()
        results = train_clients(self.algo, self.cids, rnd)
        t_train = time.perf_counter() - t
        self.algo.aggregate(rnd, self.algo.client_updates(rnd, results))  # as simulate() does
        t_round = time.perf_counter() - t
        # a copy of client 0's trained tensors, read after the aggregate, untimed
        return t_train, t_round, dict(results[0][1].trained)


class Reference:
    """Hand-written batched FedAvg for this workload: parameters stacked (C, ...), one torch.baddbmm per linear
    layer, conv as one grouped conv over the C clients, padded batches with a per-sample loss mask, plain SGD
    (no momentum or weight decay here, so a client with no real sample at a step gets a zero gradient).

    ``layout="xw"`` is the issue's loop: ``y = x Wᵀ + b``, whose weight gradient comes back transposed in memory,
    so the update ``p -= lr·g`` runs element by element. ``layout="wx"`` computes ``yᵀ = W xᵀ + b`` with the
    activations kept transposed, as ``trainer.batched_ops``' linear rule does: the gradient is laid out like the
    weight. Both are reported, so the ratio is not flattered by the first one's slow update."""

    def __init__(self, model: str, epochs: int = 1, layout: str = "xw") -> None:
        t = time.perf_counter()
        cfg = config(model, True, epochs)
        self.epochs, self.layout = epochs, layout
        ds = build_dataset(cfg.data, cfg.run.seed)
        algo = ALGORITHMS.get("fedavg")(cfg, ds)  # the same seeded initial weights
        self.kind, self.seed, self.bs, self.lr = model, cfg.run.seed, 16, 0.05
        self.global_ = {k: v.clone() for k, v in algo.global_params.items()}
        self.C = len(ds.clients)
        self.sizes = np.array([c.num_train for c in ds.clients])
        n = int(self.sizes.max())
        self.X = torch.zeros((self.C, n, *ds.input_shape))
        self.Y = torch.zeros((self.C, n), dtype=torch.long)
        for i, c in enumerate(ds.clients):
            self.X[i, : c.num_train], self.Y[i, : c.num_train] = c.train_x, c.train_y
        self.weights = torch.from_numpy(self.sizes / self.sizes.sum()).float()
        self.setup_s = time.perf_counter() - t

    def linear(self, p: dict[str, torch.Tensor], name: str, h: torch.Tensor) -> torch.Tensor:
        """(C, B, I) -> (C, B, O) with the clients' weights (C, O, I) and biases (C, O)."""
        w, b = p[f"{name}.weight"], p[f"{name}.bias"]
        if self.layout == "wx":  # yᵀ = W xᵀ + b: (C, O, B), handed on as its transpose (a view)
            return torch.baddbmm(b.unsqueeze(2), w, h.transpose(1, 2)).transpose(1, 2)
        return torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))

    def forward(self, p: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        C, B = x.shape[:2]
        if self.kind == "mlp":
            h = x.reshape(C, B, -1)  # (C, B, 64)
            for name in ("fc1", "fc2"):
                h = torch.relu(self.linear(p, name, h))
        else:
            h = x.transpose(0, 1).reshape(B, C * x.shape[2], *x.shape[3:])  # (B, C·1, 8, 8)
            w1, w2 = p["conv1.weight"], p["conv2.weight"]  # (C, 16, 1, 3, 3), (C, 32, 16, 3, 3)
            h = F.conv2d(h, w1.reshape(-1, *w1.shape[2:]), p["conv1.bias"].reshape(-1), padding=1, groups=C)
            h = torch.max_pool2d(torch.relu(h), 2)  # (B, C·16, 4, 4)
            h = F.conv2d(h, w2.reshape(-1, *w2.shape[2:]), p["conv2.bias"].reshape(-1), padding=1, groups=C)
            h = torch.relu(h).mean(dim=(2, 3)).reshape(B, C, -1).transpose(0, 1)  # (C, B, 32)
        return self.linear(p, "out", h)  # (C, B, 10)

    def round(self, rnd: int) -> tuple[float, float, dict[str, torch.Tensor]]:
        t = time.perf_counter()
        C, bs = self.C, self.bs
        P = {k: v.unsqueeze(0).repeat(C, *[1] * v.dim()).requires_grad_(True) for k, v in self.global_.items()}
        E = self.epochs
        orders = batch_orders(self.sizes, [E] * C, self.seed, rnd, range(C))
        steps = int(-(-self.sizes.max() // bs))  # per epoch; a client with fewer batches idles (zero weight: no
        idx = np.full((C, E, steps * bs), -1, dtype=np.int64)  # step without momentum) till the epoch's end
        for i, per_epoch in enumerate(orders):
            for e, o in enumerate(per_epoch):
                idx[i, e, : len(o)] = o
        idx = torch.from_numpy(idx.reshape(C, E * steps, bs))
        steps *= E
        rows = torch.arange(C)[:, None]
        for s in range(steps):
            ii = idx[:, s]  # (C, bs)
            w = (ii >= 0).float()
            ii = ii.clamp(min=0)
            logits = self.forward(P, self.X[rows, ii])  # (C, bs, 10)
            ce = F.cross_entropy(logits.reshape(C * bs, -1), self.Y[rows, ii].reshape(-1), reduction="none")
            loss = ((ce.reshape(C, bs) * w).sum(1) / w.sum(1).clamp(min=1)).sum()
            grads = torch.autograd.grad(loss, list(P.values()))
            with torch.no_grad():
                for p, g in zip(P.values(), grads):
                    p.sub_(g, alpha=self.lr)
        t_train = time.perf_counter() - t
        with torch.no_grad():  # FedAvg: sample-weighted mean
            self.global_ = {k: torch.tensordot(self.weights, v, dims=1) for k, v in P.items()}
        return t_train, time.perf_counter() - t, {k: v[0].detach() for k, v in P.items()}


SEQ, OURS = "sequential (ours)", "batched (ours)"
REF, REF_WX = "hand-written batched reference (x·Wᵀ)", "hand-written batched reference (W·xᵀ)"


def bench(model: str, rounds: int, epochs: int = 1) -> list[tuple]:
    loops = {SEQ: OurLoop(model, False, epochs), OURS: OurLoop(model, True, epochs),
             REF: Reference(model, epochs), REF_WX: Reference(model, epochs, layout="wx")}
    startup, first, times = {}, {}, {k: [] for k in loops}
    for name, loop in loops.items():  # round 0: start-up (data, model, first round), not timed below
        t = time.perf_counter()
        _, _, first[name] = loop.round(0)
        startup[name] = loop.setup_s + time.perf_counter() - t
    rng = np.random.default_rng(0)
    names = list(loops)
    for rnd in range(1, rounds + 1):
        for i in rng.permutation(len(names)):
            tt, tr, _ = loops[names[i]].round(rnd)
            times[names[i]].append((tt, tr))
    ref = first[SEQ]
    n = len(loops[OURS].cids)
    out = []
    for name in loops:
        tt = np.median(np.array(times[name]), axis=0)  # the median round: robust to a busy machine's spikes
        diff = max(float((first[name][k] - ref[k]).abs().max()) for k in ref)
        out.append((model, name, n / tt[0], n / tt[1], startup[name], diff, np.array(times[name])))
    return out


FRESH = """
import time
t0 = time.perf_counter()
import dataclasses
import edgemask.trainer.simulation as sim
from bench_batched import config
first = []
train_clients = sim.train_clients
def timed(*args, **kwargs):
    if not first:
        first.append(time.perf_counter())
    return train_clients(*args, **kwargs)
sim.train_clients = timed
cfg = config({model!r}, True)
sim.simulate(dataclasses.replace(cfg, training=dataclasses.replace(cfg.training, rounds=1)))
print(first[0] - t0)
"""


def fresh_process_startup(model: str) -> float:
    """Seconds from a new Python process's first statement to its first round of ``edgemask train``'s loop
    (``simulate``, batched), imports and data included: what a user waits for."""
    out = subprocess.run([sys.executable, "-c", FRESH.format(model=model)], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40, help="timed rounds per loop (after one start-up round)")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--epochs", type=int, default=1, help="local epochs (the issue's workload: 1, about one step "
                                                          "a round; more amortize the per-round work)")
    ap.add_argument("--default-allocator", action="store_true",
                    help="leave glibc's malloc thresholds as they are (simulate() tunes them: trainer.allocator)")
    args = ap.parse_args()
    allocator = "unchanged: --default-allocator" if args.default_allocator else tune_host_allocator()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; imports {T_IMPORTS:.2f} s; "
          f"FedAvg, 100 clients, digits 2 classes/client, {args.epochs} epoch(s), batch 16, lr 0.05, "
          f"{args.rounds} timed rounds; host allocator {allocator}")
    rows = [r for m in args.models.split(",") for r in bench(m, args.rounds, args.epochs)]
    print("\n| model | loop | updates/s (train) | updates/s (round) | start-up to first round (s) | "
          "max abs diff vs sequential, round 0 |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for model, name, ut, ur, st, d, _ in rows:
        print(f"| {model} | {name} | {ut:,.0f} | {ur:,.0f} | {st:.2f} | {d:.1e} |")
    print("\n| model | batched / reference x·Wᵀ (train): paired median, p25-p75 | (round) | batched / reference "
          "W·xᵀ (train) | (round) | batched / sequential (train) | (round) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for model in args.models.split(","):
        r = {name: (ut, ur, t) for m, name, ut, ur, _, _, t in rows if m == model}
        b, s = r[OURS], r[SEQ]

        def paired(ref: str, col: int) -> np.ndarray:  # per round: reference time / ours = our speed / reference's
            return np.percentile(r[ref][2][:, col] / b[2][:, col], [25, 50, 75])

        (lo, mid, hi), rr, (wlo, wmid, whi), wr = (paired(REF, 0), paired(REF, 1)[1], paired(REF_WX, 0),
                                                   paired(REF_WX, 1)[1])
        print(f"| {model} | {mid:.0%}, {lo:.0%}-{hi:.0%} | {rr:.0%} | {wmid:.0%}, {wlo:.0%}-{whi:.0%} | {wr:.0%} | "
              f"{b[0] / s[0]:.1f}× | {b[1] / s[1]:.1f}× |")
    print(f"\nstart-up adds the imports ({T_IMPORTS:.2f} s) to the first loop built. A fresh process, to the first "
          f"round of simulate() (batched): " + ", ".join(f"{m} {fresh_process_startup(m):.2f} s"
                                                       for m in args.models.split(",")))


if __name__ == "__main__":
    main()
