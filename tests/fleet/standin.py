"""The test fleet: stand-in devices that the devices harness drives exactly as it drives a real board.

Each stand-in is an OpenSSH sshd in its own network namespace, reached over a veth pair in a private subnet
(10.231.N.0/24: the host side is .1, the device .2), with its own host key and one authorized client key, in a
cgroup whose CPU quota makes it slower than the host, and with an EMULATED power sensor in its own sysfs root
(`EDGEMASK_SYSFS_ROOT`, set for every SSH session) written by `powermodel.py` from the cgroup's CPU use.

- `x86_64` stand-ins run the host's sshd and the test's own Python.
- `aarch64` stand-ins run a Debian bookworm arm64 root filesystem (`build-rootfs.sh`, cached under
  `CACHE_DIR`) in a chroot on an overlay, every binary under qemu-user (binfmt_misc) as a Cortex-A72, with a
  fake aarch64 /proc/cpuinfo; its sshd and Python are the arm64 builds, and so are the runtimes a provisioned
  Pi has (numpy, onnxruntime, ai-edge-litert, ExecuTorch's runtime with the torch it links), installed by the
  pip calls `edgemask devices setup` runs on a Pi (`fetch-wheels.sh`, `build-rootfs.sh`).

Faults act on the real link and the real server: `link_down()`, `rate_limit()` (tc tbf; this kernel has no
netem), `loss()` (nftables `numgen random` drop) and `kill_sshd()`. Traffic goes only to the namespaces'
own addresses. `teardown()` removes everything a device set up; `sweep()` removes leftovers of a run that
was killed before its teardown (namespaces, cgroups and nftables tables are named with `PREFIX`).

Cost, measured on the 2-core project machine: with a warm cache all of tests/fleet takes about 3 minutes
(an x86 stand-in starts in ~1 s, the aarch64 one in ~1.5 s; importing numpy + onnxruntime under qemu ~9 s;
`setup_device` from uploaded wheels ~85 s). Importing torch + ExecuTorch's runtime under qemu takes 50-90 s,
so each .pte job costs about a minute whatever its timed runs. Cold, the 2.8 GB of wheels (PyPI's aarch64
torch is a CUDA build and brings the CUDA runtime wheels) download in about a minute and the arm64 root
filesystem (5.1 GB) took 21 minutes of wall time on a heavily shared host (6 min of CPU), a third of it
pip installing the runtimes.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "devices"))  # also when run as `python -m fleet.standin`
from sshd_common import SSHD, SSHD_OPTIONS, keygen, wait_for_banner  # noqa: E402  (shared with tests/devices)

HERE = Path(__file__).resolve().parent
PREFIX = "emfleet"  # netns, cgroup and nftables table names start with it
SUBNET = "10.231"  # 10.231.N.0/24 per device: a private range created here, on veths created here
CACHE_DIR = Path(os.environ.get("EDGEMASK_FLEET_CACHE", "/var/cache/edgemask-fleet"))
WHEELS_SCRIPT = HERE / "fetch-wheels.sh"
ROOTFS_SCRIPT = HERE / "build-rootfs.sh"
OWNERS = Path("/run/edgemask-fleet")  # <netns name> -> pid of the test process that made it
INSTALL_HINT = "run `sh tests/fleet/install.sh` as root (OpenSSH, mmdebstrap, qemu-user-static, nftables)"
# the Raspberry Pi 4 profile of an aarch64 stand-in (StandIn.start's keywords): one CPU's worth of quota, an
# emulated INA226 hwmon sensor; and the runtimes a Pi runs training steps with
PI4 = {"cores": 1.0, "sensor": "hwmon"}
PI_TRAINING_RUNTIMES = ("onnxruntime", "tflite", "executorch", "torch")


class FleetUnavailable(RuntimeError):
    """This machine cannot host the fleet (not root, a missing tool, a kernel feature refused); says which."""


def sh(*argv: str | Path, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    p = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, argv))} -> rc {p.returncode}: {p.stderr.strip()}")
    return p


# ------------------------------------------------------------------------------------------------
# What this machine allows
# ------------------------------------------------------------------------------------------------
def require_host(aarch64: bool = False) -> None:
    """Raise FleetUnavailable naming the first missing piece."""
    if os.geteuid() != 0:
        raise FleetUnavailable("the fleet needs root (network namespaces, cgroups, mounts)")
    for tool in ("ip", "tc", "nft", "unshare", "ssh-keygen"):
        if sh("sh", "-c", f"command -v {tool}", check=False).returncode != 0:
            raise FleetUnavailable(f"no `{tool}` on this machine; {INSTALL_HINT}")
    if not SSHD.is_file():
        raise FleetUnavailable(f"{SSHD} is missing; {INSTALL_HINT}")
    if aarch64:
        for tool in ("mmdebstrap", "arch-test"):
            if sh("sh", "-c", f"command -v {tool}", check=False).returncode != 0:
                raise FleetUnavailable(f"no `{tool}` on this machine; {INSTALL_HINT}")
        if sh("arch-test", "arm64", check=False).returncode != 0:
            raise FleetUnavailable("this machine cannot execute arm64 binaries (binfmt_misc not mounted or "
                                   f"qemu-aarch64 not registered); {INSTALL_HINT}")


# ------------------------------------------------------------------------------------------------
# Cached build products: the aarch64 wheels and the arm64 root filesystem
# ------------------------------------------------------------------------------------------------
def _script_key(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def aarch64_wheels() -> Path:
    """A Pi's runtime wheels (+ deps) for bookworm arm64 / CPython 3.11, downloaded once (fetch-wheels.sh)."""
    dest = CACHE_DIR / f"wheels-aarch64-cp311-{_script_key(WHEELS_SCRIPT)}"
    if not (dest / "requirements.txt").is_file():
        sh("sh", WHEELS_SCRIPT, dest, sys.executable, timeout=900)
    return dest


def arm64_rootfs() -> Path:
    """The bookworm arm64 root filesystem with a Pi's runtimes, built once and keyed by its build script and
    the wheel lists (fetch-wheels.sh)."""
    wheels = aarch64_wheels()
    dest = CACHE_DIR / f"bookworm-arm64-{_script_key(ROOTFS_SCRIPT, WHEELS_SCRIPT)}"
    if not (dest / ".complete").is_file():
        p = sh("sh", ROOTFS_SCRIPT, dest, wheels, check=False, timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"building the arm64 root filesystem failed: {p.stderr.strip()[-2000:]}")
    return dest


# ------------------------------------------------------------------------------------------------
# CPU quota: a cgroup per device (v1 `cpu` + `cpuacct` hierarchies, or v2), whichever this kernel mounts
# ------------------------------------------------------------------------------------------------
class CpuCgroup:
    """A cgroup holding one device's processes, limited to ``cores`` CPUs' worth of time."""

    PERIOD_US = 100_000  # the CFS period: the quota runs the device in bursts of cores × this, once per period

    def __init__(self, name: str, cores: float) -> None:
        self.name, self.cores = name, cores
        root = Path("/sys/fs/cgroup")
        self.v2 = sh("stat", "-fc", "%T", root).stdout.strip() == "cgroup2fs"
        period = self.PERIOD_US
        quota = int(cores * period)
        if self.v2:
            self.dirs = [root / name]
            self.dirs[0].mkdir(exist_ok=True)
            try:
                (self.dirs[0] / "cpu.max").write_text(f"{quota} {period}\n")
            except OSError as e:
                raise FleetUnavailable(f"cgroup v2: cannot set cpu.max ({e}); enable the cpu controller "
                                       "in the parent's cgroup.subtree_control") from None
            self.usage_file, self.usage_unit = self.dirs[0] / "cpu.stat", "us"
        else:
            cpu, acct = root / "cpu" / name, root / "cpuacct" / name
            if not (root / "cpu").is_dir() or not (root / "cpuacct").is_dir():
                raise FleetUnavailable("cgroup v1 without cpu and cpuacct hierarchies under /sys/fs/cgroup")
            self.dirs = [cpu] if cpu.resolve() == acct.resolve() else [cpu, acct]
            for d in self.dirs:
                d.mkdir(exist_ok=True)
            (cpu / "cpu.cfs_period_us").write_text(f"{period}\n")
            (cpu / "cpu.cfs_quota_us").write_text(f"{quota}\n")
            self.usage_file, self.usage_unit = acct / "cpuacct.usage", "ns"

    def add(self, pid: int) -> None:
        for d in self.dirs:
            (d / "cgroup.procs").write_text(f"{pid}\n")

    def throttled_periods(self) -> int:
        """How many scheduling periods the quota held the device back (cpu.stat nr_throttled, v1 and v2)."""
        for line in (self.dirs[0] / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "nr_throttled":
                return int(value)
        return 0

    def pids(self) -> list[int]:
        return [int(x) for x in (self.dirs[0] / "cgroup.procs").read_text().split()]

    def remove(self) -> None:
        for d in self.dirs:
            if not d.exists():
                continue
            for _ in range(50):
                left = [int(x) for x in (d / "cgroup.procs").read_text().split()]
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


# ------------------------------------------------------------------------------------------------
# The devices
# ------------------------------------------------------------------------------------------------
CPUINFO_A72 = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n"
    "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\n"
    for i in range(4)
) + "Hardware\t: EMULATED edgemask test fleet (qemu-user, cortex-a72)\n"


def write_inventory(path: Path, spec, name: str | None = None, kind: str | None = None,
                    runtimes: tuple[str, ...] = ("onnxruntime",)) -> Path:
    """A devices.toml holding one stand-in, as a user would write it for a real board."""
    rt = ", ".join(f'"{r}"' for r in runtimes)
    path.write_text(f"""
[devices.{name or spec.name}]
kind = "{kind or spec.kind}"
host = "{spec.host}"
user = "{spec.user}"
key_file = "{spec.key_file}"
known_hosts = "{spec.known_hosts}"
python = "{spec.python}"
workdir = "{spec.workdir}"
runtimes = [{rt}]
""")
    return path


def _free_index() -> int:
    used = sh("ip", "-o", "-4", "addr", "show").stdout
    netns = sh("ip", "netns", "list").stdout
    for n in range(10, 250):
        if f" {SUBNET}.{n}." not in used and f"{PREFIX}{n}" not in netns:
            return n
    raise FleetUnavailable(f"no free {SUBNET}.N.0/24 subnet left")


@dataclass
class StandIn:
    """One stand-in device. Create with `StandIn.start(...)`; always `teardown()`."""

    name: str
    arch: str  # x86_64 | aarch64
    dir: Path
    index: int
    cores: float
    sensor: str  # ina3221 | hwmon
    lower: Path | None = None  # arm64 root filesystem (aarch64 only)
    user: str = "root"
    client_key: Path = field(init=False)
    host_pub: str = field(init=False)
    proc: subprocess.Popen | None = None
    power: subprocess.Popen | None = None
    cgroup: CpuCgroup | None = None

    # -- names -----------------------------------------------------------------------------------
    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def host_if(self) -> str:
        return f"{PREFIX}{self.index}h"

    @property
    def address(self) -> str:
        return f"{SUBNET}.{self.index}.2"

    @property
    def nft_table(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def workdir(self) -> str:
        return str(self.dir / "work dir") if self.arch == "x86_64" else "/root/edgemask work"

    @property
    def sysfs_root(self) -> str:
        """The device's sysfs root as the device sees it."""
        return str(self.dir / "sysfs") if self.arch == "x86_64" else "/emu-sysfs"

    def known_hosts_line(self) -> str:
        kind, b64 = self.host_pub.split()[:2]
        return f"{self.address} {kind} {b64}\n"

    def host_path(self, remote: str) -> Path:
        """Where a file the device wrote lies on the host (the overlay's upper layer for aarch64)."""
        return Path(remote) if self.arch == "x86_64" else self.dir / "upper" / remote.lstrip("/")

    def spec(self, **kw):
        from edgemask.devices.inventory import DeviceSpec

        known = self.dir / "known_hosts"
        if not known.exists():
            known.write_text(self.known_hosts_line())
        base = dict(
            name=self.name, kind="linux" if self.arch == "x86_64" else "rpi4", host=self.address, port=22,
            user=self.user, key_file=self.client_key, known_hosts=known,
            python=sys.executable if self.arch == "x86_64" else "python3", workdir=self.workdir,
            runtimes=("onnxruntime",), power_sensor="auto", connect_timeout=10.0,
        )
        base.update(kw)
        return DeviceSpec(**base)

    # -- life cycle ------------------------------------------------------------------------------
    @classmethod
    def start(cls, name: str, arch: str, base_dir: Path, cores: float = 0.5, sensor: str = "hwmon",
              lower: Path | None = None) -> "StandIn":
        require_host(aarch64=arch == "aarch64")
        if arch == "aarch64" and lower is None:
            raise ValueError("an aarch64 stand-in needs its root filesystem (lower)")
        d = Path(base_dir) / name
        d.mkdir(parents=True)
        dev = cls(name=name, arch=arch, dir=d, index=_free_index(), cores=cores, sensor=sensor, lower=lower)
        try:
            dev._network_up()
            dev._write_config()
            dev.cgroup = CpuCgroup(f"{PREFIX}{dev.index}", cores)
            dev._power_up()
            dev.start_sshd()
        except BaseException:
            dev.teardown()
            raise
        return dev

    def _network_up(self) -> None:
        OWNERS.mkdir(parents=True, exist_ok=True)
        (OWNERS / self.netns).write_text(f"{os.getpid()}\n")
        peer = f"{PREFIX}{self.index}d"
        host_ip = f"{SUBNET}.{self.index}.1/24"
        sh("ip", "netns", "add", self.netns)
        sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", self.netns)
        sh("ip", "addr", "add", host_ip, "dev", self.host_if)
        sh("ip", "link", "set", self.host_if, "up")
        sh("ip", "-n", self.netns, "addr", "add", f"{self.address}/24", "dev", peer)
        sh("ip", "-n", self.netns, "link", "set", peer, "up")
        sh("ip", "-n", self.netns, "link", "set", "lo", "up")

    def _write_config(self) -> None:
        d = self.dir
        if self.arch == "x86_64":
            self.user = os.environ.get("USER") or "root"
            etc, etc_in = d, str(d)  # files as the host sees them, and as sshd sees them
        else:
            etc = d / "upper" / "etc" / "ssh" / "edgemask"
            etc_in = "/etc/ssh/edgemask"
            etc.mkdir(parents=True)
            (d / "cpuinfo").write_text(CPUINFO_A72)
        (d / "sysfs").mkdir()
        self.host_pub = keygen(etc / "host_ed25519")
        self.client_key = d / "client_key"
        (etc / "authorized_keys").write_text(keygen(self.client_key) + "\n")
        (etc / "sshd_config").write_text(f"""\
# stand-in device {self.name} ({self.arch}) of the edgemask test fleet
ListenAddress {self.address}:22
HostKey {etc_in}/host_ed25519
AuthorizedKeysFile {etc_in}/authorized_keys
PidFile none
ClientAliveInterval 0
SetEnv EDGEMASK_SYSFS_ROOT={self.sysfs_root}{' QEMU_CPU=cortex-a72' if self.arch == 'aarch64' else ''}
""" + SSHD_OPTIONS)

    def _power_up(self) -> None:
        assert self.cgroup is not None
        self.power = subprocess.Popen(
            [sys.executable, str(HERE / "powermodel.py"), "--sysfs", str(self.dir / "sysfs"), "--kind", self.sensor,
             "--usage-file", str(self.cgroup.usage_file), "--usage-unit", self.cgroup.usage_unit,
             "--cores", str(self.cores), "--window-s", str(CpuCgroup.PERIOD_US / 1e6),  # one whole period
             "--parent-pid", str(os.getpid())],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        marker = self.dir / "sysfs" / "EMULATED-BY-EDGEMASK-TEST-FLEET"
        deadline = time.monotonic() + 10
        while not marker.exists():
            if self.power.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"power model for {self.name} did not start: {self.power.stderr.read()!r}")
            time.sleep(0.05)

    def start_sshd(self, timeout: float = 60.0) -> None:
        """(Re)start the device's sshd in its namespace and cgroup; wait for its banner."""
        argv = ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private",
                "sh", str(HERE / "boot-device.sh"), str(self.dir)]
        if self.lower is not None:
            argv.append(str(self.lower))
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     start_new_session=True)
        assert self.cgroup is not None
        self.cgroup.add(self.proc.pid)  # before it forks anything: every later process inherits the cgroup
        wait_for_banner(self.address, 22, self.proc, timeout)

    def sshd_pids(self) -> list[int]:
        """The device's sshd processes: the listener and one (or two) per connection."""
        out = []
        for pid in self.cgroup.pids() if self.cgroup else []:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"sshd") or part.startswith(b"sshd:") for part in cmd[:2]):
                out.append(pid)
        return out

    def kill_sshd(self) -> list[int]:
        """SIGKILL every sshd process of the device (the server crashes; the programs it ran keep going)."""
        pids = self.sshd_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        return pids

    # -- faults on the link --------------------------------------------------------------------
    def link_down(self) -> None:
        sh("ip", "link", "set", self.host_if, "down")

    def link_up(self) -> None:
        sh("ip", "link", "set", self.host_if, "up")

    def rate_limit(self, kbit: int) -> None:
        """Shape traffic towards the device with a token bucket (netem is not in this kernel)."""
        sh("tc", "qdisc", "replace", "dev", self.host_if, "root", "tbf", "rate", f"{kbit}kbit",
           "burst", "16kbit", "latency", "500ms")

    def clear_rate_limit(self) -> None:
        sh("tc", "qdisc", "del", "dev", self.host_if, "root", check=False)

    def loss(self, percent: int) -> None:
        """Drop ``percent`` % of the packets towards the device, at random (nftables numgen)."""
        self.clear_loss()
        rules = (f"table inet {self.nft_table} {{\n chain out {{\n"
                 "  type filter hook output priority 0; policy accept;\n"
                 f"  oifname \"{self.host_if}\" numgen random mod 100 < {int(percent)} counter drop\n }}\n}}\n")
        p = subprocess.run(["nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if p.returncode != 0:
            raise FleetUnavailable(f"nftables refused the loss rule: {p.stderr.strip()}")

    def dropped_packets(self) -> int:
        out = sh("nft", "list", "table", "inet", self.nft_table, check=False).stdout
        for word, nxt in zip(out.split(), out.split()[1:]):
            if word == "packets":
                return int(nxt)
        return 0

    def clear_loss(self) -> None:
        sh("nft", "delete", "table", "inet", self.nft_table, check=False)

    # -- teardown --------------------------------------------------------------------------------
    def teardown(self) -> None:
        """Stop everything this device started; safe to call twice and after a failed start."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.cgroup is not None:
            self.cgroup.remove()  # kills whatever is left in it (sessions, runners)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self.power is not None and self.power.poll() is None:
            self.power.kill()
            self.power.wait(timeout=10)
        self.clear_loss()
        sh("ip", "netns", "del", self.netns, check=False)  # takes the veth pair with it
        sh("ip", "link", "del", self.host_if, check=False)
        (OWNERS / self.netns).unlink(missing_ok=True)


def _owner_alive(name: str) -> bool:
    """Is the test process that made ``name`` (netns, cgroup or table of one device) still running?"""
    try:
        pid = int((OWNERS / name).read_text())
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and Path(f"/proc/{pid}").exists()


def sweep() -> list[str]:
    """Remove namespaces, cgroups and nftables tables that a killed run left behind; return their names.
    Devices of another test run that is still going (its process alive) are left alone."""
    gone = []
    for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX) and not _owner_alive(name):
            for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", name, check=False)
            (OWNERS / name).unlink(missing_ok=True)
            gone.append(name)
    for d in list(Path("/sys/fs/cgroup").glob(f"{PREFIX}*")) + list(Path("/sys/fs/cgroup").glob(f"*/{PREFIX}*")):
        if _owner_alive(d.name):
            continue
        c = CpuCgroup.__new__(CpuCgroup)
        c.dirs = [d]
        c.remove()
        gone.append(str(d))
    for line in sh("nft", "list", "tables", check=False).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].startswith(PREFIX) and not _owner_alive(parts[2]):
            sh("nft", "delete", "table", parts[1], parts[2], check=False)
            gone.append(parts[2])
    return gone


if __name__ == "__main__":  # after a killed test run: cd tests && python -m fleet.standin
    print("removed:", ", ".join(sweep()) or "nothing")
