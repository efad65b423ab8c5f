"""SSH connection (paramiko): the only module of `devices` that imports paramiko.

Host keys are checked against the device's known_hosts file; an unknown key is refused unless the inventory
says `trust_on_first_use = true`, and then it is written to that file. A changed key is always refused.
Authentication uses the key file or the SSH agent, never a password. Connecting is retried a few times with
jittered exponential backoff; authentication and host-key failures are not retried. Every paramiko error
leaves as a DeviceError naming the host and what to do.
"""

from __future__ import annotations

import random
import shlex
import time
from pathlib import Path

import paramiko

from edgemask.devices.connection_base import Connection, RunResult, Started
from edgemask.devices.errors import DeviceError, HostKeyError, RunInterrupted, RunTimeout
from edgemask.devices.inventory import DeviceSpec


def quote_argv(argv: list[str]) -> str:
    """argv -> one command line for the remote POSIX shell, each argument quoted (nothing expands)."""
    return " ".join(shlex.quote(str(a)) for a in argv)


def known_hosts_name(host: str, port: int) -> str:
    """The name OpenSSH (and paramiko) file a host key under."""
    return host if port == 22 else f"[{host}]:{port}"


def _transport_dies(transport: paramiko.Transport, within_s: float = 1.0) -> bool:
    """True when the transport is (or within ``within_s`` becomes) inactive: paramiko closes a dead link's
    channels a moment before it marks the transport inactive."""
    deadline = time.monotonic() + within_s
    while transport.is_active():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# After the exit status, how long to wait for the end of output (EOF) while no more data comes: a command that left
# a background child holding its stdout open never sends EOF.
EOF_GRACE_S = 2.0


class OutputDrain:
    """A running command's stdout and stderr, read together (a full stderr window must not stall stdout).

    :meth:`done` is True once the exit status has arrived *and* the server sent EOF after the last byte, or no
    byte came for ``eof_grace_s`` after the exit status. The exit status alone is not the end: sshd may send it
    while output is still on its way, and a pause in the arrivals then cut the output short (under load, 3 MB of
    stdout lost 18 KB that way)."""

    def __init__(self, chan: paramiko.Channel, eof_grace_s: float = EOF_GRACE_S, idle_s: float = 0.005) -> None:
        self.chan, self.eof_grace_s, self.idle_s = chan, eof_grace_s, idle_s
        self.out: list[bytes] = []
        self.err: list[bytes] = []
        self._last = time.monotonic()  # when a byte last arrived

    def done(self) -> bool:
        """Read what has arrived; True when the output is complete (sleeps ``idle_s`` when nothing came)."""
        chan, busy = self.chan, False
        while chan.recv_ready():
            self.out.append(chan.recv(1 << 16))
            busy = True
        while chan.recv_stderr_ready():
            self.err.append(chan.recv_stderr(1 << 16))
            busy = True
        now = time.monotonic()
        if busy:
            self._last = now
        elif chan.exit_status_ready() and (chan.eof_received or now - self._last > self.eof_grace_s):
            return True
        else:
            time.sleep(self.idle_s)
        return False


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(f"unknown host key for {hostname}")
        self.hostname = hostname
        self.key = key


class _RefuseUnknown(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(hostname, key)


class _TrustOnFirstUse(paramiko.MissingHostKeyPolicy):
    """Accept an unknown key and append it to the known_hosts file (a changed key never gets here)."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
        needs_newline = self.known_hosts.is_file() and not self.known_hosts.read_bytes().endswith(b"\n") \
            and self.known_hosts.stat().st_size > 0
        with open(self.known_hosts, "a", encoding="ascii") as f:
            f.write(("\n" if needs_newline else "") + f"{hostname} {key.get_name()} {key.get_base64()}\n")
        client.get_host_keys().add(hostname, key.get_name(), key)


class _SSHStarted(Started):
    """A command on its own channel. Closing the channel (or losing the link, or this process dying) closes the
    command's stdin on the device."""

    def __init__(self, chan: paramiko.Channel, transport: paramiko.Transport) -> None:
        self.chan, self.transport = chan, transport
        self._buf = b""

    def read_line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            if self.chan.recv_ready():
                chunk = self.chan.recv(4096)
                if not chunk:
                    return None
                self._buf += chunk
                continue
            if self.chan.eof_received or not self.transport.is_active() or time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode("utf-8", "replace")

    def alive(self) -> bool:
        return self.transport.is_active() and not self.chan.closed and not self.chan.exit_status_ready()

    def close(self) -> None:
        try:
            self.chan.close()
        except (OSError, EOFError, paramiko.SSHException):
            pass  # the link is gone: so is the command's stdin


class SSHConnection(Connection):
    """A device over SSH. Lazy: connects on the first run/put/get; reconnects after a dropped link."""

    def __init__(self, spec: DeviceSpec, retries: int = 3, backoff_s: float = 0.5, keepalive_s: float = 15.0) -> None:
        if spec.is_local or not spec.host:
            raise DeviceError(f"device {spec.name!r} has no SSH host")
        super().__init__(spec)
        self.retries = int(retries)
        self.backoff_s = backoff_s
        self.keepalive_s = keepalive_s
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None

    # -- connecting ------------------------------------------------------------------------------
    @property
    def where(self) -> str:
        return f"{self.spec.name} ({self.spec.address})"

    def _new_client(self) -> paramiko.SSHClient:
        spec = self.spec
        client = paramiko.SSHClient()
        known = spec.known_hosts_path()
        if known.is_file():
            try:
                client.load_host_keys(str(known))
            except (OSError, paramiko.SSHException) as e:
                raise HostKeyError(f"{self.where}: cannot read known_hosts file {known}: {e}") from None
            client._host_keys_filename = None  # we append TOFU keys ourselves; never rewrite the user's file
        client.set_missing_host_key_policy(
            _TrustOnFirstUse(known) if spec.trust_on_first_use else _RefuseUnknown())
        return client

    def _connect_once(self) -> paramiko.SSHClient:
        spec = self.spec
        client = self._new_client()
        try:
            client.connect(
                spec.host, port=spec.port, username=spec.user,
                key_filename=str(spec.key_file) if spec.key_file else None,
                allow_agent=True, look_for_keys=spec.key_file is None, password=None,
                timeout=spec.connect_timeout, banner_timeout=spec.connect_timeout,
                auth_timeout=spec.connect_timeout, channel_timeout=spec.connect_timeout,
            )
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        if transport is not None and self.keepalive_s > 0:
            transport.set_keepalive(int(max(1, self.keepalive_s)))
        return client

    def _client_or_connect(self) -> paramiko.SSHClient:
        if self._client is not None:
            t = self._client.get_transport()
            if t is not None and t.is_active():
                return self._client
            self.close()
        spec = self.spec
        known = spec.known_hosts_path()
        keyname = known_hosts_name(spec.host or "", spec.port)
        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                self._client = self._connect_once()
                return self._client
            except _UnknownHostKey as e:
                raise HostKeyError(
                    f"{self.where}: host key {e.key.get_name()} {e.key.get_fingerprint().hex()} is not in {known}; "
                    f"check it and add it with `ssh-keyscan -p {spec.port} {spec.host} >> {known}`, or set "
                    f"trust_on_first_use = true for device {spec.name!r}") from None
            except paramiko.BadHostKeyException:
                raise HostKeyError(
                    f"{self.where}: the host key CHANGED since it was recorded in {known} (a reinstalled board, or "
                    f"someone in between); if the change is expected, remove the old key with "
                    f"`ssh-keygen -R '{keyname}' -f {known}` and add the new one with "
                    f"`ssh-keyscan -p {spec.port} {spec.host} >> {known}`") from None
            except paramiko.PasswordRequiredException:
                raise DeviceError(f"{self.where}: key file {spec.key_file} is encrypted; load it into the SSH "
                                  "agent (`ssh-add KEYFILE`) and leave key_file out") from None
            except paramiko.AuthenticationException as e:
                how = f"key file {spec.key_file}" if spec.key_file else "the SSH agent"
                raise DeviceError(f"{self.where}: authentication as {spec.user!r} failed with {how} ({e}); add the "
                                  f"public key to ~{spec.user}/.ssh/authorized_keys on the device "
                                  "(`ssh-copy-id`), passwords are not used") from None
            except (OSError, EOFError, paramiko.SSHException) as e:
                last = e
            if attempt < self.retries:
                # exponential backoff with full jitter: a fleet of workers does not reconnect in lockstep
                time.sleep(random.uniform(0, self.backoff_s * 2 ** attempt))
        raise DeviceError(f"{self.where}: cannot connect after {self.retries + 1} attempts "
                          f"({type(last).__name__}: {last}); check that the board is on, that sshd listens on "
                          f"port {spec.port}, and the network in between") from None

    def _sftp_or_open(self) -> paramiko.SFTPClient:
        client = self._client_or_connect()
        if self._sftp is None:
            try:
                self._sftp = client.open_sftp()
            except (OSError, EOFError, paramiko.SSHException) as e:
                self.close()
                raise DeviceError(f"{self.where}: cannot open SFTP ({e}); enable the sftp subsystem in the "
                                  "device's sshd_config") from None
        return self._sftp

    # -- the interface ---------------------------------------------------------------------------
    def run(self, argv: list[str], timeout: float = 60.0) -> RunResult:
        command = quote_argv(argv)
        client = self._client_or_connect()
        deadline = time.monotonic() + timeout
        try:
            transport = client.get_transport()
            if transport is None:
                raise paramiko.SSHException("transport closed")
            chan = transport.open_session(timeout=self.spec.connect_timeout)
            try:
                chan.settimeout(1.0)
                chan.exec_command(command)
                drain = OutputDrain(chan)
                while not drain.done():
                    if not transport.is_active():
                        raise EOFError("the SSH transport closed")
                    if self._cancelled():
                        raise RunInterrupted(f"{self.where}: {argv[0]} was interrupted")
                    if time.monotonic() > deadline:
                        raise RunTimeout(f"{self.where}: {argv[0]} ran past {timeout:g} s; raise the job's "
                                         "timeout or check the board")
                rc = chan.recv_exit_status()
                out, err = drain.out, drain.err
                if rc == -1 and _transport_dies(transport):
                    # No exit status because the server went away (sshd killed, board rebooted), not because the
                    # program was killed by a signal: a link fault to retry, not a result.
                    raise EOFError("the connection closed before the command's exit status arrived")
            finally:
                # Closing the channel closes the command's stdin on the device: a runner started with
                # --watch-stdin exits at once instead of timing on beside the next job.
                chan.close()
        except (RunTimeout, RunInterrupted):
            raise
        except (OSError, EOFError, paramiko.SSHException) as e:
            self.close()
            raise DeviceError(f"{self.where}: the link dropped while running {argv[0]} ({type(e).__name__}: {e}); "
                              "the job can be retried") from None
        return RunResult(b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace"), rc)

    def start(self, argv: list[str]) -> Started:
        client = self._client_or_connect()
        try:
            transport = client.get_transport()
            if transport is None:
                raise paramiko.SSHException("transport closed")
            chan = transport.open_session(timeout=self.spec.connect_timeout)
            chan.exec_command(quote_argv(argv))
        except (OSError, EOFError, paramiko.SSHException) as e:
            self.close()
            raise DeviceError(f"{self.where}: the link dropped while starting {argv[0]} ({type(e).__name__}: "
                              f"{e}); it can be retried") from None
        return _SSHStarted(chan, transport)

    def _put(self, local: Path, remote: str) -> None:
        sftp = self._sftp_or_open()
        try:
            sftp.put(str(local), remote, confirm=True)
        except FileNotFoundError:
            raise DeviceError(f"{self.where}: cannot write {remote} (its folder does not exist)") from None
        except (OSError, EOFError, paramiko.SSHException) as e:
            self.close()
            raise DeviceError(f"{self.where}: upload of {local.name} to {remote} failed "
                              f"({type(e).__name__}: {e}); the job can be retried") from None

    def get(self, remote: str, local: Path) -> None:
        sftp = self._sftp_or_open()
        try:
            sftp.get(remote, str(local))
        except FileNotFoundError:
            raise DeviceError(f"{self.where}: no file {remote} on the device") from None
        except (OSError, EOFError, paramiko.SSHException) as e:
            self.close()
            raise DeviceError(f"{self.where}: download of {remote} failed ({type(e).__name__}: {e})") from None

    def close(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except (OSError, EOFError, paramiko.SSHException):
                pass  # already gone: nothing left to release
            self._sftp = None
        if self._client is not None:
            self._client.close()
            self._client = None
