"""A runner dies with its session; stray runners are killed before timing; the inventory's governor is applied
for a campaign and the board's own settings put back. Real sshd stand-in, real runner, a fake cpufreq tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from artifacts import make_artifact
from processes import runner_pids, wait_until

from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.board import BOARD, SettingsRefused, reap_strays
from edgemask.devices.connection import open_connection
from edgemask.devices.deploy import deploy_runner
from edgemask.devices.errors import RunTimeout
from edgemask.devices.inventory import local_device
from edgemask.devices.records import Measurement, RunnerSettings
from edgemask.profiling.campaign import parse_campaign, run_campaign
from edgemask.profiling.store import ResultsStore

ROOT = Path(__file__).resolve().parents[2]
LONG = RunnerSettings(warmup_runs=1, warmup_seconds=0.0, min_runs=10, min_seconds=60.0, idle_seconds=0.0)


@pytest.fixture
def board(sshd, tmp_path):
    """The sshd stand-in without a power sensor, a real ONNX artifact, and the stand-in's blobs folder."""
    spec = sshd.spec(tmp_path, power_sensor="none")
    return spec, make_artifact(tmp_path / "art"), Path(spec.workdir) / "blobs"


@pytest.mark.fleet
@pytest.mark.slow
def test_an_ssh_timeout_leaves_no_runner_on_the_board(board):
    spec, art, blobs = board
    with open_connection(spec) as conn:
        with pytest.raises(RunTimeout):
            run_benchmark(conn, spec, art, "onnx", settings=LONG, timeout=4.0)
    # the old runner timed on for its 60 s beside whatever ran next
    wait_until(lambda: not runner_pids(blobs), 5.0, "the timed-out runner to exit")


_HOST = """
import json, sys
from pathlib import Path
from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.connection import open_connection
from edgemask.devices.inventory import DeviceSpec
from edgemask.devices.records import RunnerSettings
kw = json.loads(sys.argv[1])
kw.update(key_file=Path(kw["key_file"]), known_hosts=Path(kw["known_hosts"]), runtimes=tuple(kw["runtimes"]))
spec = DeviceSpec(**kw)
with open_connection(spec) as conn:
    run_benchmark(conn, spec, Path(sys.argv[2]), "onnx", settings=RunnerSettings(**json.loads(sys.argv[3])))
"""


@pytest.mark.fleet
@pytest.mark.slow
def test_killing_the_host_leaves_no_runner_on_the_board(board):
    spec, art, blobs = board
    kw = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()}
    host = subprocess.Popen([sys.executable, "-c", _HOST, json.dumps(kw), str(art), json.dumps(asdict(LONG))],
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), stderr=subprocess.PIPE)
    try:
        wait_until(lambda: runner_pids(blobs) or host.poll() is not None, 60, "the runner to start")
        assert host.poll() is None, host.stderr.read()
        time.sleep(1.0)
        host.kill()  # kill -9: nothing of the host's code runs
        host.wait(timeout=10)
    finally:
        if host.poll() is None:
            host.kill()
    wait_until(lambda: not runner_pids(blobs), 10.0, "the orphaned runner to exit")


def _stray(runner: str, model: Path, sample: Path) -> subprocess.Popen:
    """A runner as an old session left it: detached, no watchdog, timing for a minute."""
    return subprocess.Popen([sys.executable, runner, "--model", str(model), "--format", "onnx", "--sample-io",
                             str(sample), "--min-seconds", "60", "--idle-seconds", "0", "--power-sensor", "none"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


@pytest.mark.fleet
@pytest.mark.slow
def test_a_campaign_kills_our_stray_runner_before_timing_and_nothing_else(sshd, tmp_path):
    ws = tmp_path / "ws"
    art = make_artifact(ws / "artifacts" / "run-test" / "client-007")
    spec = sshd.spec(tmp_path, power_sensor="none")
    with open_connection(spec) as conn:
        runner = deploy_runner(conn, spec)
    decoy_script = tmp_path / "elsewhere" / "runner.pyz"  # a runner of another workdir: not ours to kill
    decoy_script.parent.mkdir()
    decoy_script.write_bytes(Path(runner).read_bytes())
    stray = _stray(runner, art / "model.onnx", art / "sample_io.npz")
    decoy = _stray(str(decoy_script), art / "model.onnx", art / "sample_io.npz")
    try:
        cfg = parse_campaign({
            "campaign": {"name": "strays", "formats": ["onnx"], "devices": [spec.name], "timeout_s": 60},
            "artifacts": [{"run": "run-test", "clients": ["client-007"], "dense": False}],
            "runner": {"warmup_runs": 1, "warmup_seconds": 0.0, "min_runs": 5, "min_seconds": 0.05,
                       "idle_seconds": 0.0},
        })
        res = run_campaign(cfg, ws, progress=False, inventory={spec.name: spec})
        assert res.complete, res
        assert stray.wait(timeout=10) is not None  # killed (the old code let it time on beside the job)
        assert decoy.poll() is None  # another workdir's runner is left alone
        [note] = res.notes
        assert f"killed 1 stray runner(s) left on the board (pid {stray.pid})" in note
        with ResultsStore.open(res.store_path) as store:
            [event] = store.events(spec.name, "stray_runners")
        [found] = event["detail"]["found"]
        assert found["pid"] == stray.pid and found["killed"] and "--model" in found["argv"]
    finally:
        for p in (stray, decoy):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_reap_strays_finds_nothing_on_a_clean_board(tmp_path):
    spec = local_device(tmp_path / "ws")
    with open_connection(spec) as conn:
        assert reap_strays(conn, spec) == []


# ------------------------------------------------------------------------------------------------
# governor: a fake cpufreq tree read and written by the real runner (EDGEMASK_SYSFS_ROOT)
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def cpufreq(fake_root, monkeypatch):
    for cpu, gov in (("cpu0", "ondemand"), ("cpu1", "ondemand"), ("cpu2", "schedutil")):
        fake_root(f"sys/devices/system/cpu/{cpu}/cpufreq/scaling_governor", gov)
        fake_root(f"sys/devices/system/cpu/{cpu}/cpufreq/scaling_available_governors",
                  "performance ondemand schedutil powersave")
    monkeypatch.setenv("EDGEMASK_SYSFS_ROOT", str(fake_root.root))  # the runner subprocess inherits it
    root = fake_root.root / "sys/devices/system/cpu"

    def governors() -> dict[str, str]:
        return {cpu: (root / cpu / "cpufreq/scaling_governor").read_text().strip()
                for cpu in ("cpu0", "cpu1", "cpu2")}

    return governors


def _campaign(tmp_path, spec, bench):
    ws = tmp_path / "ws"
    make_artifact(ws / "artifacts" / "run-test" / "client-007")
    cfg = parse_campaign({
        "campaign": {"name": "gov", "formats": ["onnx"], "devices": [spec.name], "repetitions": 2},
        "artifacts": [{"run": "run-test", "clients": ["client-007"], "dense": False}],
    })
    return ws, lambda: run_campaign(cfg, ws, progress=False, inventory={spec.name: spec}, benchmark=bench,
                                    board=BOARD)


def _bench(seen: list, governors, fail: bool = False):
    def bench(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
        seen.append(governors())
        if fail:
            raise ValueError("a bug in the middle of the campaign")
        return Measurement(device=spec.name, artifact="run-test/client-007", format=fmt, variant=variant,
                           threads=1, ok=True, latency_ms=(1.0,), timed_window_s=0.001)
    return bench


BOARD_BEFORE = {"cpu0": "ondemand", "cpu1": "ondemand", "cpu2": "schedutil"}


def test_the_governor_is_applied_for_the_campaign_recorded_and_restored(tmp_path, cpufreq):
    spec = local_device(tmp_path / "ws", governor="performance")
    seen: list = []
    ws, run = _campaign(tmp_path, spec, _bench(seen, cpufreq))
    res = run()
    assert res.complete
    # the old code validated `governor` and never used it: the jobs ran under ondemand/schedutil
    assert seen == [{"cpu0": "performance", "cpu1": "performance", "cpu2": "performance"}] * 2
    assert cpufreq() == BOARD_BEFORE  # put back afterwards, per CPU
    with ResultsStore.open(res.store_path) as store:
        [applied] = store.events("local", "settings_applied")
        [restored] = store.events("local", "settings_restored")
    assert applied["detail"]["actual"]["governor"] == {"cpu0": "performance", "cpu1": "performance",
                                                       "cpu2": "performance"}
    assert applied["detail"]["before"]["governor"] == BOARD_BEFORE
    assert restored["detail"] == {"governor": BOARD_BEFORE}
    assert any("set governor performance" in n for n in res.notes)


def test_the_governor_is_restored_when_the_campaign_fails(tmp_path, cpufreq):
    spec = local_device(tmp_path / "ws", governor="powersave")
    seen: list = []
    _, run = _campaign(tmp_path, spec, _bench(seen, cpufreq, fail=True))
    with pytest.raises(ValueError, match="a bug"):
        run()
    assert seen == [{"cpu0": "powersave", "cpu1": "powersave", "cpu2": "powersave"}]
    assert cpufreq() == BOARD_BEFORE


def test_after_a_killed_campaign_the_next_one_restores_the_boards_own_settings(tmp_path, cpufreq):
    spec = local_device(tmp_path / "ws", governor="performance")
    seen: list = []
    ws, run = _campaign(tmp_path, spec, _bench(seen, cpufreq))
    # a campaign killed with -9 after applying: the board is left on performance, the store knows what it had
    store = ResultsStore.open(ws / "results" / "gov" / "results.sqlite")
    store.record_event("local", "settings_applied", {"before": {"governor": BOARD_BEFORE}, "actual": {}})
    store.close()
    with open_connection(spec) as conn:
        BOARD.apply(conn, spec)
    assert set(cpufreq().values()) == {"performance"}
    run()
    assert cpufreq() == BOARD_BEFORE  # not "performance", which the board showed when this campaign began


def test_a_refused_governor_stops_that_board_with_the_sudoers_line(tmp_path, cpufreq, fake_root):
    gov = fake_root.root / "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor"
    gov.unlink()
    gov.mkdir()  # unwritable, even for root
    spec = local_device(tmp_path / "ws", governor="performance")
    seen: list = []
    _, run = _campaign(tmp_path, spec, _bench(seen, dict))
    res = run()
    assert seen == [] and not res.complete  # no job timed under settings other than asked
    why = res.aborted["local"]
    assert why.startswith("SettingsRefused: local: cannot set the CPU governor")
    assert "NOPASSWD: /usr/bin/tee /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor" in why
    assert "remove the field from [devices.local]" in why


def test_a_refusal_puts_back_what_was_already_changed(tmp_path, cpufreq, fake_root):
    gov = fake_root.root / "sys/devices/system/cpu/cpu2/cpufreq/scaling_governor"
    gov.unlink()
    gov.mkdir()
    spec = local_device(tmp_path / "ws", governor="performance")
    with open_connection(spec) as conn, pytest.raises(SettingsRefused):
        BOARD.apply(conn, spec)
    root = fake_root.root / "sys/devices/system/cpu"
    assert [(root / f"{c}/cpufreq/scaling_governor").read_text().strip() for c in ("cpu0", "cpu1")] == \
        ["ondemand", "ondemand"]


def test_jetson_clocks_is_stored_applied_and_restored(tmp_path, monkeypatch):
    # a stand-in for L4T's jetson_clocks: --store/--restore a state file, no argument = maximum clocks
    clocks = tmp_path / "clocks"
    clocks.write_text("emc 1600 MHz, cpu 1420 MHz\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "jetson_clocks"
    fake.write_text(f"""#!/bin/sh
case "$1" in
  --store) cp {clocks} "$2" ;;
  --restore) cp "$2" {clocks} ;;
  --show) cat {clocks} ;;
  "") echo "emc 1866 MHz, cpu 2000 MHz" > {clocks} ;;
  *) exit 2 ;;
esac
""")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    spec = local_device(tmp_path / "ws", jetson_clocks=True)  # the inventory allows it on a Jetson only
    with open_connection(spec) as conn:
        applied = BOARD.apply(conn, spec)
        assert clocks.read_text() == "emc 1866 MHz, cpu 2000 MHz\n"
        assert applied["actual"] == {"jetson_clocks": True, "jetson_clocks_show": "emc 1866 MHz, cpu 2000 MHz"}
        assert BOARD.restore(conn, spec, applied) == {"jetson_clocks": False}
    assert clocks.read_text() == "emc 1600 MHz, cpu 1420 MHz\n"
