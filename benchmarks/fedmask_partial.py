"""FedMask under partial participation, one command, one table: mean accuracy, bytes communicated, and how far
the clients' next starting masks disagree where two clients both keep an element (FedMask Alg. 1 line 11: every
selected client starts from the one global mask under its own structure, so these should agree).

    PYTHONPATH=. OMP_NUM_THREADS=1 python benchmarks/fedmask_partial.py configs/digits-fedmask.toml \
        --participation 1.0 0.5 [--rounds 4] [--seeds 0 1 2]

The disagreement probe reads, after the last round, each client's next local task (``local_task``): its starting
scores m^r on the elements its structure keeps; over every pair of clients, it counts the elements both keep
and, of those, the ones whose starting scores differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools

import torch

from edgemask.trainer.config import TrainConfig
from edgemask.trainer.simulation import simulate


def disagreement(algo) -> tuple[int, int]:
    """(elements two clients both keep whose next starting scores differ, elements two clients both keep), summed
    over every pair of clients."""
    rounds = algo.cfg.training.rounds
    starts = {cid: algo.local_task(cid, rounds).trainable for cid in algo.client_ids}
    both = differ = 0
    for a, b in itertools.combinations(algo.client_ids, 2):
        for w, keep_a in algo.keep[a].items():
            kept = (keep_a > 0) & (algo.keep[b][w] > 0)
            both += int(kept.sum())
            differ += int((kept & (starts[a][w] != starts[b][w])).sum())
    return differ, both


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--participation", type=float, nargs="+", default=[1.0, 0.5])
    ap.add_argument("--rounds", type=int, default=None, help="override training.rounds")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="override run.seed (one run each)")
    args = ap.parse_args()
    base = TrainConfig.load(args.config)
    print("seed | participation | rounds | mean accuracy | bytes up | bytes down | starts differ / both kept")
    for seed, part in itertools.product(args.seeds or [base.run.seed], args.participation):
        t = dataclasses.replace(base.training, participation=part,
                                **({"rounds": args.rounds} if args.rounds is not None else {}))
        res = simulate(base.replace(run=dataclasses.replace(base.run, seed=seed), training=t))
        s = res.summary
        differ, both = disagreement(res.algorithm)
        print(f"{seed} | {part} | {t.rounds} | {s['mean_accuracy']:.4f} | {s['bytes_up']} | {s['bytes_down']} | "
              f"{differ} / {both}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
