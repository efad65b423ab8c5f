"""This machine as a device: argv through subprocess (no shell); device paths are local paths."""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

from edgemask.devices.connection_base import Connection, RunResult, Started
from edgemask.devices.errors import DeviceError, RunInterrupted, RunTimeout


class _LocalStarted(Started):
    """A local command in its own session, its stdin a pipe held by this process."""

    def __init__(self, argv: list[str]) -> None:
        try:
            self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
        except FileNotFoundError:
            raise DeviceError(f"local: no program {argv[0]!r}") from None
        self._buf = b""

    def read_line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass  # a broken pipe: the command is gone already
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            LocalConnection._kill(self.proc)


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

    def start(self, argv: list[str]) -> Started:
        return _LocalStarted(argv)

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
