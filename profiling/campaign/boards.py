"""What a campaign does to a board around its jobs: the hooks' interface (:class:`BoardHooks`; the real ones are
``devices.board.BOARD``) and the board lock one campaign holds for its whole run (:class:`BoardLock`,
:func:`take_boards`): one campaign measures on a board at a time."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from edgemask.profiling.records import CampaignConfig

Connect = Callable[[Any], contextlib.AbstractContextManager[Any]]


class BoardHooks:
    """What a campaign does to a board around its jobs; the default does nothing (injected benchmarks, tests).

    ``devices.board.BOARD`` is the real one: it holds the board for the campaign (a lock on the board), finds
    and kills stray runners before timing, applies the inventory's governor / jetson_clocks and restores the
    board's previous settings afterwards."""

    locks_boards = False  # True: hold() takes a lock on the board (over a connection of its own)

    def hold(self, conn: Any, spec: Any, holder: Mapping[str, Any], wait_s: float = 0.0,
             on_wait: Callable[[str], None] | None = None) -> Any:
        """Take the board for this campaign over ``conn``; return the hold (``alive()``, ``release()``), or None
        where boards are not locked. Raises ``BoardBusy`` naming the holder when another campaign has it."""
        return None

    def reap_strays(self, conn: Any, spec: Any, hold: Any = None) -> list[dict[str, Any]]:
        """Kill runners of ours left on the board (an earlier run's); return what was found. Given the
        campaign's hold, nothing is killed unless that hold is the board's lock holder."""
        return []

    def apply(self, conn: Any, spec: Any) -> dict[str, Any] | None:
        """Set the board up for timing; return what to restore (None: nothing was changed)."""
        return None

    def restore(self, conn: Any, spec: Any, applied: Mapping[str, Any]) -> dict[str, Any]:
        return {}


class BoardLock:
    """One device's board lock for this campaign: its own connection (a job's link fault never drops it) and the
    hold taken over it."""

    def __init__(self, connect: Connect, spec: Any, holder: Mapping[str, Any]) -> None:
        self.connect, self.spec, self.holder = connect, spec, holder
        self._stack = contextlib.ExitStack()
        self._conn: Any = None
        self.hold: Any = None

    def take(self, board: BoardHooks, wait_s: float = 0.0, on_wait: Callable[[str], None] | None = None) -> bool:
        """Hold the board unless held already; True when it was taken now. A link fault raises (retry_on)."""
        if self.hold is not None and self.hold.alive():
            return False
        if self.hold is not None:
            self.hold.release()
            self.hold = None
        if self._conn is None:
            self._conn = self._stack.enter_context(self.connect(self.spec))
        self.hold = board.hold(self._conn, self.spec, self.holder, wait_s, on_wait)
        return self.hold is not None

    def release(self) -> None:
        try:
            if self.hold is not None:
                self.hold.release()
        finally:
            self.hold = None
            self._stack.close()


def holder_identity(campaign: str) -> dict[str, Any]:
    """Who takes a board: this host, this process, the campaign, since when, and a token only it knows."""
    import os
    import secrets
    import socket
    from datetime import datetime, timezone

    return {"host": socket.gethostname(), "pid": os.getpid(), "campaign": campaign,
            "since": datetime.now(timezone.utc).isoformat(timespec="seconds"), "token": secrets.token_hex(8)}


def take_boards(config: CampaignConfig, inventory: Mapping[str, Any], board: BoardHooks, connect: Connect,
                retry_on: tuple[type[BaseException], ...], wait_s: float,
                on_wait: Callable[[str], None] | None) -> dict[str, BoardLock]:
    """Hold every board of the campaign before any job starts, one after another (each waits up to ``wait_s``).

    A board another campaign holds: everything taken so far is let go and BoardBusy (one line, naming the holder)
    ends the campaign before it measures anything. A board that cannot be reached now is taken by its worker
    when it first reaches it."""
    locks: dict[str, BoardLock] = {}
    if not getattr(board, "locks_boards", False):
        return locks
    holder = holder_identity(config.name)
    try:
        for device in config.devices:
            locks[device] = lock = BoardLock(connect, inventory[device], holder)
            try:
                lock.take(board, wait_s, on_wait)
            except retry_on:
                pass  # unreachable now: its worker retries like any link fault
    except BaseException:
        for lock in locks.values():
            lock.release()
        raise
    return locks
