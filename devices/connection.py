"""One small interface to a device: run a command, put a file, get a file, close.

`LocalConnection` runs on this machine; `devices.connection_ssh.SSHConnection` runs over SSH (paramiko).
Nothing else in `devices` knows which one it holds. Commands are argv lists, never shell strings: the SSH
implementation quotes every argument for the remote shell.
"""

from __future__ import annotations

import abc
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from devices.errors import DeviceError, RunInterrupted, RunTimeout
from devices.inventory import DeviceSpec


@dataclass(frozen=True)
class RunResult:
    stdout: str
    stderr: str
    rc: int

    def tail(self, n: int = 400) -> str:
        """The end of stderr (else stdout), on one line, for error messages."""
        text = " ".join((self.stderr or self.stdout).split())
        return text[-n:]


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


class LocalConnection(Connection):
    """This machine: argv through subprocess (no shell); device paths are local paths."""

    def run(self, argv: list[str], timeout: float = 60.0) -> RunResult:
        # Its own session: a Ctrl-C on the terminal reaches this process only, which decides what to stop. Its
        # stdin is a pipe this process holds open until the command ends: if this process dies, it closes.
        stdin_r, stdin_w = os.pipe()
        try:
            p = subprocess.Popen(list(argv), stdin=stdin_r, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, errors="replace", start_new_session=True)
        except FileNotFoundError:
            os.close(stdin_w)
            raise DeviceError(f"local: no program {argv[0]!r}; set `python` of device {self.spec.name!r} "
                              "to an existing interpreter") from None
        finally:
            os.close(stdin_r)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    out, err = p.communicate(timeout=max(0.0, min(0.2, deadline - time.monotonic())))
                    break
                except subprocess.TimeoutExpired:
                    if self._cancelled():
                        raise RunInterrupted(f"local: {argv[0]} was interrupted") from None
                    if time.monotonic() >= deadline:
                        raise RunTimeout(f"local: {argv[0]} ran past {timeout:g} s; raise the timeout or check "
                                         "the job") from None
        except BaseException:
            if p.returncode is None:
                self._kill(p)
            raise
        finally:
            os.close(stdin_w)
        return RunResult(out, err, p.returncode)

    @staticmethod
    def _kill(p: subprocess.Popen) -> None:
        """Kill the command's whole process group (what it started too) and reap it."""
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # gone already
        p.communicate()

    def _put(self, local: Path, remote: str) -> None:
        try:
            shutil.copyfile(local, remote)
        except OSError as e:
            raise DeviceError(f"local: cannot copy {local} to {remote}: {e.strerror}") from None

    def get(self, remote: str, local: Path) -> None:
        try:
            shutil.copyfile(remote, local)
        except OSError as e:
            raise DeviceError(f"local: cannot copy {remote} to {local}: {e.strerror}") from None


def open_connection(spec: DeviceSpec, **options: float) -> Connection:
    """The connection for ``spec``: local, or SSH (options: retries, backoff_s, keepalive_s)."""
    if spec.is_local:
        return LocalConnection(spec)
    from devices.connection_ssh import SSHConnection  # the only module that imports paramiko

    return SSHConnection(spec, **options)
