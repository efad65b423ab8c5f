"""Inventory loading: good entries resolved, each bad field named with its file and device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from edgemask.devices.inventory import KIND_PROFILES, load_inventory
from edgemask.errors import ConfigError

GOOD = """
[devices.tx2]
kind = "jetson-tx2"
host = "192.168.1.40"
user = "nvidia"
key_file = "keys/id_ed25519"
known_hosts = "keys/known_hosts"
workdir = "bench/edgemask"
jetson_clocks = true

[devices.pi]
kind = "rpi4"
host = "pi4.lan"
port = 2222
user = "pi"
power_sensor = "hwmon"
governor = "performance"
trust_on_first_use = true
"""


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "keys").mkdir(exist_ok=True)
    (tmp_path / "keys" / "id_ed25519").write_text("not read at load time")
    p = tmp_path / "devices.toml"
    p.write_text(text)
    return p


def test_good_inventory_resolves_paths_and_defaults(tmp_path):
    inv = load_inventory(write(tmp_path, GOOD), workspace=tmp_path / "ws")
    assert sorted(inv) == ["local", "pi", "tx2"]
    tx2, pi, local = inv["tx2"], inv["pi"], inv["local"]
    assert tx2.key_file == tmp_path / "keys" / "id_ed25519"  # relative to the inventory file
    assert tx2.known_hosts == tmp_path / "keys" / "known_hosts"
    assert (tx2.port, tx2.python, tx2.workdir, tx2.power_sensor) == (22, "python3", "bench/edgemask", "auto")
    assert tx2.runtimes == ("onnxruntime", "tensorrt")  # kind profile: JetPack TensorRT; Python 3.6
    assert tx2.trtexec is None and tx2.torch_index == "https://download.pytorch.org/whl/cpu"
    assert tx2.profile.max_onnx_opset == 15 and tx2.jetson_clocks
    assert (pi.port, pi.trust_on_first_use, pi.governor, pi.key_file) == (2222, True, "performance", None)
    assert pi.known_hosts_path() == Path.home() / ".ssh" / "known_hosts"
    assert set(pi.runtimes) == {"onnxruntime", "tflite", "executorch", "torch"}  # torch: format torch-train
    assert local.kind == "local" and local.python == sys.executable
    assert local.workdir == str((tmp_path / "ws" / "devices" / "local").resolve())


def test_local_exists_without_inventory_and_workspace_file_is_used(tmp_path):
    assert list(load_inventory(None, tmp_path)) == ["local"]
    write(tmp_path, GOOD).rename(tmp_path / "devices.toml")
    assert "tx2" in load_inventory(None, tmp_path)


def test_kind_profiles_hold_the_board_facts():
    tx2, pi = KIND_PROFILES["jetson-tx2"], KIND_PROFILES["rpi4"]
    assert (tx2.python, tx2.max_onnx_opset, tx2.power_sensors) == ("3.6", 15, ("ina3221",))
    assert "L4T 32.7" in tx2.os and "JetPack 4.6" in tx2.os
    assert pi.python == "3.11" and "bookworm" in pi.os and "hwmon" in pi.power_sensors


@pytest.mark.parametrize("table, field, hint", [
    ('kind = "jetson"\nhost = "h"\nuser = "u"',
     "] kind: unknown kind 'jetson'", "valid names: jetson-tx2, linux, local, rpi4"),
    ('kind = "rpi4"\nuser = "u"', "] host: missing field", "add host = …"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\nport = "22"', "] port: must be an integer, not '22'", "without quotes"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\nport = 70000',
     "] port: 70000 is out of range", "use a value between 1 and 65535"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\nhostname = "x"',
     "] hostname: unknown field", "did you mean 'host'? valid fields"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\npower_sensor = "ina999"',
     "] power_sensor: unknown power sensor 'ina999'", "ina3221"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\nruntimes = ["openvino"]',
     "] runtimes: unknown runtime 'openvino'", "onnxruntime"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\nworkdir = "../etc"',
     "] workdir: '../etc' contains '..'", "give a path inside"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\nworkdir = "~/em"', "] workdir: '~/em' uses ~", "not expanded"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\nkey_file = "nope"', "] key_file: no such file", "ssh-keygen"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\njetson_clocks = true', "] jetson_clocks:", "only a Jetson"),
    ('kind = "rpi4"\nhost = "h"\nuser = "u"\ntrust_on_first_use = "yes"',
     "] trust_on_first_use: must be true or false", "true or false"),
    ('kind = "local"\nhost = "h"', "] host: a local device has no host", "remove it"),
])
def test_bad_entry_names_file_device_and_field(tmp_path, table, field, hint):
    path = write(tmp_path, f"[devices.board7]\n{table}\n")
    with pytest.raises(ConfigError) as e:
        load_inventory(path, tmp_path)
    msg = str(e.value)
    # one wording: <file>: [devices.NAME] field: what is wrong; what to do
    assert msg.startswith(f"{path}: [devices.board7] ") and field in msg and hint in msg, msg


def test_local_name_is_reserved_and_bad_toml_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"\[devices.local\] is the built-in"):
        load_inventory(write(tmp_path, '[devices.local]\nkind = "local"\n'), tmp_path)
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_inventory(write(tmp_path, "[devices.x\n"), tmp_path)
    with pytest.raises(ConfigError, match="no such inventory file"):
        load_inventory(tmp_path / "missing.toml", tmp_path)
