"""Fixtures that start the test fleet (see standin.py): an x86_64 and an aarch64 stand-in device.

Every fixture tears its devices down, on failure too; `standin.sweep()` first removes what a killed run
left behind. A machine that cannot host the fleet fails these tests with the reason (a skipped fleet would
hide a missing install step in CI).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "devices"))  # tests/devices/artifacts.py

from fleet.standin import PI4, FleetUnavailable, StandIn, aarch64_wheels, arm64_rootfs, require_host, sweep  # noqa: E402


def _start(tmp_path_factory: pytest.TempPathFactory, name: str, arch: str, **kw) -> StandIn:
    try:
        return StandIn.start(name, arch, tmp_path_factory.mktemp("fleet"), **kw)
    except FleetUnavailable as e:
        pytest.fail(f"the test fleet cannot run here: {e}")


@pytest.fixture(scope="session", autouse=False)
def fleet_clean():
    try:
        require_host()
    except FleetUnavailable as e:
        pytest.fail(f"the test fleet cannot run here: {e}")
    sweep()
    yield
    sweep()


@pytest.fixture(scope="session")
def x86_device(fleet_clean, tmp_path_factory):
    """A shared x86_64 stand-in: host sshd in a namespace, a quarter of a CPU, an emulated INA3221 (Jetson
    layout)."""
    dev = _start(tmp_path_factory, "x86-a", "x86_64", cores=0.25, sensor="ina3221")
    yield dev
    dev.teardown()


@pytest.fixture
def x86_fresh(fleet_clean, tmp_path_factory):
    """An x86_64 stand-in of its own, for tests that break its link or kill its server."""
    dev = _start(tmp_path_factory, "x86-f", "x86_64", cores=1.0, sensor="hwmon")
    yield dev
    dev.teardown()


@pytest.fixture(scope="session")
def aarch64_rootfs_dir(fleet_clean) -> Path:
    """The cached bookworm arm64 root filesystem with a Pi's runtimes (built on first use: ~20 minutes)."""
    try:
        require_host(aarch64=True)
    except FleetUnavailable as e:
        pytest.fail(f"the aarch64 stand-in cannot run here: {e}")
    return arm64_rootfs()


@pytest.fixture(scope="session")
def wheels_dir(fleet_clean) -> Path:
    """aarch64 / cp311 wheels of a Pi's runtimes (downloaded once into the fleet cache: 2.8 GB)."""
    return aarch64_wheels()


@pytest.fixture(scope="session")
def arm64_device(aarch64_rootfs_dir, tmp_path_factory):
    """A shared aarch64 stand-in (Raspberry Pi 4 profile): arm64 sshd, Python, numpy, onnxruntime, ai-edge-litert
    and ExecuTorch's runtime under qemu-user as a Cortex-A72, one CPU's worth of quota, an emulated INA226
    hwmon sensor."""
    dev = _start(tmp_path_factory, "pi-a", "aarch64", lower=aarch64_rootfs_dir, **PI4)
    yield dev
    dev.teardown()
