"""The README's example files under configs/ load through the real loaders, with the values they show."""

from __future__ import annotations

from pathlib import Path

from edgemask.devices.inventory import load_inventory
from edgemask.profiling.campaign import load_campaign

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def test_example_inventory_loads_with_pinned_host_keys(tmp_path):
    inv = load_inventory(CONFIGS / "devices.example.toml", tmp_path)
    assert sorted(inv) == ["local", "rpi4-a", "tx2-a"]
    pi, tx2 = inv["rpi4-a"], inv["tx2-a"]
    assert (pi.kind, pi.host, pi.user, pi.port) == ("rpi4", "192.168.1.41", "pi", 22)
    assert (tx2.kind, tx2.host, tx2.user) == ("jetson-tx2", "192.168.1.40", "nvidia")
    # host keys pinned in a file beside the inventory, unknown keys refused
    assert pi.known_hosts == tx2.known_hosts == CONFIGS / "known_hosts"
    assert not pi.trust_on_first_use and not tx2.trust_on_first_use
    assert pi.key_file is None  # the SSH agent
    assert tx2.runtimes == ("onnxruntime", "tensorrt") and tx2.jetson_clocks and tx2.power_sensor == "ina3221"
    assert pi.can_run("tflite") and not tx2.can_run("tflite")
    assert tx2.can_run("trt") and not pi.can_run("trt") and pi.torch_index == "https://download.pytorch.org/whl/cpu"


def test_example_campaign_loads_against_the_example_inventory(tmp_path):
    inv = load_inventory(CONFIGS / "devices.example.toml", tmp_path)
    cfg = load_campaign(CONFIGS / "campaign.example.toml", known_devices=list(inv))
    assert cfg.name == "boards" and cfg.devices == ("rpi4-a", "tx2-a")
    assert cfg.formats == ("onnx", "tflite") and cfg.variants == ("fp32",) and cfg.threads == (1, 4)
    assert [(a.run, a.clients, a.dense) for a in cfg.artifacts] == [("demo-fedmask", None, True),
                                                                     ("demo-fedavg", (), True)]
    assert (cfg.runner.min_runs, cfg.runner.min_seconds, cfg.repetitions) == (300, 5.0, 3)
