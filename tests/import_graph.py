"""An import graph of the project's modules, read from their source (tests/test_architecture.py for the whole
project, tests/trainer/test_import_graph.py for trainer/): every ``import`` / ``from … import`` at any depth counts,
since imports inside functions run all the same; those under ``if TYPE_CHECKING:`` never run and do not."""

from __future__ import annotations

import ast
from pathlib import Path


STAGES = ("trainer", "export", "devices", "profiling", "cli")  # folders installed as edgemask.<stage> (setup.py)


def dotted(rel: Path) -> str:
    """The module a file under the repository root is imported as: ``trainer/simulation.py`` is
    ``edgemask.trainer.simulation`` (docs/architecture.md, "One installed name"), a package is its ``__init__``."""
    parts = rel.with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(("edgemask", *parts) if parts[0] in STAGES else parts)


def layer(module: str) -> str:
    """The package of docs/architecture.md's table a module belongs to: a stage, or ``edgemask`` (the ground)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "edgemask" and parts[1] in STAGES else parts[0]


def modules(root: Path, folders: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every module under the repository's ``folders`` (``"trainer"``, …)."""
    return {dotted(p.relative_to(root)): p for folder in folders for p in sorted((root / folder).rglob("*.py"))}


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
