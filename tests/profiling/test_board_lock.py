"""Issue 27 item 6: one campaign holds a board at a time. Two `edgemask profile` processes of two campaigns on the
`local` device (one workdir, one board), with the real runner and a real ONNX model; --wait bounded at the door."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "devices"))
from artifacts import make_artifact  # noqa: E402
from processes import runner_pids, wait_until  # noqa: E402

import profiling_fakes as pf  # noqa: E402



def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    make_artifact(ws / "artifacts" / "run-test" / "client-007")
    return ws


def _toml(tmp_path: Path, name: str, reps: int, seconds: float) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(pf.real_campaign_toml(name, seconds=seconds, repetitions=reps))
    return path


def _profile(ws: Path, toml: Path, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "edgemask.cli", "profile", "--workspace", str(ws), "--campaign", str(toml),
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)


def _rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _finish(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()


@pytest.mark.parametrize("wait", ["nan", "-1", "inf", "1e9", "soon"])
def test_wait_is_bounded_at_the_door(tmp_path, wait):
    """A NaN would never time out; refused before anything is read or taken."""
    from edgemask.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["profile", "--workspace", str(tmp_path / "ws"), "--campaign", str(tmp_path / "none.toml"),
              "--wait", wait])
    assert e.value.code == 2
    assert not (tmp_path / "ws").exists()


@pytest.mark.slow
def test_a_second_campaign_on_a_held_board_is_refused_naming_the_holder(tmp_path):
    ws = _workspace(tmp_path)
    first = _profile(ws, _toml(tmp_path, "first", reps=2, seconds=2.0))
    second = None
    try:
        wait_until(lambda: runner_pids(ws / "devices" / "local" / "blobs") or first.poll() is not None, 120,
                   "the first campaign's runner")
        assert first.poll() is None
        second = _profile(ws, _toml(tmp_path, "second", reps=1, seconds=0.2))
        out2, err2 = second.communicate(timeout=120)
        out1, err1 = first.communicate(timeout=300)
    finally:
        _finish(first, *([second] if second else []))
    # the old code: the second campaign killed the first's runner as a stray ("runner exited with rc=-15 and no
    # result") and timed its own model beside the first's
    assert second.returncode == 2, (out2, err2)
    [line] = [ln for ln in err2.splitlines() if ln.strip()]
    assert line.startswith("edgemask profile: error: local: board held by campaign 'first' of host ")
    assert f"pid {first.pid} since " in line and f"(lock {ws / 'devices' / 'local' / 'board.lock'} on the board)" \
        in line and "wait for it with --wait SECONDS" in line
    assert first.returncode == 0, (out1, err1)
    assert "(2 measured, 0 already there, 0 failed, 0 skipped)" in out1 and "stray" not in out1
    assert _rows(ws / "results" / "first" / "results.sqlite", "SELECT COUNT(*) FROM failures") == [(0,)]
    assert _rows(ws / "results" / "second" / "results.sqlite", "SELECT COUNT(*) FROM measurements") == [(0,)]


@pytest.mark.slow
def test_a_second_campaign_with_wait_runs_after_the_first(tmp_path):
    ws = _workspace(tmp_path)
    first = _profile(ws, _toml(tmp_path, "first", reps=2, seconds=1.5))
    second = None
    try:
        wait_until(lambda: runner_pids(ws / "devices" / "local" / "blobs") or first.poll() is not None, 120,
                   "the first campaign's runner")
        second = _profile(ws, _toml(tmp_path, "second", reps=1, seconds=0.2), "--wait", "240")
        out1, err1 = first.communicate(timeout=300)
        out2, err2 = second.communicate(timeout=300)
    finally:
        _finish(first, *([second] if second else []))
    assert first.returncode == 0 and "(2 measured, 0 already there, 0 failed, 0 skipped)" in out1, (out1, err1)
    assert second.returncode == 0 and "(1 measured, 0 already there, 0 failed, 0 skipped)" in out2, (out2, err2)
    assert "waiting for board local: held by campaign 'first' of host " in err2  # the progress while it waits
    # the second measured only once the first had let the board go: no overlap of their timed windows
    [(first_last,)] = _rows(ws / "results" / "first" / "results.sqlite", "SELECT MAX(recorded_at) FROM measurements")
    [(second_only,)] = _rows(ws / "results" / "second" / "results.sqlite", "SELECT MIN(recorded_at) FROM measurements")
    assert second_only > first_last


@pytest.mark.slow
def test_a_killed_campaign_frees_the_board(tmp_path):
    ws = _workspace(tmp_path)
    first = _profile(ws, _toml(tmp_path, "first", reps=3, seconds=3.0))
    lock = ws / "devices" / "local" / "board.lock"
    try:
        wait_until(lambda: runner_pids(ws / "devices" / "local" / "blobs") or first.poll() is not None, 120,
                   "the first campaign's runner")
        holder = json.loads(lock.read_text())
        assert holder["campaign"] == "first" and holder["pid"] == first.pid and len(holder["token"]) == 16
        os.killpg(first.pid, signal.SIGKILL)  # the host dies: no cleanup of its own runs
        first.communicate()
    finally:
        _finish(first)
    second = _profile(ws, _toml(tmp_path, "second", reps=1, seconds=0.2), "--wait", "30")
    out2, err2 = second.communicate(timeout=300)
    assert second.returncode == 0 and "(1 measured, 0 already there, 0 failed, 0 skipped)" in out2, (out2, err2)
    assert json.loads(lock.read_text())["campaign"] == "second"
