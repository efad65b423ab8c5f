"""The project's imports go one way (docs/architecture.md, "The four stages and the ground"): ``cli`` on top drives the stages; the stages
stand on ``edgemask``, the ground, which imports none of them; ``export`` reads ``trainer``'s runs, ``profiling``
uses ``devices``, ``devices`` knows no other stage. No module cycle anywhere (imports inside functions count: they
run all the same; those under ``if TYPE_CHECKING:`` never run and do not), and the board-side runner imports
nothing of ours: its rooms import each other, one way, and the standard library at their top (it is shipped to the
board as one zipapp and run by the board's own Python)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from import_graph import STAGES, find_cycle, graph, imports, layer, modules

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
RUNNER = "edgemask.devices.remote.runner"
# The runner's rooms -> the rooms each may import (docs/architecture.md, "The runner: one file on the board"). Listed
# in layers: a room imports only rooms listed above it, so there is no cycle among them.
RUNNER_ROOMS = {
    "system": set(),
    "errors": set(),
    "reference": {"errors"},
    "options": set(),
    "sensors": {"system"},
    "parsers": {"sensors"},
    "state": {"parsers", "system"},
    "lock": set(),
    "session": {"system"},
    "clocks": {"system"},
    "profilers": {"errors"},
    "trt_files": set(),
    "trt": {"errors", "sensors", "system", "trt_files"},
    "training": {"errors"},
    "runtimes": {"errors", "profilers", "training", "trt"},
    "trt_benchmark": {"errors", "reference", "sensors", "state", "system", "trt", "trt_files"},
    "train_benchmark": {"errors", "reference", "sensors", "state", "system", "training"},
    "benchmark": {"errors", "reference", "runtimes", "sensors", "state", "train_benchmark", "trt_benchmark"},
    "probe": {"parsers", "runtimes", "sensors", "state", "system", "trt"},
    "cli": {"benchmark", "clocks", "errors", "lock", "options", "probe", "runtimes", "session", "trt"},
    "__main__": {"cli"},
}
MODULES = modules(ROOT, PACKAGES)
# profiling/campaign/'s rooms -> the rooms each may import (docs/architecture.md, "The four stages and the ground"):
# reading the file knows nothing of planning or running it, planning nothing of running it
CAMPAIGN = "edgemask.profiling.campaign"
CAMPAIGN_ROOMS = {
    "config": set(),
    "plan": {"config"},
    "boards": set(),
    "worker": {"boards"},
    "run": {"plan", "boards", "worker"},
}


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
    """The ground imports no stage, no stage imports the top, and each stage only what docs/architecture.md lets it."""
    offenders = sorted(f"{m} imports {d}" for m, deps in graph(MODULES).items() for d in deps
                       if layer(d) != layer(m) and layer(d) not in ALLOWED[layer(m)])
    assert offenders == []


def test_the_layer_of_a_module_is_its_folder():
    assert [layer(m) for m in ("edgemask", "edgemask.schema", "edgemask.trainer", "edgemask.cli.main",
                               "edgemask.devices.remote.runner")] == ["edgemask", "edgemask", "trainer", "cli", "devices"]
    assert set(ALLOWED) == {"edgemask", *STAGES} == {layer(m) for m in MODULES}


def test_nothing_imports_a_stage_by_its_folder_name():
    """Installed, the stages are ``edgemask.trainer``, … (docs/architecture.md, "One installed name"); from the
    repository root ``import trainer`` would still resolve (the folder is on the path) and load a second copy of
    every module it reaches, with its own registries. No Python file of the repository (tests, benchmarks and
    scripts included) imports a stage by its folder name."""
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.parts[0].startswith(".") or rel.parts[0] in ("build", "workspace") or "egg-info" in rel.parts[0]:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(rel))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            offenders += [f"{rel}:{node.lineno}: {n}" for n in names if n.split(".")[0] in STAGES]
    assert offenders == []


def test_the_board_side_runner_imports_nothing_of_ours():
    """Nothing outside the runner package, from any of its rooms; the package itself imports none of its rooms (the
    host imports one room without the others)."""
    g = graph(MODULES)
    runner = {m for m in MODULES if m == RUNNER or m.startswith(RUNNER + ".")}
    assert g[RUNNER] == set()
    assert sorted(f"{m} imports {d}" for m in runner for d in g[m] if d not in runner) == []


def test_each_runner_room_imports_only_the_rooms_below_it():
    g = graph(MODULES)
    rooms = {m[len(RUNNER) + 1:] for m in MODULES if m.startswith(RUNNER + ".")}
    assert rooms == set(RUNNER_ROOMS), "a new room needs its place in RUNNER_ROOMS (and docs/architecture.md)"
    order = list(RUNNER_ROOMS)
    for room, allowed in RUNNER_ROOMS.items():
        assert all(order.index(a) < order.index(room) for a in allowed), f"{room} may only import rooms above it"
        got = {d[len(RUNNER) + 1:] for d in g[f"{RUNNER}.{room}"]}
        assert got <= allowed, f"{RUNNER}.{room} imports {sorted(got - allowed)}, not in RUNNER_ROOMS[{room!r}]"


def _top_imports_outside_stdlib(source: str) -> list[str]:
    """The packages a module imports at its top (not inside a function) that are not the standard library's."""
    tops = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import):
            tops += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            tops.append(node.module.split(".")[0])
    return [t for t in tops if t not in sys.stdlib_module_names]


def test_the_runner_rooms_import_only_the_standard_library_at_their_top():
    """numpy and the runtimes are imported inside the functions that use them: a board without one still probes."""
    offenders = [f"{name} imports {t}" for name, path in MODULES.items()
                 if name == RUNNER or name.startswith(RUNNER + ".")
                 for t in _top_imports_outside_stdlib(path.read_text())]
    assert offenders == []


def test_the_stdlib_check_would_catch_numpy_at_the_top():
    src = "import os\nimport numpy as np\nfrom . import sensors\nfrom onnxruntime import InferenceSession\n" \
          "def f():\n    import torch\n"
    assert _top_imports_outside_stdlib(src) == ["numpy", "onnxruntime"]


@pytest.mark.slow
def test_every_module_outside_the_trainer_imports_alone_in_a_fresh_interpreter():
    """(tests/trainer/test_import_graph.py does this for trainer/.)"""
    failed = []
    for name in MODULES:
        if layer(name) == "trainer" or name.endswith(".__main__"):
            continue  # a __main__ runs its command line when imported
        r = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                           env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
        if r.returncode:
            failed.append(f"{name}: {r.stderr.strip().splitlines()[-1]}")
    assert not failed, "\n".join(failed)


def _room_offenders(g: dict[str, set[str]]) -> list[str]:
    return sorted(f"{room} imports {dep.rsplit('.', 1)[1]}" for room, allowed in CAMPAIGN_ROOMS.items()
                  for dep in g[f"{CAMPAIGN}.{room}"]
                  if dep.startswith(CAMPAIGN + ".") and dep.rsplit(".", 1)[1] not in allowed)


def test_the_campaign_rooms_import_one_way():
    rooms = {m for m in MODULES if m.startswith(CAMPAIGN + ".")}
    assert rooms == {f"{CAMPAIGN}.{r}" for r in CAMPAIGN_ROOMS}  # a new room says here what it may import
    g = graph(MODULES)
    assert _room_offenders(g) == []
    # the check finds a room that reaches back: config importing run, plan importing run
    bad = {**g, f"{CAMPAIGN}.config": {f"{CAMPAIGN}.run"}, f"{CAMPAIGN}.plan": {f"{CAMPAIGN}.config", f"{CAMPAIGN}.run"}}
    assert _room_offenders(bad) == ["config imports run", "plan imports run"]
    # no room imports the package itself (its __init__ imports every room: a hidden cycle the graph leaves out)
    known = set(MODULES)
    assert [r for r in sorted(rooms) if CAMPAIGN in imports(MODULES[r].read_text(), r, False, known)] == []
