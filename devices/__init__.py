"""devices: the SSH harness. An inventory of boards, one connection interface (local and SSH), content-addressed
deploy, a self-contained remote runner, power sensors, and one benchmark job -> one Measurement.

Knows none of the other stages: it moves files and runs the runner. Artifact manifests are read with the shared,
torch-free ``edgemask.manifest``.
"""

from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.connection import Connection, LocalConnection, RunResult, open_connection
from edgemask.devices.deploy import deploy, deploy_many, deploy_runner, remote_path
from edgemask.devices.errors import DeviceError, HostKeyError, RunTimeout
from edgemask.devices.inventory import KIND_PROFILES, DeviceSpec, KindProfile, load_inventory, local_device
from edgemask.devices.probe import check_device, list_devices, probe
from edgemask.devices.records import Measurement, RunnerSettings
from edgemask.devices.setup import packages_for, setup_device

__all__ = [
    "Connection", "DeviceError", "DeviceSpec", "HostKeyError", "KIND_PROFILES", "KindProfile", "LocalConnection",
    "Measurement", "RunResult", "RunTimeout", "RunnerSettings", "check_device", "deploy", "deploy_many", "deploy_runner",
    "list_devices", "load_inventory", "local_device", "open_connection", "packages_for", "probe",
    "remote_path", "run_benchmark", "setup_device",
]
