"""The device inventory (`devices.toml`): one frozen DeviceSpec per board, validated once on load.

    [devices.tx2]
    kind = "jetson-tx2"
    host = "192.168.1.40"
    user = "nvidia"
    key_file = "~/.ssh/id_ed25519"
    known_hosts = "~/.ssh/known_hosts"     # default; unknown host keys are refused
    workdir = "edgemask"                   # relative to the login directory, or absolute
    power_sensor = "auto"                  # ina3221 | hwmon | rapl | auto | none
    governor = "performance"               # optional: every CPU's cpufreq governor during a campaign
    jetson_clocks = true                   # optional, Jetson only: `jetson_clocks` during a campaign
    trtexec = "/usr/src/tensorrt/bin/trtexec"   # optional: TensorRT's trtexec (format "trt"); default: JetPack's
    torch_index = "https://download.pytorch.org/whl/cpu"   # optional: where `devices setup` gets a Pi's torch

The built-in `local` device (this machine, this Python) always exists.

`governor` and `jetson_clocks` are applied by a campaign before its first job on the board and the board's
previous settings are restored after its last one, also when it fails or is interrupted (``devices.board``);
the state actually set is read back and recorded in the campaign's store (``events``). A campaign killed before
restoring leaves them recorded, and the next campaign on that board restores the original ones. Setting them
needs root: the runner writes sysfs directly when the SSH user is root, else uses ``sudo -n`` (never a
password prompt). When that is refused the board is STOPPED, none of its jobs is timed, and the message names
the sudoers line to add (``USER ALL=(root) NOPASSWD: /usr/bin/tee
/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor``, or ``/usr/bin/jetson_clocks``) or says to remove the
field: a measurement taken under other clocks than the inventory promises would be mislabelled.
"""

from __future__ import annotations

import dataclasses
import posixpath
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgemask.errors import ConfigError
from edgemask.schema import Field, Table
from edgemask.targets import BOARDS, FORMAT_RUNTIME, RUNTIME_NAMES, BoardProfile
from edgemask.tomlio import read_toml

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's CPU-only wheel index (aarch64 included)
POWER_SENSORS = ("auto", "none", "ina3221", "hwmon", "rapl")  # the runner's registry + auto/none
GOVERNORS = ("performance", "powersave", "ondemand", "schedutil", "conservative", "userspace")

# What each kind of board ships with (OS, Python, runtimes, ONNX opset cap, sensors) and which runtime reads which
# format: the project's one table, edgemask.targets, under the names devices has always used.
KindProfile = BoardProfile
KIND_PROFILES: dict[str, KindProfile] = BOARDS
KINDS = tuple(KIND_PROFILES)  # local, linux, jetson-tx2, rpi4


@dataclass(frozen=True)
class DeviceSpec:
    """One device of the inventory. Paths are resolved; remote paths are POSIX strings on the device."""

    name: str
    kind: str
    host: str | None = None
    port: int = 22
    user: str | None = None
    key_file: Path | None = None  # None: the SSH agent (or ~/.ssh/id_*)
    known_hosts: Path | None = None  # None: ~/.ssh/known_hosts
    python: str = "python3"
    workdir: str = "edgemask"  # on the device; relative paths are under the login directory
    runtimes: tuple[str, ...] = ()
    power_sensor: str = "auto"
    trust_on_first_use: bool = False
    governor: str | None = None  # set before a campaign (needs passwordless sudo); None: leave it
    jetson_clocks: bool = False  # run `jetson_clocks` before a campaign (Jetson only)
    connect_timeout: float = 10.0
    trtexec: str | None = None  # format "trt": the board's trtexec; None: JetPack's TX2_TRTEXEC, then PATH
    # where setup installs torch from on a Pi (ExecuTorch's runtime links it): PyTorch's own CPU-only aarch64
    # wheels, because PyPI's aarch64 torch is the CUDA build and pulls about 2.8 GB of CUDA wheels with it
    torch_index: str = TORCH_CPU_INDEX

    @property
    def is_local(self) -> bool:
        return self.kind == "local"

    @property
    def profile(self) -> KindProfile:
        return KIND_PROFILES[self.kind]

    @property
    def address(self) -> str:
        """user@host:port, for messages."""
        if self.is_local:
            return "local"
        return f"{self.user}@{self.host}:{self.port}"

    def known_hosts_path(self) -> Path:
        return self.known_hosts or Path.home() / ".ssh" / "known_hosts"

    def can_run(self, fmt: str) -> bool:
        return FORMAT_RUNTIME.get(fmt) in self.runtimes


def local_device(workspace: Path, name: str = "local", **overrides: Any) -> DeviceSpec:
    """This machine, run with this Python, working under <workspace>/devices/<name>."""
    kw: dict[str, Any] = dict(
        name=name, kind="local", python=sys.executable,
        workdir=str((Path(workspace) / "devices" / name).resolve()),
        runtimes=KIND_PROFILES["local"].runtimes,
    )
    kw.update(overrides)
    return DeviceSpec(**kw)


_DEVICE = {  # a [devices.NAME] table (edgemask.schema: one wording for every mistake)
    "kind": Field(str, choices=KINDS, what="kind"),
    "host": Field(str, None), "port": Field(int, 22, minimum=1, maximum=65535), "user": Field(str, None),
    "key_file": Field(str, None), "known_hosts": Field(str, None), "python": Field(str, None),
    "workdir": Field(str, None), "runtimes": Field(list, None, items=str, choices=RUNTIME_NAMES, what="runtime"),
    "power_sensor": Field(str, "auto", choices=POWER_SENSORS, what="power sensor"),
    "trust_on_first_use": Field(bool, False), "governor": Field(str, None, choices=GOVERNORS, what="governor"),
    "jetson_clocks": Field(bool, False), "connect_timeout": Field(float, 10.0, above=0),
    "trtexec": Field(str, None), "torch_index": Field(str, TORCH_CPU_INDEX),
}


def _check_remote_path(value: str) -> str | None:
    """Why ``value`` is no device path edgemask may use ("wrong; what to do"), else None."""
    if "~" in value or "$" in value:
        return (f"{value!r} uses ~ or $, which are not expanded; give a path relative to the login directory, "
                "or an absolute one")
    if ".." in value.split("/"):
        return f"{value!r} contains '..'; give a path inside the login directory, or an absolute one"
    return None


def parse_device(name: str, table: dict[str, Any], source: Path, workspace: Path) -> DeviceSpec:
    """One `[devices.NAME]` table -> DeviceSpec; every problem names the file, device and field."""
    schema = {**_DEVICE, "workdir": dataclasses.replace(_DEVICE["workdir"], check=_check_remote_path)}
    t = Table(str(source), f"devices.{name}", table, schema)
    kind = t["kind"]
    if kind == "local":
        for key in ("host", "port", "user", "key_file", "known_hosts", "trust_on_first_use"):
            if key in t:
                raise t.error(key, f"a local device has no {key}", 'remove it or use kind = "linux"')
    else:
        for key in ("host", "user"):
            if not t[key]:
                raise t.error(key, "missing field", f"add {key} = … (needed to reach a {kind} over SSH)")
    if t["jetson_clocks"] and kind != "jetson-tx2":
        raise t.error("jetson_clocks", "only a Jetson has jetson_clocks", f"remove it for kind {kind!r}")
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"{source}: [devices.{name}]: device names may hold letters, digits, '-' and '_' only; "
                          "rename the table")

    def local_path(key: str) -> Path | None:
        if t[key] is None:
            return None
        p = Path(t[key]).expanduser()
        return p if p.is_absolute() else (source.parent / p).resolve()

    key_file = local_path("key_file")
    if key_file is not None and not key_file.is_file():
        raise t.error("key_file", f"no such file {key_file}", f"create one with `ssh-keygen -t ed25519 -f "
                      f"{key_file}` or leave the field out to use the SSH agent")
    known_hosts = local_path("known_hosts")
    runtimes = tuple(t["runtimes"] if t["runtimes"] is not None else KIND_PROFILES[kind].runtimes)
    sensor, governor, workdir = t["power_sensor"], t["governor"], t["workdir"]

    if kind == "local":
        overrides: dict[str, Any] = {"runtimes": runtimes, "power_sensor": sensor}
        if t["python"] is not None:
            overrides["python"] = t["python"]
        if workdir is not None:
            overrides["workdir"] = str(Path(posixpath.normpath(workdir)).resolve())
        if governor is not None:
            overrides["governor"] = governor
        return local_device(workspace, name, **overrides)

    return DeviceSpec(
        name=name, kind=kind, host=t["host"], port=t["port"], user=t["user"], key_file=key_file,
        known_hosts=known_hosts, python=t["python"] or "python3",
        workdir=posixpath.normpath(workdir if workdir is not None else "edgemask"),
        runtimes=runtimes, power_sensor=sensor, trust_on_first_use=t["trust_on_first_use"],
        governor=governor, jetson_clocks=t["jetson_clocks"], connect_timeout=t["connect_timeout"],
        trtexec=t["trtexec"], torch_index=t["torch_index"],
    )


def load_inventory(path: Path | None = None, workspace: Path | None = None) -> dict[str, DeviceSpec]:
    """All devices by name: the built-in `local` plus those of ``path``.

    ``path`` None means ``<workspace>/devices.toml`` when it exists. ``workspace`` defaults to ./workspace.
    """
    workspace = Path(workspace) if workspace is not None else Path("workspace")
    devices = {"local": local_device(workspace)}
    if path is None:
        candidate = workspace / "devices.toml"
        if not candidate.is_file():
            return devices
        path = candidate
    path = Path(path)
    data = read_toml(path, "no such inventory file; write one with [devices.NAME] tables")
    extra = sorted(set(data) - {"devices"})
    if extra:
        raise ConfigError(f"{path}: unknown top-level table {extra[0]!r}; devices go in [devices.NAME] tables")
    tables = data.get("devices", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{path}: 'devices' must hold [devices.NAME] tables")
    for name, table in tables.items():
        if name == "local":
            raise ConfigError(f"{path}: [devices.local] is the built-in device; give yours another name "
                              "(kind = \"local\" is allowed under any other name)")
        devices[name] = parse_device(name, table, path, workspace)
    return devices
