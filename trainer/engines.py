"""The two local-training engines behind one interface (:class:`~edgemask.trainer.records.Engine`), chosen once per run
from ``[training]`` (:func:`engine_for`); nothing else asks which one runs.

* :class:`SequentialEngine` — one client after another (:func:`edgemask.trainer.local_training.local_train`,
  :func:`~edgemask.trainer.local_training.evaluate`): the reference, one client's tensors alive at a time, so the round
  loop hands it one client per call (:meth:`~SequentialEngine.groups`); a client trains on one thread, as on a Flower
  node, so the two give the same bits;
* :class:`BatchedEngine` — a call's clients stacked and trained or evaluated together on ``training.device``
  (:func:`edgemask.trainer.batched.local_train_batched`, :func:`~edgemask.trainer.batched.evaluate_many`), a step's
  results equal to the sequential one's within float rounding (the stacked kernels are not the one client's, so not
  bit for bit: docs/training-engine.md, "How far the engines agree"); the round loop hands it a round's clients at
  once. Its results are plain dicts of views
  of its stacked tensors' rows, which the server's average reads as the one tensor they lie in
  (:func:`edgemask.trainer.aggregation.stack_rows`).

The round loop (:mod:`edgemask.trainer.simulation`) trains and evaluates through the engine; an algorithm that trains
outside the rounds (FedMask's pruning epoch, Per-FedAvg's adaptation step) uses the one it was built with
(``Algorithm.engine``) and never imports this module (tests/trainer/test_import_graph.py).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Any, Iterator

import torch

from edgemask.trainer.batched import evaluate_many, local_train_batched
from edgemask.trainer.devices import resolve_device
from edgemask.trainer.local_training import evaluate, local_train
from edgemask.trainer.records import EvalModel, LocalResult, LocalTask

Data = list[tuple[torch.Tensor, torch.Tensor]]


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to one inside, restored after: a kernel that splits a sum across threads (a
    convolution's weight gradient over the minibatch) then sums in one order, whatever the host's cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class SequentialEngine:
    """One client after another: the reference. A client's local step runs on one thread (:func:`one_thread`), as
    on a Flower node of the simulation engine (``trainer.flower``, one torch thread per client), so a device's step
    is the same bits here and there, on any host's number of cores."""

    together = False

    def train(self, tasks: list[LocalTask], data: Data, orders: list[list[Any]], batch_size: int,
              momentum: float = 0.0, weight_decay: float = 0.0) -> list[LocalResult]:
        with one_thread():
            return [local_train(task, x, y, o, batch_size, momentum, weight_decay)
                    for task, (x, y), o in zip(tasks, data, orders)]

    def evaluate(self, models: list[EvalModel], data: Data) -> list[tuple[float, float]]:
        return [evaluate(model, x, y) for model, (x, y) in zip(models, data)]

    def groups(self, cids: list[str]) -> list[list[str]]:
        """The clients one call trains: one at a time (a client's every phase before the next client's)."""
        return [[cid] for cid in cids]


class BatchedEngine:
    """A call's clients together, stacked, on ``device`` (``cuda`` when asked for and present, else the CPU)."""

    together = True

    def __init__(self, device: str = "cpu") -> None:
        self.device = device

    def train(self, tasks: list[LocalTask], data: Data, orders: list[list[Any]], batch_size: int,
              momentum: float = 0.0, weight_decay: float = 0.0) -> list[LocalResult]:
        return local_train_batched(tasks, data, orders, batch_size, momentum, weight_decay, self.device)

    def evaluate(self, models: list[EvalModel], data: Data) -> list[tuple[float, float]]:
        return evaluate_many(models, data, device=self.device)

    def groups(self, cids: list[str]) -> list[list[str]]:
        """The clients one call trains: all of them."""
        return [list(cids)]


def engine_for(training: Any, stacklevel: int = 2) -> SequentialEngine | BatchedEngine:
    """The engine ``[training]`` asks for: batched on ``training.device`` with ``training.batched``, else
    sequential. Asking for CUDA where this torch sees none warns once, here, and runs on the CPU."""
    if not training.batched:
        return SequentialEngine()
    asked = training.device
    if resolve_device(asked).type != torch.device(asked).type:
        warnings.warn(f"training.device {asked!r}: this torch ({torch.__version__}) sees no CUDA device, so the "
                      f"clients train and evaluate on the CPU", RuntimeWarning, stacklevel=stacklevel + 1)
    return BatchedEngine(asked)
