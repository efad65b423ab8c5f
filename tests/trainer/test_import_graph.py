"""The trainer's modules import each other one way: no cycle inside ``trainer/`` (counting imports inside
functions, which run all the same; not those under ``if TYPE_CHECKING:``, which never run), every module imports on
its own in a fresh interpreter, and no algorithm imports a training loop (an algorithm trains outside the rounds
through :meth:`~trainer.algorithms.base.Algorithm.train_tasks`)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "trainer"
LOOPS = {"trainer.simulation", "trainer.batched", "trainer.local_training", "trainer.flower"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(source: str, module: str, is_package: bool) -> set[str]:
    """The ``trainer`` modules ``source`` imports (a package's ``__init__`` counts as the package): every
    ``import`` / ``from … import`` statement, at any depth, except under ``if TYPE_CHECKING:``."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)  # `from pkg import submodule`
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return {m for m in out if m in MODULES}


def graph() -> dict[str, set[str]]:
    g = {}
    for name, path in MODULES.items():
        deps = imports(path.read_text(), name, path.name == "__init__.py") - {name}
        # importing a.b.c runs a/__init__ and a/b/__init__ first, except the packages this module is in: they
        # are being imported already when it runs
        g[name] = {p for d in deps for p in _with_parents(d)} - _with_parents(name)
    return g


def _with_parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(MODULES)


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``g`` as the list of its modules (the first repeated at the end), else ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(u: str) -> list[str] | None:
        state[u] = 1
        path.append(u)
        for v in sorted(g[u]):
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if v not in state and (c := dfs(v)):
                return c
        path.pop()
        state[u] = 2
        return None

    for u in sorted(g):
        if u not in state and (c := dfs(u)):
            return c
    return None


def test_find_cycle_finds_a_planted_cycle_and_no_other():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_imports_sees_function_level_imports_and_skips_type_checking_ones():
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer.records import LocalTask\n"
           "def f():\n    from trainer.batched import local_train_batched\n")
    assert imports(src, "trainer.x", False) == {"trainer.batched"}


def test_trainer_imports_are_acyclic():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_algorithm_imports_a_training_loop():
    g = graph()
    offenders = {m: sorted(g[m] & LOOPS) for m in g if m.startswith("trainer.algorithms") and g[m] & LOOPS}
    assert not offenders


@pytest.mark.slow
def test_every_trainer_module_imports_alone_in_a_fresh_interpreter():
    failed = []
    for name in MODULES:
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        if r.returncode:
            failed.append(f"{name}: {r.stderr.strip().splitlines()[-1]}")
    assert not failed, "\n".join(failed)
