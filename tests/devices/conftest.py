"""Fixtures for the devices tests: a real OpenSSH sshd stand-in device, and a TCP proxy that cuts links."""

from __future__ import annotations

import getpass
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/devices/artifacts.py

from edgemask.devices.inventory import DeviceSpec  # noqa: E402
from sshd_common import SSHD, SSHD_OPTIONS, keygen, wait_for_banner  # noqa: E402,F401  (keygen: test_ssh uses it)
INSTALL_HINT = "run `sh tests/fleet/install.sh` (installs openssh-server and openssh-client) and rerun"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SshServer:
    port: int
    user: str
    dir: Path
    client_key: Path
    host_pub: str  # "ssh-ed25519 BASE64 ..."

    def known_hosts_line(self, port: int | None = None) -> str:
        kind, b64 = self.host_pub.split()[:2]
        return f"[127.0.0.1]:{port or self.port} {kind} {b64}\n"

    def spec(self, tmp: Path, **kw) -> DeviceSpec:
        """A `linux` device on this server, running the test's own Python, its workdir under tmp."""
        known = tmp / "known_hosts"
        if not known.exists():
            known.write_text(self.known_hosts_line(kw.get("port")))
        base = dict(name="stand-in", kind="linux", host="127.0.0.1", port=self.port, user=self.user,
                    key_file=self.client_key, known_hosts=known, python=sys.executable,
                    workdir=str(tmp / "remote work"), runtimes=("onnxruntime", "executorch"),
                    power_sensor="auto", connect_timeout=5.0)
        base.update(kw)
        return DeviceSpec(**base)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    """A real OpenSSH server on 127.0.0.1:<free port> with its own host key and one authorized client key."""
    if not SSHD.is_file():
        pytest.fail(f"{SSHD} is missing: the fleet tests need a real OpenSSH server; {INSTALL_HINT}")
    d = tmp_path_factory.mktemp("sshd")
    host_pub = keygen(d / "host_ed25519")
    client_pub = keygen(d / "client_key")
    (d / "authorized_keys").write_text(client_pub + "\n")
    port = free_port()
    (d / "sshd_config").write_text(f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {d / 'host_ed25519'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
""" + SSHD_OPTIONS)
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation directory
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_banner("127.0.0.1", port, proc, 10.0)
        yield SshServer(port=port, user=getpass.getuser(), dir=d, client_key=d / "client_key", host_pub=host_pub)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class CuttingProxy:
    """A TCP relay to 127.0.0.1:target that drops the link (both sides) once `cut_after` bytes went upstream."""

    def __init__(self, target: int, cut_after: int) -> None:
        self.target = target
        self.cut_after = cut_after
        self.sent = 0
        self.cut = threading.Event()
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.port = self.listener.getsockname()[1]
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._socks += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, counting: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if counting:
                    self.sent += len(data)
                    if self.sent > self.cut_after:
                        self.cut.set()
                        break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self.listener.close()
        for s in self._socks:
            s.close()


@pytest.fixture
def cutting_proxy():
    proxies: list[CuttingProxy] = []

    def make(target: int, cut_after: int) -> CuttingProxy:
        p = CuttingProxy(target, cut_after)
        proxies.append(p)
        return p

    yield make
    for p in proxies:
        p.close()


@pytest.fixture
def fake_root(tmp_path: Path):
    """A helper writing files into a fake sysfs tree: put("sys/class/...", "value")."""
    root = tmp_path / "sysroot"

    def put(rel: str, value: str) -> Path:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(value + "\n")
        return p

    put.root = root  # type: ignore[attr-defined]
    return put

