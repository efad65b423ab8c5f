"""Bit-for-bit fingerprints of every algorithm's run (issue 31: "hold what is measured: every history bit for bit").

For every registered algorithm (:data:`edgemask.trainer.algorithms.ALGORITHMS`) × engine, a tiny run (digits, MLP 16-12,
3 clients, 2 rounds, participation 0.67, momentum and weight decay, one thread, CPU) is simulated and written to a
temporary workspace, and the table prints sha256 digests of what it wrote:

* ``history``: the history DataFrame read back from ``history.parquet`` — each column's name, dtype and values
  (floats by their exact bits), not the parquet bytes (which carry library metadata);
* ``summary``: summary.json's entries, ``wall_seconds`` left out (a clock, not a result), floats by ``repr``;
* ``model``: model.safetensors' tensors (name, dtype, shape, bytes);
* ``clients``: every ``clients/<id>.safetensors``' tensors, clients in order.

Engines: ``sequential`` (``training.batched = false``), ``batched`` (``true``), and ``flower`` — each phase's tasks
sent through :class:`edgemask.trainer.flower.TaskMessage` (settings through JSON) to a
:class:`edgemask.trainer.flower.ClientSide` that holds only the data, as a Flower node trains them (no Ray: Flower's
transport is left out, what it carries is not). A refactor that keeps every digest keeps every number the trainer
stores.

    python benchmarks/history_hashes.py [--algorithms fedavg,fedmask] [--engines sequential,batched,flower]
                                        [--check benchmarks/history_hashes.expected.txt]

``--check FILE``: compare with a table printed before (exit 1 naming the rows that differ). The digests hold for
one machine: MKL and oneDNN pick their kernels by instruction set, so the same commit writes other last bits on
another CPU (all 60 rows). The table's first line names the machine; a check against a table from another machine
exits 2 without judging. To compare a change on a new machine, print the table at the base commit there first::

    git worktree add /tmp/base <base-commit>
    (cd /tmp/base && python benchmarks/history_hashes.py > /tmp/base.txt)
    python benchmarks/history_hashes.py --check /tmp/base.txt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from safetensors.torch import load_file

from edgemask.trainer.algorithms import ALGORITHMS
from edgemask.trainer.config import TrainConfig

ENGINES = ("sequential", "batched", "flower")
ARGS = {  # the algorithms' own settings where the defaults skip a path (fine-tuning, phases) or do not fit 2 rounds
    "fedpews": {"warmup_rounds": 1},
    "fedpews_fixed": {"warmup_rounds": 1},
    "perfedmask": {"nu": 0.5, "budget": 0.6, "finetune_epochs": 1},
    "fedselect": {"p": 0.5, "L": 2, "E": 1, "localalt_epochs": 1},
    "fedrep": {"head_epochs": 1},
    "fedbabu": {"finetune_epochs": 1},
    "ditto": {"lam": 0.1},
    "heterofl": {"rates": [1.0, 0.5]},
}


def config(algo: str, batched: bool) -> TrainConfig:
    return TrainConfig.from_dict({
        "run": {"seed": 3, "run_id": f"hash-{algo}"},
        "data": {"name": "digits", "num_clients": 3, "samples_per_client": 60},
        "model": {"name": "mlp", "args": {"hidden": [16, 12]}},
        "algorithm": {"name": algo, "args": ARGS.get(algo, {})},
        "training": {"rounds": 2, "batch_size": 16, "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-4,
                     "participation": 0.67, "batched": batched},
    })


def digest_frame(df: pd.DataFrame) -> str:
    h = hashlib.sha256()
    for col in df.columns:
        s = df[col]
        h.update(f"{col}\0{s.dtype}\0".encode())
        if s.dtype.kind in "fiub":
            h.update(np.ascontiguousarray(s.to_numpy()).tobytes())
        else:
            h.update("\0".join(map(str, s.tolist())).encode())
    return h.hexdigest()


def _canon(v):
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, dict):
        return {str(k): _canon(x) for k, x in sorted(v.items())}
    if isinstance(v, (list, tuple)):
        return [_canon(x) for x in v]
    return v


def digest_summary(path: Path) -> str:
    s = json.loads(path.read_text())
    s.pop("wall_seconds", None)
    return hashlib.sha256(json.dumps(_canon(s), sort_keys=True).encode()).hexdigest()


def digest_tensors(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode())
        for k, v in sorted(load_file(str(p)).items()):
            h.update(f"{k}\0{v.dtype}\0{tuple(v.shape)}\0".encode())
            h.update(v.contiguous().view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    return h.hexdigest()


def machine() -> str:
    """What the float kernels depend on: torch's version, its CPU capability and the CPU's vector extensions."""
    try:
        flags = next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith(("flags", "Features")))
    except (OSError, StopIteration):
        flags = platform.processor()
    vector = sorted(f for f in flags.split(":")[-1].split() if f.startswith(("avx", "amx", "fma", "sse", "asimd", "sve")))
    return (f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {platform.machine()} "
            f"{hashlib.sha256(' '.join(vector).encode()).hexdigest()[:12]}")


def run_one(algo: str, engine: str, root: Path) -> tuple[str, str, str, str]:
    from edgemask.trainer.flower import loopback_phases  # flower.py imports Flower itself only when used
    from edgemask.trainer.simulation import simulate

    cfg = config(algo, engine == "batched")
    res = simulate(cfg, train_phase=loopback_phases(cfg) if engine == "flower" else None)
    out = res.write(root / f"{algo}-{engine}")
    return (digest_frame(pd.read_parquet(out / "history.parquet")), digest_summary(out / "summary.json"),
            digest_tensors([out / "model.safetensors"]), digest_tensors(sorted((out / "clients").glob("*"))))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithms", default=",".join(ALGORITHMS.names()))
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--check", type=Path, help="a table printed before: exit 1 if any row differs")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows, here = [], machine()
    table: list[str] = []
    if a.check:
        try:
            table = a.check.read_text().splitlines()
        except OSError as e:
            print(f"{a.check}: cannot read the table to check against ({e.strerror}); print one first", file=sys.stderr)
            return 2
        there = next((ln.split(":", 1)[1].strip() for ln in table if ln.startswith("# machine:")), None)
        if there != here:
            print(f"{a.check} was written on another machine ({there or 'not named'}; this one: {here}): its "
                  "digests cannot judge this one; print the base commit's table here (see --help)", file=sys.stderr)
            return 2
    print(f"# machine: {here}")
    print(f"{'algorithm':<14} {'engine':<10} {'history':<16} {'summary':<16} {'model':<16} clients")
    with tempfile.TemporaryDirectory() as tmp:
        for algo in a.algorithms.split(","):
            for engine in a.engines.split(","):
                h = run_one(algo, engine, Path(tmp))
                row = f"{algo:<14} {engine:<10} " + " ".join(x[:16] for x in h)
                print(row, flush=True)
                rows.append(row)
    if a.check:
        expected = {" ".join(r.split()[:2]): r.split() for r in table
                    if r.strip() and not r.startswith(("algorithm", "#"))}
        bad = [r for r in rows if expected.get(" ".join(r.split()[:2])) != r.split()]
        if bad:
            print(f"{len(bad)} row(s) differ from {a.check}:", *bad, sep="\n", file=sys.stderr)
            return 1
        print(f"all {len(rows)} rows as in {a.check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
