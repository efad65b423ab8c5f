"""Wall time per stage of the demo path (train, export, profile, report), printed as a table.

    .venv/bin/python benchmarks/bench_demo.py [--rounds N]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from pathlib import Path

from edgemask.cli.demo import run_demo
from edgemask.workspace import Workspace


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        with contextlib.redirect_stdout(io.StringIO()):
            out = run_demo(Workspace.at(Path(d)), rounds=args.rounds)
    t = out["timings"]
    total = sum(t.values())
    print(f"{'stage':<10}{'seconds':>10}{'share':>8}")
    for k, v in t.items():
        print(f"{k:<10}{v:>10.1f}{v / total:>8.0%}")
    print(f"{'total':<10}{total:>10.1f}")


if __name__ == "__main__":
    main()
