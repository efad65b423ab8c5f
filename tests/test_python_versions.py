"""The Python versions edgemask installs on (issue #40): pyproject.toml's ``requires-python``, the versions
``scripts/env.sh`` accepts and the classifiers name the same set; every pin and extra resolves to wheels for each of
them (``pip install --dry-run`` against the package index, nothing installed), so a pin that drops a version fails
here and not on a user's machine; and env.sh picks the newest supported interpreter that runs, keeps an existing
environment, and refuses an unsupported one before anything is created or installed."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
ENV_SH = ROOT / "scripts" / "env.sh"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def admitted_versions() -> list[str]:
    """The CPython 3.x releases requires-python admits, e.g. ['3.11', '3.12', '3.13']."""
    spec = SpecifierSet(PROJECT["requires-python"])
    return [f"3.{m}" for m in range(0, 40) if Version(f"3.{m}") in spec]


SUPPORTED = admitted_versions()


def env_sh_versions() -> list[str]:
    (line,) = re.findall(r'^SUPPORTED="([^"]*)"$', ENV_SH.read_text(), flags=re.M)
    return line.split()


def test_requires_python_is_bounded_and_names_what_env_sh_and_the_classifiers_name():
    assert SUPPORTED and SUPPORTED[0] == "3.11", SUPPORTED
    assert max(Version(v) for v in SUPPORTED) < Version("3.39"), "requires-python has no upper bound"
    assert env_sh_versions() == SUPPORTED
    classified = [c.rsplit(" :: ", 1)[1] for c in PROJECT["classifiers"]
                  if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert classified == SUPPORTED


# --- every pin and extra resolves for each supported version ------------------------------------------------------

# manylinux_2_28 (glibc 2.28: Debian 10, RHEL 8 and newer) and every older manylinux tag: pip takes --platform
# literally and does not widen it, and most wheels name manylinux2014 / manylinux_2_17.
PLATFORMS = [f"manylinux_2_{m}_x86_64" for m in range(28, 4, -1)] + [
    "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
# Dependencies published only as an sdist: pip refuses sdists with --python-version, so their wheel is built here
# first. Pure Python, so the wheel built on this interpreter is the one any version gets.
# executorch -> hydra-core -> antlr4-python3-runtime==4.9.* (4.9.3, no wheel on PyPI).
SDIST_ONLY = ["antlr4-python3-runtime==4.9.*"]


def pinned_requirements() -> list[str]:
    """The base dependencies and every extra's, as pyproject.toml lists them."""
    reqs = list(PROJECT["dependencies"])
    for extra in PROJECT["optional-dependencies"].values():
        reqs += extra
    return reqs


@pytest.fixture(scope="module")
def sdist_wheels(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sdist-wheels")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), *SDIST_ONLY],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("version", SUPPORTED)
def test_every_pin_and_extra_resolves_to_wheels_for(version, sdist_wheels, tmp_path):
    reqs = pinned_requirements()
    report = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--report", str(report), "--python-version", version, "--implementation", "cp",
           "--only-binary=:all:", "--find-links", str(sdist_wheels)]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    r = subprocess.run(cmd + reqs, capture_output=True, text=True, cwd=tmp_path)
    errors = "\n".join(line for line in r.stderr.splitlines() if not line.startswith("WARNING: Location"))
    assert r.returncode == 0, f"the pinned set does not resolve for Python {version}:\n{errors[-4000:]}"
    resolved = {canonicalize_name(i["metadata"]["name"]): Version(i["metadata"]["version"]).public
                for i in json.loads(report.read_text())["install"]}
    for req in map(Requirement, reqs):
        (pin,) = [s.version for s in req.specifier if s.operator == "=="] or [None]
        if pin is not None:
            assert resolved.get(canonicalize_name(req.name)) == pin, (req, resolved.get(req.name))
    assert "ray" in resolved, "flwr[simulation] resolved without Ray"


# --- scripts/env.sh: which interpreter, against stand-in python3.x on a PATH of their own --------------------------

STANDIN = """#!/bin/sh
# a stand-in Python {version}: answers env.sh's version probe, makes a stand-in venv (a copy of itself), logs pip
case "$1 $2" in
  "-c "*) echo {version} ;;
  "-m venv") mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && echo "$0" > "$3/made-by" ;;
  "-m pip") echo "$*" >> "$(dirname "$0")/../pip-calls" ;;
  *) exit 2 ;;
esac
"""
# what a pyenv shim for a version that is not selected does
SHIM = """#!/bin/sh
echo "pyenv: $(basename "$0"): command not found" >&2
exit 127
"""


def standins(folder: Path, versions: dict[str, str | None]) -> Path:
    """python3.x and python3 in folder: a version string runs as that version, None is a failing pyenv shim.
    Every name env.sh tries gets one, so that the machine's own interpreters are shadowed."""
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"python{v}" for v in env_sh_versions()] + ["python3", "python3.10"]
    for name in names:
        v = versions.get(name)
        path = folder / name
        path.write_text(SHIM if v is None else STANDIN.format(version=v))
        path.chmod(0o755)
    return folder


def run_env_sh(tmp_path: Path, versions: dict[str, str | None], **env: str) -> subprocess.CompletedProcess:
    fake = standins(tmp_path / "bin", versions)
    full = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "EXTRAS": "test",
            "EDGEMASK_VENV": str(tmp_path / "venv"), **env}
    return subprocess.run(["bash", "-c", 'source "$1"; echo "PATH=$PATH"', "_", str(ENV_SH)],
                          env=full, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("versions, chosen", [
    # python3.13 is on the PATH but fails, as a pyenv shim does on this machine: 3.12 is the newest that runs
    ({"python3.12": "3.12.1", "python3.11": "3.11.7", "python3": "3.11.7"}, "python3.12"),
    # python3 is tried last, and taken when it is newer than every python3.x that runs
    ({"python3.11": "3.11.7", "python3": "3.13.0"}, "python3"),
    ({"python3": "3.13.0"}, "python3"),
])
def test_env_sh_takes_the_newest_supported_python_that_runs(tmp_path, versions, chosen):
    r = run_env_sh(tmp_path, versions)
    assert r.returncode == 0, r.stderr
    venv = tmp_path / "venv"
    assert (venv / "made-by").read_text().strip() == str(tmp_path / "bin" / chosen)
    said = r.stderr.splitlines()
    assert said[0] == (f"edgemask: creating {venv} with Python {versions[chosen]} "
                       f"({chosen}, the newest of 3.11, 3.12, 3.13 that runs here)")
    assert said[1].startswith("edgemask: installing into")
    calls = (venv / "pip-calls").read_text().splitlines()
    assert calls == ["-m pip install -q --upgrade pip", f"-m pip install -q -e {ROOT}[test]"]
    assert r.stdout.startswith(f"PATH={venv}/bin:")


@pytest.mark.parametrize("env, versions, says", [
    ({"PYTHON": "python3.10"}, {"python3.10": "3.10.13", "python3.13": "3.13.0"},
     "edgemask: PYTHON=python3.10 is Python 3.10.13; edgemask needs Python 3.11, 3.12 or 3.13"),
    ({"PYTHON": "python3.12"}, {"python3.11": "3.11.7"},
     "edgemask: PYTHON=python3.12 does not run; edgemask needs Python 3.11, 3.12 or 3.13"),
    ({}, {"python3": "3.10.13"},
     "edgemask: no Python 3.11, 3.12 or 3.13 runs here (tried python3.13, python3.12, python3.11, "
     "python3 (3.10.13)); install one, or set PYTHON="),
])
def test_env_sh_refuses_in_one_line_before_creating_or_installing(tmp_path, env, versions, says):
    r = run_env_sh(tmp_path, versions, **env)
    assert r.returncode != 0
    assert r.stderr.splitlines() == [says]
    assert not (tmp_path / "venv").exists()
    assert r.stdout == ""


def existing_venv(tmp_path: Path, version: str) -> Path:
    """A stand-in environment already installed for this pyproject.toml with the test extra."""
    venv = tmp_path / "venv"
    standins(venv / "bin", {})
    (venv / "bin" / "python").write_text(STANDIN.format(version=version))
    (venv / "bin" / "python").chmod(0o755)
    digest = subprocess.run(["sha256sum", str(ROOT / "pyproject.toml")], capture_output=True, text=True,
                            check=True).stdout.split()[0]
    (venv / ".edgemask-installed").write_text(f"{digest}\ntest\n")
    return venv


def test_env_sh_keeps_an_existing_environment_though_a_newer_python_runs(tmp_path):
    venv = existing_venv(tmp_path, "3.11.7")
    r = run_env_sh(tmp_path, {"python3.13": "3.13.0", "python3.11": "3.11.7"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines() == [f"edgemask: Python 3.11.7, in {venv}"]
    assert not (venv / "pip-calls").exists()
    assert r.stdout.startswith(f"PATH={venv}/bin:")


def test_env_sh_refuses_a_python_the_existing_environment_was_not_made_with(tmp_path):
    venv = existing_venv(tmp_path, "3.11.7")
    r = run_env_sh(tmp_path, {"python3.13": "3.13.0"}, PYTHON="python3.13")
    assert r.returncode != 0
    assert r.stderr.splitlines() == [
        f"edgemask: {venv} has Python 3.11.7, not PYTHON=python3.13's 3.13.0; remove {venv},"
        " or set EDGEMASK_VENV=DIR for a second environment"]
    assert not (venv / "pip-calls").exists()

