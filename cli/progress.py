"""The rounds' progress bar the command line and the demo show while training."""

from __future__ import annotations

import sys


def progress_printer(label: str):
    """A training progress callback ``(done, total, metrics)`` drawing a tqdm bar on stderr, labelled ``label``,
    with the mean accuracy when the round measured one."""
    from tqdm import tqdm

    bar = None

    def cb(done: int, total: int, metrics: dict) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=total, desc=label, unit="round", file=sys.stderr)
        bar.update(done - bar.n)
        acc = metrics.get("mean_accuracy")
        if acc == acc and acc is not None:
            bar.set_postfix(mean_acc=f"{acc:.3f}")
        if done == total:
            bar.close()

    return cb
