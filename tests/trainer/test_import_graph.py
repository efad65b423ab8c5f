"""The trainer's modules import each other one way: no cycle inside ``trainer/`` (counting imports inside
functions, which run all the same; not those under ``if TYPE_CHECKING:``, which never run), every module imports on
its own in a fresh interpreter, and no algorithm imports a training loop (an algorithm trains outside the rounds
through the engine it was built with, ``Algorithm.engine``), and no engine imports an algorithm."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # the project's import-graph reader, shared with tests/test_architecture.py
from import_graph import find_cycle, graph as _graph, imports as _imports, modules  # noqa: E402

LOOPS = {f"edgemask.trainer.{m}" for m in ("simulation", "engines", "batched", "local_training", "flower")}
ENGINES = {f"edgemask.trainer.{m}" for m in ("engines", "batched", "batched_ops", "local_training")}


MODULES = modules(ROOT, ("trainer",))


def imports(source: str, module: str, is_package: bool) -> set[str]:
    """The ``trainer`` modules ``source`` imports (a package's ``__init__`` counts as the package)."""
    return _imports(source, module, is_package, set(MODULES))


def graph() -> dict[str, set[str]]:
    return _graph(MODULES)


def test_find_cycle_finds_a_planted_cycle_and_no_other():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_sees_function_level_imports_and_skips_type_checking_ones():
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edgemask.trainer.records import LocalTask\n"
           "def f():\n    from edgemask.trainer.batched import local_train_batched\n")
    assert imports(src, "edgemask.trainer.x", False) == {"edgemask.trainer.batched"}


def test_trainer_imports_are_acyclic():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_algorithm_imports_a_training_loop():
    g = graph()
    offenders = {m: sorted(g[m] & LOOPS) for m in g if m.startswith("edgemask.trainer.algorithms") and g[m] & LOOPS}
    assert not offenders


def test_no_engine_imports_an_algorithm_or_the_round_loop():
    """The engines train tasks and evaluate models, whatever algorithm made them (records in, records out)."""
    g = graph()
    reach = {m: set() for m in ENGINES}
    for m in ENGINES:  # everything an engine imports, directly or not
        todo = list(g[m])
        while todo:
            d = todo.pop()
            if d not in reach[m]:
                reach[m].add(d)
                todo += g.get(d, ())
    offenders = {m: sorted(d for d in deps
                           if d.startswith("edgemask.trainer.algorithms") or d == "edgemask.trainer.simulation")
                 for m, deps in reach.items()}
    assert offenders == {m: [] for m in ENGINES}


@pytest.mark.slow
def test_every_trainer_module_imports_alone_in_a_fresh_interpreter():
    failed = []
    for name in MODULES:
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        if r.returncode:
            failed.append(f"{name}: {r.stderr.strip().splitlines()[-1]}")
    assert not failed, "\n".join(failed)
