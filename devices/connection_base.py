"""The interface to a device: run a command, put a file, get a file, close.

Two implementations: :class:`edgemask.devices.connection_local.LocalConnection` (this machine) and
:class:`edgemask.devices.connection_ssh.SSHConnection` (SSH, paramiko);
:func:`edgemask.devices.connection.open_connection` picks one for a device. Nothing else in `devices` knows which one it
holds. Commands are argv lists, never shell strings: the SSH implementation quotes every argument for the remote shell.
"""

from __future__ import annotations

import abc
import threading
from dataclasses import dataclass
from pathlib import Path

from edgemask.devices.inventory import DeviceSpec


@dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr: str
    rc: int

    def tail(self, n: int = 400) -> str:
        """The end of stderr (else stdout), on one line, for error messages."""
        text = " ".join((self.stderr or self.stdout).split())
        return text[-n:]


class Started(abc.ABC):
    """A command left running on the device (``Connection.start``): it reads its stdin from this process, so it
    ends when :meth:`close` is called, when the connection drops and when this process dies."""

    @abc.abstractmethod
    def read_line(self, timeout: float) -> str | None:
        """The command's next line of stdout; None if none came within ``timeout`` seconds or it ended first."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """Still running, and its link still up."""

    @abc.abstractmethod
    def close(self) -> None:
        """Close its stdin (a command started with ``--watch-stdin`` exits then) and let it go."""


class Connection(abc.ABC):
    """A device reached one way or another. Lazy (nothing happens before the first call), context-managed."""

    def __init__(self, spec: DeviceSpec) -> None:
        self.spec = spec
        self.uploads = 0  # files sent by put(), for reports (and tests: deploy sends once)
        self.bytes_sent = 0
        # Set from another thread (Ctrl-C): the command running now is killed and run() raises RunInterrupted.
        self.cancel_event: threading.Event | None = None

    @abc.abstractmethod
    def run(self, argv: list[str], timeout: float = 60.0) -> RunResult:
        """Run argv on the device, wait at most ``timeout`` seconds; a non-zero rc is returned, not raised.

        The command dies with its session: on a timeout, on ``cancel_event`` and when this process dies, its
        stdin reaches end-of-file (a runner started with ``--watch-stdin`` exits then), and a local command's
        whole process group is killed."""

    def start(self, argv: list[str]) -> Started:
        """Start argv on the device and return at once; its stdin stays open until ``Started.close``."""
        raise NotImplementedError(f"{type(self).__name__} cannot leave a command running")

    def _cancelled(self) -> bool:
        return self.cancel_event is not None and self.cancel_event.is_set()

    @abc.abstractmethod
    def _put(self, local: Path, remote: str) -> None: ...

    @abc.abstractmethod
    def get(self, remote: str, local: Path) -> None:
        """Copy a device file to this machine."""

    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to ``remote`` on the device (the parent folder must exist). Not atomic:
        `devices.deploy` puts to a temporary name and renames."""
        local = Path(local)
        self._put(local, remote)
        self.uploads += 1
        self.bytes_sent += local.stat().st_size

    def close(self) -> None:
        """Release the connection; a later call reconnects."""

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
