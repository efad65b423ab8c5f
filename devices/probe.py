"""What a device offers, asked of the device itself (`edgemask devices list / check`)."""

from __future__ import annotations

from typing import Any

from devices.benchmark import parse_runner_output
from devices.connection import Connection, open_connection
from devices.deploy import deploy_runner
from devices.errors import DeviceError
from devices.inventory import FORMAT_RUNTIME, DeviceSpec
from devices.setup import missing_items


def probe(conn: Connection, spec: DeviceSpec, timeout: float = 120.0) -> dict[str, Any]:
    """Arch, OS, Python, numpy and runtime versions, free disk and memory, power sensors, governor, temperatures
    and throttling, as the device sees them (the runner's --probe mode, deployed like any file).

    Raises DeviceError when the device cannot be reached or its Python cannot run the probe.
    """
    runner = deploy_runner(conn, spec)
    res = conn.run([spec.python, runner, "--probe", "--watch-stdin"], timeout=timeout)
    try:
        info = parse_runner_output(res.stdout)
    except ValueError:
        raise DeviceError(f"{spec.name}: the probe gave no answer (rc={res.rc}: {res.tail()}); check `python` "
                          f"({spec.python!r}) on the device") from None
    info.pop("ok", None)
    installed = {rt for rt, version in info.get("runtimes", {}).items() if version}
    info["formats"] = sorted(fmt for fmt, rt in FORMAT_RUNTIME.items() if rt in installed and rt in spec.runtimes)
    info["reachable"] = True
    return info


def list_devices(inventory: dict[str, DeviceSpec]) -> list[dict[str, Any]]:
    """The inventory as rows for a table; connects to nothing."""
    rows = []
    for name in sorted(inventory):
        s = inventory[name]
        rows.append({
            "name": s.name, "kind": s.kind, "address": s.address, "python": s.python, "workdir": s.workdir,
            "runtimes": ",".join(s.runtimes), "power_sensor": s.power_sensor,
            "host_keys": "trust on first use" if s.trust_on_first_use else ("-" if s.is_local else "known_hosts"),
        })
    return rows


def check_device(spec: DeviceSpec) -> dict[str, Any]:
    """Connect and probe one device. Never raises for an unreachable device: ``reachable`` False and ``error``."""
    row: dict[str, Any] = {"name": spec.name, "kind": spec.kind, "address": spec.address}
    try:
        with open_connection(spec) as conn:
            row.update(probe(conn, spec))
        row["missing"] = missing_items(spec, row)  # what `devices setup` (or the fix given) still has to do
    except DeviceError as e:
        row.update(reachable=False, error=str(e))
    profile = spec.profile
    row["max_onnx_opset"] = profile.max_onnx_opset
    return row
