"""Provisioning plans and the `missing` list of `devices check` (pure parts; the real setup runs on the aarch64
stand-in in tests/fleet/test_fleet_arm64.py)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from edgemask.devices.errors import DeviceError
from edgemask.devices.inventory import DeviceSpec
from edgemask.devices.setup import missing_items, packages_for, pip_installs, satisfies, setup_device, venv_python


def board(kind: str, runtimes: tuple[str, ...], **kw) -> DeviceSpec:
    return DeviceSpec(name="b1", kind=kind, host="10.0.0.9", user="pi", workdir="edgemask", runtimes=runtimes, **kw)


@pytest.mark.parametrize("version, req, ok", [
    ("1.26.4", "numpy<2", True), ("2.0.0", "numpy<2", False), ("2.4.6", "numpy", True), (None, "numpy", False),
    ("1.10.0", "onnxruntime==1.10.0", True), ("1.10", "onnxruntime==1.10.0", True),
    ("1.31.1", "onnxruntime==1.10.0", False), ("1.19.5", "numpy>=1.19", True), ("1.18.5", "numpy>=1.19", False),
    ("2.14.0+rpi", "tflite-runtime<=2.14", True),
])
def test_satisfies(version, req, ok):
    assert satisfies(version, req) is ok


def test_a_pi_with_tflite_gets_tflite_runtime_and_numpy_below_2():
    reqs = [p.requirement for p in packages_for(board("rpi4", ("onnxruntime", "tflite")))]
    assert reqs == ["numpy<2", "onnxruntime", "tflite-runtime"]


def test_a_pi_with_executorch_gets_ai_edge_litert_for_tflite_and_numpy_2():
    pkgs = packages_for(board("rpi4", ("onnxruntime", "tflite", "executorch")))
    assert [p.requirement for p in pkgs] == ["numpy", "onnxruntime", "ai-edge-litert", "executorch==1.5.1"]
    assert [p.module for p in pkgs] == ["numpy", "onnxruntime", "ai_edge_litert", "executorch.runtime"]


def test_executorch_is_installed_without_its_export_time_dependencies():
    # `pip install executorch` wants coremltools==9.0, which has no aarch64 wheel: the wheel goes in with
    # --no-deps, after what its runtime imports (the torch its _portable_lib links, flatbuffers, ruamel.yaml,
    # tabulate) is installed with their own dependencies
    pkgs = packages_for(board("rpi4", ("onnxruntime", "tflite", "executorch")))
    assert pip_installs(pkgs) == [
        ["numpy", "onnxruntime", "ai-edge-litert", "torch==2.13.0", "flatbuffers", "ruamel.yaml", "tabulate"],
        ["--no-deps", "executorch==1.5.1"],
    ]
    assert pip_installs(packages_for(board("rpi4", ("onnxruntime", "tflite")))) == [
        ["numpy<2", "onnxruntime", "tflite-runtime"]]  # nothing without its dependencies: one pip call


def _shell_list(text: str, name: str) -> list[str]:
    """The lines of ``NAME="..."`` in a shell script."""
    start = text.index(f'\n{name}="') + len(name) + 3
    return text[start:text.index('"', start)].split()


def test_the_fleet_pi_gets_the_wheels_setup_installs_on_a_pi():
    # tests/fleet/fetch-wheels.sh pins the versions the arm64 stand-in is provisioned with (its root filesystem
    # runs the same two pip calls); they must be the requirements setup gives a Pi, by name and split
    script = (Path(__file__).resolve().parents[1] / "fleet" / "fetch-wheels.sh").read_text()
    fleet = [_shell_list(script, "REQS"), ["--no-deps", *_shell_list(script, "NODEPS")]]
    setup = pip_installs(packages_for(board("rpi4", ("onnxruntime", "tflite", "executorch"))))

    def names(reqs):
        return [re.split(r"[<>=]", r)[0] for r in reqs]

    assert [names(r) for r in fleet] == [names(r) for r in setup]
    pinned = {r for reqs in setup for r in reqs if "==" in r}  # setup's own pins are the fleet's versions
    assert pinned == {"torch==2.13.0", "executorch==1.5.1"} and pinned <= {r for reqs in fleet for r in reqs}


def test_a_tx2_gets_the_last_python_36_builds_and_nothing_it_cannot_run():
    spec = board("jetson-tx2", ("onnxruntime", "tflite"))
    assert [p.requirement for p in packages_for(spec)] == ["numpy==1.19.5", "onnxruntime==1.10.0"]
    items = missing_items(spec, {"numpy": "1.19.5", "runtimes": {"onnxruntime": "onnxruntime 1.10.0"}})
    assert [i["what"] for i in items] == ["tflite"]
    assert "remove 'tflite' from runtimes of [devices.b1]" in items[0]["fix"]


def test_missing_names_each_runtime_and_the_fix():
    spec = board("rpi4", ("onnxruntime", "tflite"))
    probe = {"numpy": "2.4.6", "python_executable": "/usr/bin/python3",
             "runtimes": {"onnxruntime": "onnxruntime 1.31.1", "tflite": None, "executorch": None}}
    items = {i["what"]: i for i in missing_items(spec, probe)}
    assert set(items) == {"numpy", "tflite", "python"}  # numpy 2.4.6 breaks tflite-runtime; onnxruntime is fine
    assert "does not meet numpy<2" in items["numpy"]["why"]
    assert items["tflite"]["fix"].startswith("edgemask devices setup b1")
    assert "python3 -m pip install 'tflite-runtime'" in items["tflite"]["fix"]
    assert f'set python = "{venv_python(spec)}"' in items["python"]["fix"]


def test_nothing_missing_on_a_set_up_board():
    spec = board("rpi4", ("onnxruntime",))
    spec = replace(spec, python=venv_python(spec))
    assert venv_python(spec) == "edgemask/venv/bin/python"
    assert missing_items(spec, {"numpy": "2.4.6", "runtimes": {"onnxruntime": "onnxruntime 1.31.1"}}) == []


def test_either_tflite_package_counts():
    spec = board("linux", ("tflite",))
    assert missing_items(spec, {"numpy": "2.4.6", "runtimes": {"tflite": "tflite_runtime 2.14.0"}}) == []


def test_setup_refuses_the_local_device(tmp_path):
    from edgemask.devices.inventory import local_device

    with pytest.raises(DeviceError, match="pip install"):
        setup_device(local_device(tmp_path))


def test_cli_setup_needs_a_name_and_refuses_local(tmp_path, capsys):
    from edgemask.cli.main import main

    ws = str(tmp_path / "ws")
    assert main(["devices", "setup", "--workspace", ws]) == 2
    assert "name the device(s) to set up" in capsys.readouterr().err
    assert main(["devices", "setup", "local", "--workspace", ws]) == 2
    assert "local device uses this machine's Python" in capsys.readouterr().err
    assert main(["devices", "setup", "nope", "--workspace", ws]) == 2
    assert "unknown device 'nope'; valid names: local" in capsys.readouterr().err


def test_a_pi_gets_torch_from_pytorchs_cpu_index_first():
    # PyPI's aarch64 torch is the CUDA build (+2.8 GB of CUDA wheels): torch alone, first, from the CPU index
    spec = board("rpi4", ("onnxruntime", "tflite", "executorch"))
    from edgemask.devices.setup import install_commands

    assert install_commands(spec, packages_for(spec)) == [
        ["--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0"],
        ["numpy", "onnxruntime", "ai-edge-litert", "flatbuffers", "ruamel.yaml", "tabulate"],
        ["--no-deps", "executorch==1.5.1"],
    ]
    mirror = replace(spec, torch_index="http://mirror.lan/whl/cpu")  # the inventory's torch_index / --torch-index
    assert install_commands(mirror, packages_for(mirror))[0][:2] == ["--index-url", "http://mirror.lan/whl/cpu"]
    # uploaded wheels (--wheels DIR): the folder decides, one index-free plan as before
    assert install_commands(spec, packages_for(spec), from_wheels=True) == pip_installs(packages_for(spec))
    no_torch = board("rpi4", ("onnxruntime", "tflite"))
    assert install_commands(no_torch, packages_for(no_torch)) == pip_installs(packages_for(no_torch))


def test_a_tx2_without_trtexec_is_told_how_to_get_it():
    tx2 = board("jetson-tx2", ("onnxruntime", "tensorrt"), python="/home/pi/edgemask/venv/bin/python")
    info = {"python_executable": tx2.python, "numpy": "1.19.5", "runtimes": {"onnxruntime": "onnxruntime 1.10.0"},
            "tensorrt": {"trtexec": None, "trtexec_version": None}}
    items = missing_items(replace(tx2, workdir="/home/pi/edgemask"), info)
    assert [i["what"] for i in items] == ["tensorrt"]
    assert "no working trtexec at /usr/src/tensorrt/bin/trtexec" in items[0]["why"]
    info["tensorrt"] = {"trtexec": "/usr/src/tensorrt/bin/trtexec", "trtexec_version": "8.2.1"}
    assert missing_items(replace(tx2, workdir="/home/pi/edgemask"), info) == []


class _PipRecorder:
    """A unit-test fake of one Connection for setup_device alone: a Pi with a working venv and nothing installed,
    whose pip fails (no route out); it records the commands. (The fleet's stand-ins share this machine's
    pip.conf, whose local wheel folders would satisfy torch from anywhere: a real board cannot show the index
    setup asks for there.)"""

    uploads = 0

    def __init__(self):
        self.argvs: list[list[str]] = []

    def run(self, argv, timeout=None):
        from edgemask.devices.connection_base import RunResult

        self.argvs.append(list(argv))
        if argv[1:3] == ["-m", "pip"] and "install" in argv:
            return RunResult("", "ERROR: Could not find a version that satisfies the requirement", 1)
        if argv[1:2] == ["-c"] and "importlib" in argv[2]:
            return RunResult('{"versions": {}, "errors": {}}\n', "", 0)
        return RunResult("", "", 0)

    def close(self):
        pass


def test_setup_on_a_pi_asks_pytorchs_cpu_index_first_and_says_so_when_it_cannot():
    conn = _PipRecorder()
    with pytest.raises(DeviceError) as e:
        setup_device(board("rpi4", ("onnxruntime", "executorch")), conn=conn)
    pips = [a for a in conn.argvs if "install" in a]
    assert len(pips) == 1 and pips[0][-3:] == ["--index-url", "https://download.pytorch.org/whl/cpu", "torch==2.13.0"]
    msg = str(e.value)
    assert msg.startswith("b1: pip could not install torch==2.13.0 from https://download.pytorch.org/whl/cpu (")
    assert "pip download --index-url https://download.pytorch.org/whl/cpu --only-binary=:all:" in msg
    assert "edgemask devices setup b1 --wheels WHEELS" in msg
