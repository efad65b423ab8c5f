"""`edgemask profile` as a user runs it, on the local device with the real runner and a real ONNX model:
Ctrl-C mid-job, then resume; two at once on one campaign.

Ctrl-C is sent as a terminal sends it: SIGINT to the command's whole process group.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "devices"))
from artifacts import make_artifact  # noqa: E402
from processes import runner_pids, wait_until  # noqa: E402

import profiling_fakes as pf  # noqa: E402

pytestmark = pytest.mark.slow


def _workspace(tmp_path: Path, name: str, seconds: float) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    make_artifact(ws / "artifacts" / "run-test" / "client-007")
    toml = tmp_path / "campaign.toml"
    toml.write_text(pf.real_campaign_toml(name, seconds=seconds))
    return ws, toml


def _profile(ws: Path, toml: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "edgemask.cli", "profile", "--workspace", str(ws),
                             "--campaign", str(toml)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT, start_new_session=True)


def _runners(ws: Path) -> list[int]:
    """pids of benchmark runners deployed in this workspace's local device."""
    return runner_pids(ws / "devices" / "local" / "blobs")


def _rows(db: Path, sql: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_ctrl_c_mid_job_then_resume_measures_that_job(tmp_path):
    ws, toml = _workspace(tmp_path, "ctrl-c", seconds=3.0)
    proc = _profile(ws, toml)
    try:
        wait_until(lambda: _runners(ws) or proc.poll() is not None, 120, "the first runner to start")
        time.sleep(1.0)  # mid-job: the timed window lasts 3 s
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, (out, err)
    assert "interrupted" in err and "Traceback" not in err
    wait_until(lambda: not _runners(ws), 10, "no runner left")
    db = ws / "results" / "ctrl-c" / "results.sqlite"
    job = "run-test/client-007|onnx|fp32|local|t1|r0"
    # the old code stored this job ok = 0 ("runner exited with rc=-2") and its resume said "already there"
    assert _rows(db, "SELECT job_id FROM measurements") == []
    assert _rows(db, "SELECT job_id, status FROM failures") == [(job, "interrupted")]

    again = _profile(ws, toml)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, (out, err)
    assert "(2 measured, 0 already there, 0 failed, 0 skipped)" in out
    rows = _rows(db, "SELECT job_id, status, ok FROM measurements ORDER BY job_id")
    assert rows == [(job, "measured", 1), (job.replace("|r0", "|r1"), "measured", 1)]  # each once, both good
    assert _rows(db, "SELECT COUNT(*) FROM failures") == [(1,)]  # the interruption stays in the history


def test_a_refusing_runner_gives_a_non_zero_exit_and_1_failed(tmp_path):
    ws = tmp_path / "ws"
    art = make_artifact(ws / "artifacts" / "run-test" / "client-007", perturb_output=0.5)  # output check fails
    assert art.is_dir()
    toml = tmp_path / "campaign.toml"
    toml.write_text(pf.real_campaign_toml("refused", seconds=0.05, repetitions=1))
    proc = _profile(ws, toml)
    out, err = proc.communicate(timeout=300)
    # the old code printed "1 measured, 0 failed" and exited 0
    assert proc.returncode == 1, (out, err)
    assert "(0 measured, 0 already there, 1 failed, 0 skipped)" in out
    assert "failed: run-test/client-007|onnx|fp32|local|t1|r0: output differs from sample_io" in out


def test_two_profiles_of_one_campaign_the_second_leaves_with_one_line(tmp_path):
    ws, toml = _workspace(tmp_path, "twice", seconds=1.5)
    first = _profile(ws, toml)
    try:
        wait_until(lambda: _runners(ws) or first.poll() is not None, 120, "the first campaign's runner")
        second = _profile(ws, toml)
        out2, err2 = second.communicate(timeout=120)
        out1, err1 = first.communicate(timeout=300)
    finally:
        for p in (first,):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    # the old code measured every job twice, each under the other's load
    assert second.returncode == 2, (out2, err2)
    [line] = [ln for ln in err2.splitlines() if ln.strip()]
    assert "campaign 'twice' is in use by another edgemask process" in line and "campaign.lock" in line
    assert first.returncode == 0, (out1, err1)
    assert "(2 measured, 0 already there, 0 failed, 0 skipped)" in out1
    db = ws / "results" / "twice" / "results.sqlite"
    assert _rows(db, "SELECT COUNT(*), COUNT(DISTINCT job_id) FROM measurements") == [(2, 2)]
