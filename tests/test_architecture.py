"""The project's imports go one way (docs/architecture.md, "The four stages and the ground"): ``cli`` on top drives the stages; the stages
stand on ``edgemask``, the ground, which imports none of them; ``export`` reads ``trainer``'s runs, ``profiling``
uses ``devices``, ``devices`` knows no other stage. No module cycle anywhere (imports inside functions count: they
run all the same; those under ``if TYPE_CHECKING:`` never run and do not), and the board-side runner imports
nothing of ours (it is one file copied to the board)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from import_graph import find_cycle, graph, imports, modules

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
MODULES = modules(ROOT, PACKAGES)
# profiling/campaign/'s rooms -> the rooms each may import (docs/architecture.md, "The four stages and the ground"):
# reading the file knows nothing of planning or running it, planning nothing of running it
CAMPAIGN = "profiling.campaign"
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
