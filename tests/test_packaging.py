"""What installing edgemask puts into a user's environment (docs/architecture.md, "One installed name"): the wheel
built from this checkout holds exactly the top-level names that section lists, so no stage folder (``cli``,
``export``, …) lands in site-packages under a name another package may own; installed into a fresh virtual
environment, ``edgemask.cli`` is found and ``cli`` / ``export`` are not."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("trainer", "export", "devices", "profiling", "cli")


def documented_top_level() -> set[str]:
    """The names in the bullet list under docs/architecture.md's "One installed name"."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## One installed name", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"^- top-level: `([A-Za-z_][\w]*)`", section, flags=re.M)
    assert names, "docs/architecture.md's 'One installed name' lists no '- top-level: `name`' line"
    return set(names)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: build with this environment's setuptools (no download); --no-deps: only edgemask itself
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(ROOT)], capture_output=True, text=True, cwd=out)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = out.glob("edgemask-*.whl")
    return whl


def test_the_wheel_holds_exactly_the_documented_top_level_names(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert top == documented_top_level() == {"edgemask"}
    # every stage is inside, with its package data (the runner, the demo's configs)
    for stage in STAGES:
        assert f"edgemask/{stage}/__init__.py" in names
    assert "edgemask/trainer/algorithms/fedmask.py" in names
    assert any(n.startswith("edgemask/cli/configs/") and n.endswith(".toml") for n in names)
    assert any(n.startswith("edgemask/devices/remote/") for n in names)
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "edgemask = edgemask.cli.main:main" in z.read(meta).decode()


@pytest.mark.slow
def test_a_fresh_environment_with_edgemask_has_no_top_level_cli_or_export(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True)
    # -I: isolated (no current directory, no PYTHONPATH, no user site), run outside the checkout: only what was
    # installed is found. find_spec of a subpackage imports edgemask/__init__ (the ground's, which imports nothing)
    probe = ("import importlib.util as u, json; print(json.dumps({n: u.find_spec(n) is not None for n in "
             "['cli', 'export', 'trainer', 'devices', 'profiling', 'edgemask', 'edgemask.cli', 'edgemask.export', "
             "'edgemask.trainer', 'edgemask.devices', 'edgemask.profiling']}))")
    r = subprocess.run([str(py), "-I", "-c", probe], capture_output=True, text=True, cwd=tmp_path, check=True)
    found = __import__("json").loads(r.stdout)
    assert {n for n, ok in found.items() if ok} == {
        "edgemask", "edgemask.cli", "edgemask.export", "edgemask.trainer", "edgemask.devices", "edgemask.profiling"}
