"""What the two kinds of sshd stand-ins share: the local sshd in tests/devices/conftest.py and the fleet's
per-namespace devices in tests/fleet/standin.py."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")

# sshd_config lines every stand-in uses: keys only, no PAM, SFTP in-process, room for many parallel connections
SSHD_OPTIONS = """\
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
UseDNS no
Subsystem sftp internal-sftp
MaxStartups 50
LogLevel ERROR
"""


def keygen(path: Path) -> str:
    """A new ed25519 key pair at path (+ .pub); returns the public line "ssh-ed25519 BASE64 comment"."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
                   check=True, capture_output=True)
    return path.with_name(path.name + ".pub").read_text().strip()


def wait_for_banner(host: str, port: int, proc: subprocess.Popen, timeout: float) -> None:
    """Wait until sshd answers with its `SSH-` banner (ssh-keyscan is slow and noisy for this)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"sshd at {host}:{port} exited with {proc.returncode}: {err.strip()}")
        try:
            with socket.create_connection((host, port), timeout=2) as s:
                s.settimeout(timeout)
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd at {host}:{port} sent no SSH- banner within {timeout:g} s")
