"""The project's imports go one way (DESIGN.md, "The four stages"): ``cli`` on top drives the stages; the stages
stand on ``edgemask``, the ground, which imports none of them; ``export`` reads ``trainer``'s runs, ``profiling``
uses ``devices``, ``devices`` knows no other stage. No module cycle anywhere (imports inside functions count: they
run all the same; those under ``if TYPE_CHECKING:`` never run and do not), and the board-side runner imports
nothing of ours (it is one file copied to the board)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("edgemask", "cli", "trainer", "export", "devices", "profiling")
# package -> the other packages it may import (the top may import every stage and the ground)
ALLOWED = {
    "edgemask": set(),
    "trainer": {"edgemask"},
    "export": {"edgemask", "trainer"},
    "devices": {"edgemask"},
    "profiling": {"edgemask", "devices"},
    "cli": {"edgemask", "trainer", "export", "devices", "profiling"},
}
RUNNER = "devices.remote.runner"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``source`` (module ``module``) imports: every ``import`` / ``from … import``
    at any depth, relative ones resolved, except under ``if TYPE_CHECKING:``; ``from pkg import name`` counts
    ``pkg.name`` when that is a module."""
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(source))
    return {m for m in out if m in known}


def _with_parents(name: str, known: set[str]) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known


def graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules importing it runs (importing a.b.c runs a/__init__ and a/b/__init__ first, except the
    packages the importer is in: they are being imported already)."""
    known = set(modules)
    g = {}
    for name, path in modules.items():
        deps = imports(path.read_text(), name, path.name == "__init__.py", known) - {name}
        g[name] = {p for d in deps for p in _with_parents(d, known)} - _with_parents(name, known)
    return g


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


def test_the_checker_sees_what_it_must():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    src = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cli.main import main\n"
           "def f():\n    from cli import demo\n    from . import records\n")
    assert imports(src, "profiling.store", False, {"cli", "cli.demo", "cli.main", "profiling.records"}) == {
        "cli", "cli.demo", "profiling.records"}


def test_the_cycles_this_layout_broke_are_found_in_their_old_form():
    """The three cycles issue 21 names, as they were written before: the checker finds each."""
    known = {"devices", "devices.connection", "devices.connection_ssh", "profiling", "profiling.campaign",
             "profiling.store", "edgemask", "edgemask.cli", "edgemask.demo"}
    old = {
        "devices.connection": "def open_connection():\n    from devices.connection_ssh import SSHConnection\n",
        "devices.connection_ssh": "from devices.connection import Connection, RunResult\n",
        "profiling.campaign": "def run():\n    from profiling.store import ResultsStore\n",
        "profiling.store": "def rows():\n    from profiling.campaign import Job\n",
        "edgemask.cli": "def demo():\n    from edgemask.demo import run_demo\n",
        "edgemask.demo": "def run_demo():\n    from edgemask.cli import _progress_printer\n",
    }
    g = {m: imports(old.get(m, ""), m, False, known) for m in known}
    assert find_cycle(g) == ["devices.connection", "devices.connection_ssh", "devices.connection"]
    g["devices.connection_ssh"] = set()
    assert find_cycle(g) == ["edgemask.cli", "edgemask.demo", "edgemask.cli"]
    g["edgemask.demo"] = set()
    assert find_cycle(g) == ["profiling.campaign", "profiling.store", "profiling.campaign"]


def test_no_import_cycle_in_the_project():
    cycle = find_cycle(graph(MODULES))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_packages_import_one_way():
    """The ground imports no stage, no stage imports the top, and each stage only what DESIGN.md lets it."""
    offenders = sorted(f"{m} imports {d}" for m, deps in graph(MODULES).items() for d in deps
                       if d.split(".")[0] != m.split(".")[0]
                       and d.split(".")[0] not in ALLOWED[m.split(".")[0]])
    assert offenders == []


def test_the_board_side_runner_imports_nothing_of_ours():
    assert graph(MODULES)[RUNNER] == set()


@pytest.mark.slow
def test_every_module_outside_the_trainer_imports_alone_in_a_fresh_interpreter():
    """(tests/trainer/test_import_graph.py does this for trainer/.)"""
    failed = []
    for name in MODULES:
        if name.split(".")[0] == "trainer" or name == "cli.__main__":
            continue  # cli.__main__ runs the command line when imported
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        if r.returncode:
            failed.append(f"{name}: {r.stderr.strip().splitlines()[-1]}")
    assert not failed, "\n".join(failed)
