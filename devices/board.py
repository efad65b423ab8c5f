"""What a campaign does to a board around its jobs: no stray runner, the inventory's clocks, then put back.

- ``reap_strays``: benchmark runners of this device's workdir that outlived their session (an SSH timeout on an
  old runner without the watchdog, a host killed mid-job) time beside every later job; they are found by the
  runner's ``--strays`` mode (same user, a runner deployed in this workdir's ``blobs/``, a ``--model`` run)
  and killed before timing. One campaign per board at a time: a second campaign's runner in the same workdir
  would be taken for a stray (and would load the board anyway).
- ``apply`` / ``restore``: the inventory's ``governor`` and ``jetson_clocks`` (see ``devices.inventory``), set
  by the runner on the device (sysfs, or ``sudo -n`` where the user is not root) and read back, so what is
  recorded is the state actually set; ``restore`` puts back the governors found before and the clocks stored
  by ``jetson_clocks --store``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from devices.benchmark import parse_runner_output
from devices.connection import Connection
from devices.deploy import deploy_runner, remote_path
from devices.errors import DeviceError
from devices.inventory import DeviceSpec

JETSON_CLOCKS_STATE = "jetson_clocks.conf"  # in the device's workdir: the clocks found before the campaign


class SettingsRefused(DeviceError):
    """The board did not let us set what the inventory asks (no root, `sudo -n` refused): the message says
    which sudoers line to add, or which inventory field to remove."""


def _runner(conn: Connection, spec: DeviceSpec, *args: str, timeout: float = 120.0) -> dict[str, Any]:
    runner = deploy_runner(conn, spec)
    res = conn.run([spec.python, runner, *args, "--watch-stdin"], timeout=timeout)
    try:
        return parse_runner_output(res.stdout)
    except ValueError:
        raise DeviceError(f"{spec.name}: the runner gave no answer to {args[0]} (rc={res.rc}: {res.tail()})") \
            from None


def reap_strays(conn: Connection, spec: DeviceSpec) -> list[dict[str, Any]]:
    """Kill our runners left on the board; return [{"pid", "age_s", "argv", "killed"}] of those found."""
    doc = _runner(conn, spec, "--strays")
    found = doc.get("found", [])
    alive = [p for p in found if not p.get("killed")]
    if alive:
        raise DeviceError(f"{spec.name}: stray runner(s) pid {', '.join(str(p['pid']) for p in alive)} survived "
                          "SIGKILL; check the board before timing on it")
    return found


def _sudoers_hint(spec: DeviceSpec, command: str) -> str:
    return (f"allow it with the sudoers line `{spec.user or 'USER'} ALL=(root) NOPASSWD: {command}` "
            f"(`sudo visudo -f /etc/sudoers.d/edgemask` on the device), or remove the field from "
            f"[devices.{spec.name}] in the inventory")


def _set_governors(conn: Connection, spec: DeviceSpec, wanted: Mapping[str, str]) -> dict[str, Any]:
    """Set them; when the board refuses any, put back the ones already changed and raise SettingsRefused."""
    doc = _runner(conn, spec, "--set-governors", json.dumps(dict(wanted)))
    if not doc.get("ok"):
        changed = {cpu: gov for cpu, gov in doc.get("before", {}).items() if doc.get("after", {}).get(cpu) != gov}
        if changed:
            _runner(conn, spec, "--set-governors", json.dumps(changed))
        why = doc.get("error") or "the runner did not say why"
        hint = _sudoers_hint(spec, doc.get("sudoers", "")) if doc.get("denied") else "fix the inventory's governor"
        raise SettingsRefused(f"{spec.name}: cannot set the CPU governor ({why}); {hint}")
    return doc


def _jetson_clocks(conn: Connection, spec: DeviceSpec, action: str) -> dict[str, Any]:
    state = remote_path(spec, JETSON_CLOCKS_STATE)
    doc = _runner(conn, spec, "--jetson-clocks", action, "--state-file", state)
    if not doc.get("ok"):
        raise SettingsRefused(f"{spec.name}: jetson_clocks {action} failed ({doc.get('error')}); "
                              + _sudoers_hint(spec, "/usr/bin/jetson_clocks"))
    return doc


def apply(conn: Connection, spec: DeviceSpec) -> dict[str, Any] | None:
    """Set the inventory's governor / jetson_clocks. None when it asks for neither.

    Returns {"requested", "before", "actual"}, each {"governor": {cpu: name}, "jetson_clocks": bool}: "actual"
    is read back from the board. Raises SettingsRefused (after putting back what it changed) when refused.
    """
    if spec.governor is None and not spec.jetson_clocks:
        return None
    requested: dict[str, Any] = {}
    before: dict[str, Any] = {}
    actual: dict[str, Any] = {}
    if spec.jetson_clocks:
        _jetson_clocks(conn, spec, "store")
        shown = _jetson_clocks(conn, spec, "apply").get("show")
        requested["jetson_clocks"], before["jetson_clocks"], actual["jetson_clocks"] = True, False, True
        actual["jetson_clocks_show"] = shown
    if spec.governor is not None:
        try:
            doc = _set_governors(conn, spec, {"*": spec.governor})
        except DeviceError:
            if spec.jetson_clocks:
                _jetson_clocks(conn, spec, "restore")
            raise
        requested["governor"] = {cpu: spec.governor for cpu in doc["before"]}
        before["governor"], actual["governor"] = doc["before"], doc["after"]
    return {"requested": requested, "before": before, "actual": actual}


def restore(conn: Connection, spec: DeviceSpec, applied: Mapping[str, Any]) -> dict[str, Any]:
    """Put back ``applied["before"]``; return the state read back afterwards (same keys)."""
    before = applied.get("before", {})
    out: dict[str, Any] = {}
    if before.get("governor"):
        out["governor"] = _set_governors(conn, spec, before["governor"])["after"]
    if "jetson_clocks" in before:
        _jetson_clocks(conn, spec, "restore")
        out["jetson_clocks"] = before["jetson_clocks"]
    return out


class _Board:
    """The hooks ``profiling.campaign`` calls (its ``BoardHooks`` interface)."""

    reap_strays = staticmethod(reap_strays)
    apply = staticmethod(apply)
    restore = staticmethod(restore)


BOARD = _Board()
