"""The rounds' progress bar the command line and the demo show while training."""

from __future__ import annotations

import sys


class RoundBar:
    """A training progress callback ``(done, total, metrics)`` drawing a tqdm bar on stderr, labelled ``label``,
    with the mean accuracy when the round measured one.

    The bar holds its line until it closes: at the last round, or at :meth:`close`. Use it as a context manager
    around the training (``with progress_printer(label) as progress: train(..., progress=progress)``) so that a
    training that stops early closes it too, and the error printed next starts a line of its own instead of
    continuing the bar's."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.bar = None

    def __call__(self, done: int, total: int, metrics: dict) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=total, desc=self.label, unit="round", file=sys.stderr)
        self.bar.update(done - self.bar.n)
        acc = metrics.get("mean_accuracy")
        if acc == acc and acc is not None:
            self.bar.set_postfix(mean_acc=f"{acc:.3f}")
        if done == total:
            self.close()

    def close(self) -> None:
        """End the bar's line (it stays on the terminal as it was); nothing when no bar is open."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def __enter__(self) -> "RoundBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress_printer(label: str) -> RoundBar:
    """The training progress callback of ``edgemask train`` and the demo (:class:`RoundBar`)."""
    return RoundBar(label)
