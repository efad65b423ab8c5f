"""Issue 27 item 6 over SSH: one campaign holds a board at a time, by a lock on the board itself. Two `edgemask
profile` processes against one real OpenSSH stand-in device (the `sshd` fixture), as two hosts would drive one
board; and the stray cleanup that never kills another campaign's runner."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from artifacts import make_artifact
from processes import runner_pids, wait_until

from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.board import BOARD, BoardHold, reap_strays
from edgemask.devices.connection import open_connection
from edgemask.devices.errors import BoardBusy, DeviceError
from edgemask.devices.records import RunnerSettings

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
sys.path.insert(0, str(ROOT / "tests" / "profiling"))
import profiling_fakes as pf  # noqa: E402


def _setup(tmp_path: Path, sshd) -> tuple[Path, Path, object]:
    spec = sshd.spec(tmp_path)
    ws = tmp_path / "ws"
    make_artifact(ws / "artifacts" / "run-test" / "client-007")
    inv = tmp_path / "devices.toml"
    inv.write_text(f"""
[devices.stand-in]
kind = "linux"
host = "{spec.host}"
port = {spec.port}
user = "{spec.user}"
key_file = "{spec.key_file}"
known_hosts = "{spec.known_hosts}"
python = "{spec.python}"
workdir = "{spec.workdir}"
runtimes = ["onnxruntime"]
""")
    return ws, inv, spec


def _profile(ws: Path, inv: Path, tmp_path: Path, name: str, reps: int, seconds: float, extra: tuple = ()):
    toml = tmp_path / f"{name}.toml"
    toml.write_text(pf.real_campaign_toml(name, seconds=seconds, repetitions=reps, device="stand-in"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "edgemask.cli", "profile", "--workspace", str(ws), "--campaign",
                             str(toml), "--inventory", str(inv), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True)


def _finish(*procs) -> None:
    for p in procs:
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


def _count(db: Path, sql: str) -> int:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def test_two_campaigns_over_ssh_the_second_is_refused_naming_the_holder(sshd, tmp_path):
    ws, inv, spec = _setup(tmp_path, sshd)
    blobs = Path(spec.workdir) / "blobs"
    first = _profile(ws, inv, tmp_path, "first", reps=2, seconds=2.0)
    second = None
    try:
        wait_until(lambda: runner_pids(blobs) or first.poll() is not None, 120, "the first campaign's runner")
        assert first.poll() is None
        second = _profile(ws, inv, tmp_path, "second", reps=1, seconds=0.2)
        out2, err2 = second.communicate(timeout=120)
        out1, err1 = first.communicate(timeout=300)
    finally:
        _finish(first, second)
    # the old code: the second killed the first's runner as a stray, and timed beside it
    assert second.returncode == 2, (out2, err2)
    [line] = [ln for ln in err2.splitlines() if ln.strip()]
    assert line.startswith("edgemask profile: error: stand-in: board held by campaign 'first' of host ")
    assert f"pid {first.pid} since " in line and f"(lock {spec.workdir}/board.lock on the board)" in line
    assert first.returncode == 0 and "(2 measured, 0 already there, 0 failed, 0 skipped)" in out1, (out1, err1)
    assert _count(ws / "results" / "first" / "results.sqlite", "SELECT COUNT(*) FROM failures") == 0


def test_a_host_killed_over_ssh_frees_the_board(sshd, tmp_path):
    ws, inv, spec = _setup(tmp_path, sshd)
    blobs = Path(spec.workdir) / "blobs"
    first = _profile(ws, inv, tmp_path, "first", reps=3, seconds=3.0)
    try:
        wait_until(lambda: runner_pids(blobs) or first.poll() is not None, 120, "the first campaign's runner")
        assert json.loads((Path(spec.workdir) / "board.lock").read_text())["campaign"] == "first"
        os.killpg(first.pid, signal.SIGKILL)  # the host dies: its SSH sessions close, nothing of it cleans up
        first.communicate()
    finally:
        _finish(first)
    second = _profile(ws, inv, tmp_path, "second", reps=1, seconds=0.2, extra=("--wait", "30"))
    out2, err2 = second.communicate(timeout=300)
    assert second.returncode == 0 and "(1 measured, 0 already there, 0 failed, 0 skipped)" in out2, (out2, err2)


def test_stray_cleanup_never_kills_the_runner_of_the_campaign_that_holds_the_board(sshd, tmp_path):
    """The holder's runner is timing; a caller whose token is not the lock's (a second campaign's stale hold)
    asks for a stray cleanup: nothing is killed, the holder's measurement completes."""
    ws, _, spec = _setup(tmp_path, sshd)
    art = ws / "artifacts" / "run-test" / "client-007"
    holder = {"host": "host-a", "pid": 1, "campaign": "first", "since": "2026-11-25T13:00:00+00:00",
              "token": "a" * 16}
    with open_connection(spec) as lock_conn, open_connection(spec) as conn, open_connection(spec) as other:
        hold = BOARD.hold(lock_conn, spec, holder)
        try:
            with pytest.raises(BoardBusy, match=r"board held by campaign 'first' of host host-a pid 1"):
                BOARD.hold(other, spec, {**holder, "campaign": "second", "token": "b" * 16})
            result = {}
            t = threading.Thread(target=lambda: result.update(m=run_benchmark(
                conn, spec, art, "onnx", settings=RunnerSettings(min_runs=20, min_seconds=3.0, warmup_seconds=0,
                                                                 idle_seconds=0))))
            t.start()
            wait_until(lambda: runner_pids(Path(spec.workdir) / "blobs"), 60, "the holder's runner")
            stale = BoardHold(hold.started, {**holder, "token": "b" * 16}, hold.path)  # not the lock's token
            with pytest.raises(DeviceError, match=r"stray runners not reaped: the board lock .* is held by "
                                                  r"campaign 'first' of host-a pid 1, not by the caller"):
                reap_strays(other, spec, hold=stale)
            assert runner_pids(Path(spec.workdir) / "blobs")  # still timing
            t.join(120)
            assert result["m"].ok, result["m"].error  # measured to the end: nobody killed it
            assert reap_strays(other, spec, hold=hold) == []  # the holder's own cleanup: nothing left to kill
        finally:
            hold.release()
    wait_until(lambda: not runner_pids(Path(spec.workdir) / "blobs"), 10, "no runner left")
