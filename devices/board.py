"""What a campaign does to a board around its jobs: no stray runner, the inventory's clocks, then put back.

- ``hold``: one campaign holds a board at a time (issue 27 item 6). The lock is on the board itself, so two hosts
  cannot share it either: ``<workdir>/board.lock``, flocked by a small runner process (``--hold-lock``) that the
  campaign starts over its own connection and keeps reading its stdin. It ends with the campaign's session: when
  the campaign ends, is killed (even ``kill -9``: the pipe or the SSH channel closes) or loses its link, the
  runner's watchdog sees EOF and exits, and the kernel drops the lock. The holder's identity (host, pid,
  campaign, since, a random token) is written in the file, so a second campaign is refused naming it, or waits.
- ``reap_strays``: benchmark runners of this device's workdir that outlived their session (an SSH timeout on an
  old runner without the watchdog, a host killed mid-job) time beside every later job; they are found by the
  runner's ``--strays`` mode (same user, a runner deployed in this workdir's ``blobs/``, a ``--model`` run)
  and killed before timing. Given the campaign's hold, the runner kills only while that lock is held with the
  hold's token, so another campaign's runner is never taken for a stray.
- ``apply`` / ``restore``: the inventory's ``governor`` and ``jetson_clocks`` (see ``devices.inventory``), set
  by the runner on the device (sysfs, or ``sudo -n`` where the user is not root) and read back, so what is
  recorded is the state actually set; ``restore`` puts back the governors found before and the clocks stored
  by ``jetson_clocks --store``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from edgemask.devices.benchmark import parse_runner_output
from edgemask.devices.connection import Connection
from edgemask.devices.connection_base import Started
from edgemask.devices.deploy import deploy_runner, remote_path
from edgemask.devices.errors import BoardBusy, DeviceError
from edgemask.devices.inventory import DeviceSpec

JETSON_CLOCKS_STATE = "jetson_clocks.conf"  # in the device's workdir: the clocks found before the campaign
BOARD_LOCK = "board.lock"  # in the device's workdir: flocked by the campaign that holds the board
LOCK_ANSWER_S = 60.0  # how long the lock runner may take to say whether it took the lock
LOCK_POLL_S = 1.0  # --wait: how often a waiting campaign tries again


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


def describe_holder(holder: Mapping[str, Any]) -> str:
    if not holder.get("campaign"):
        return "another edgemask campaign (it is writing its name this instant)"
    return (f"campaign {holder.get('campaign')!r} of host {holder.get('host')} pid {holder.get('pid')} "
            f"since {holder.get('since')}")


class BoardHold:
    """A board held for one campaign: the lock runner left running on the board, and who holds it."""

    def __init__(self, started: Started, holder: Mapping[str, Any], path: str) -> None:
        self.started, self.holder, self.path = started, dict(holder), path

    @property
    def token(self) -> str:
        return str(self.holder.get("token"))

    def alive(self) -> bool:
        """False once the lock runner ended or its link dropped: the board may be someone else's by now."""
        return self.started.alive()

    def release(self) -> None:
        self.started.close()


def hold(conn: Connection, spec: DeviceSpec, holder: Mapping[str, Any], wait_s: float = 0.0,
         on_wait: Callable[[str], None] | None = None) -> BoardHold:
    """Take ``spec``'s board for the campaign ``holder`` names, over ``conn`` (keep that connection open for as
    long as the campaign runs: the hold ends with it).

    Another campaign holding it: try again every LOCK_POLL_S for up to ``wait_s`` seconds, telling ``on_wait``
    who holds it and how long is left, then raise BoardBusy naming the holder and the lock file."""
    runner = deploy_runner(conn, spec)
    path = remote_path(spec, BOARD_LOCK)
    deadline = time.monotonic() + wait_s
    while True:
        started = conn.start([spec.python, runner, "--hold-lock", path, "--holder",
                              json.dumps(dict(holder), sort_keys=True), "--watch-stdin"])
        line = started.read_line(LOCK_ANSWER_S)
        try:
            doc = parse_runner_output(line or "")
        except ValueError:
            started.close()
            raise DeviceError(f"{spec.name}: the runner gave no answer to --hold-lock {path}; check that the "
                              f"device's workdir {spec.workdir!r} is writable") from None
        if doc.get("ok"):
            return BoardHold(started, doc.get("holder") or holder, path)
        started.close()
        if not doc.get("busy"):
            raise DeviceError(f"{spec.name}: cannot take the board lock {path}: {doc.get('error')}")
        other = describe_holder(doc.get("holder") or {})
        left = deadline - time.monotonic()
        if left <= 0:
            waited = f"still held after waiting {wait_s:g} s" if wait_s > 0 else "wait for it with --wait SECONDS"
            raise BoardBusy(f"{spec.name}: board held by {other} (lock {path} on the board); {waited}, or stop "
                            "that campaign")
        if on_wait is not None:
            on_wait(f"{spec.name}: held by {other}; waiting, {left:.0f} s left")
        time.sleep(min(LOCK_POLL_S, left))


def reap_strays(conn: Connection, spec: DeviceSpec, hold: BoardHold | None = None) -> list[dict[str, Any]]:
    """Kill our runners left on the board; return [{"pid", "age_s", "argv", "killed"}] of those found.

    With ``hold``, the runner kills nothing unless the board lock is held with its token (DeviceError then)."""
    args = ["--strays"] + (["--lock", hold.path, "--token", hold.token] if hold is not None else [])
    doc = _runner(conn, spec, *args)
    if not doc.get("ok"):
        raise DeviceError(f"{spec.name}: stray runners not reaped: {doc.get('error')}")
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

    locks_boards = True
    hold = staticmethod(hold)
    reap_strays = staticmethod(reap_strays)
    apply = staticmethod(apply)
    restore = staticmethod(restore)


BOARD = _Board()
