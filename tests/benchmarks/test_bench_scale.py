"""benchmarks/bench_scale.py: each paper setting's config at another device count keeps its own devices a round,
and the table says so from a run."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_scale  # noqa: E402

from edgemask.trainer.config import TrainConfig  # noqa: E402
from edgemask.trainer.sampling import clients_per_round  # noqa: E402


@pytest.mark.parametrize("case, devices, paper, kept", [
    ("fedmask", 2000, 400, 20),  # 0.05 of 2,000 would be 100
    ("fedmask", 100, 400, 20),
    ("fedmask", 7, 400, 7),  # fewer than a round: every device
    ("ic-emnist", 100, 2414, 20),
    ("har", 60, 30, 20),
    ("ncp", 20, 1129, 20),
    ("perfedmask", 50, 100, 50),  # c = 1: every device every round
    ("perfedmask-c01", 400, 100, 10),
    ("perfedmask-c01", 50, 100, 10),
    ("fedselect", 20, 10, 10),
])
def test_a_round_keeps_the_configs_own_devices(tmp_path, case, devices, paper, kept):
    base, cfg = bench_scale.case_config(case, devices, 0.5, 1, "cpu", tmp_path)
    assert base.data.num_clients == paper and cfg.data.num_clients == devices
    assert clients_per_round(devices, cfg.training.participation) == kept
    TrainConfig.from_dict(cfg.to_dict())  # still a valid config


def test_every_case_names_a_config_and_a_stand_in():
    for name, case in bench_scale.CASES.items():
        assert (ROOT / "configs" / case.config).is_file(), name
        assert case.data in ("cifar10", "femnist", "shakespeare", "har"), name


def test_a_width_scales_each_models_layer_sizes():
    assert bench_scale.scaled_args("char_lstm", {}, 0.25) == {"hidden": 64, "fc": (64, 32)}
    assert bench_scale.scaled_args("har_mlp", {"hidden": [100, 10]}, 0.5) == {"hidden": (50, 5)}
    assert bench_scale.scaled_args("vgg16", {}, 0.125) == {"width": 0.125}
    assert bench_scale.scaled_args("cnn", {}, 1) == {}
    with pytest.raises(SystemExit, match="cnn: no width to scale"):
        bench_scale.scaled_args("cnn", {}, 0.5)


@pytest.mark.slow
def test_two_device_counts_train_the_papers_twenty_a_round(tmp_path):
    """HAR's config (30 subjects, 20 a round) on a stand-in of 40 small subjects, at 25 and 40 devices: 20 train in
    each, and the printout says what was scaled down."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_scale.py"), "--cases", "har",
                        "--devices", "25,40", "--widths", "0.25", "--samples", "30", "--cache", str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout
    assert ("har (har-fedmask.toml, fedmask): devices 25 (20 a round), 40 (20 a round) of the paper's 30 (20 a round); "
            "samples per device 30 of the paper's 364; width 0.25 of 1 (har_mlp 0.25: {'hidden': (64, 32)}); "
            "rounds 1 of 100 (projected); data: har STAND-IN, 40 users × 30 samples") in out
    runs, peaks = out.split("Peak RSS (GB) while each phase ran")
    rows = [line.split(" | ") for line in runs.splitlines() if line.startswith("har | ")]
    assert [(r[1], r[2]) for r in rows] == [("25", "20"), ("40", "20")]
    # each phase's own peak: the run's peak is the largest of them (a reset high-water mark lowers ru_maxrss)
    phase = [line.split(" | ") for line in peaks.splitlines() if line.startswith("har | ")]
    assert [r[1] for r in phase] == ["25", "40"]
    for run, own in zip(rows, phase):
        assert float(own[3]) > 0 and run[-3] == max(own[3:], key=float)  # data's peak, and the run's
    assert (tmp_path / "har-40x30-s0" / "STANDIN.json").is_file()


def test_a_perfedmask_device_keeps_the_papers_600_samples(tmp_path):
    """PerFedMask's config leaves a device's samples to the partition (60,000 images over 100 devices): at 20
    devices each would take 3,000, so the benchmark caps them at the paper's 600; configs that fix them keep theirs."""
    caps = {case: bench_scale.case_config(case, 20, 0.5, 1, "cpu", tmp_path)[1].data.samples_per_client
            for case in ("perfedmask", "perfedmask-c01", "fedmask", "fedselect", "ic-emnist")}
    assert caps == {"perfedmask": 600, "perfedmask-c01": 600, "fedmask": 33, "fedselect": None, "ic-emnist": None}
