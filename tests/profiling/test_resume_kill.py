"""A real campaign in a subprocess, killed with SIGKILL at random points, then resumed.

What is under test is the store's promise: every job reported as recorded before a kill is in the store,
no job is ever recorded twice, and the last run records exactly the jobs still missing.
"""

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

import pytest

import profiling_fakes as pf
from edgemask.profiling.campaign import parse_campaign, plan_jobs

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _start(ws: Path, toml: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    return subprocess.Popen([sys.executable, str(HERE / "campaign_child.py"), str(ws), str(toml)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _recorded(stdout: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in stdout.splitlines() if line.startswith("recorded ")]


def _store_ids(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return [r[0] for r in con.execute("SELECT job_id FROM measurements")]
    finally:
        con.close()


@pytest.mark.slow
def test_kill_9_at_random_points_then_resume(tmp_path):
    ws = pf.small_workspace(tmp_path / "ws", clients=("client-000", "client-001", "client-002"))
    toml = tmp_path / "campaign.toml"
    toml.write_text(pf.campaign_toml(name="killed", threads=(1, 2), repetitions=3))
    planned = {j.job_id for j in plan_jobs(parse_campaign(tomllib.loads(toml.read_text())), ws)}
    assert len(planned) == 4 * 2 * 2 * 2 * 3
    db = ws / "results" / "killed" / "results.sqlite"

    rng = random.Random(1234)
    reported: list[str] = []
    kills = 0
    in_store: list[str] = []
    # kill until most (not all) of the campaign is done: each run gets 0.03–0.3 s of a ~1.5 s campaign
    while kills < 5 and len(in_store) < 0.8 * len(planned):
        proc = _start(ws, toml)
        # wait until the child has committed its first job (imports and start-up take seconds on a busy
        # machine), then kill it somewhere inside the campaign
        assert proc.stdout.readline().strip() == "started", proc.stderr.read()
        first = ""
        while True:
            line = proc.stdout.readline()
            first += line
            if not line or line.startswith("recorded "):
                break
        time.sleep(rng.uniform(0.0, 0.3))
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        out = first + out
        if proc.returncode == -signal.SIGKILL:
            kills += 1
        reported += _recorded(out)
        in_store = _store_ids(db) if db.exists() else []
        assert len(in_store) == len(set(in_store))
        # every job reported before the kill survived it
        assert set(reported) <= set(in_store)
        # a committed job is never taken again by a later run
        assert not [j for j, n in Counter(reported).items() if n > 1]
    assert kills >= 3, "the child finished before it could be killed; the test proves nothing"

    before = set(_store_ids(db))
    assert before < planned, "kills left nothing to resume"
    proc = _start(ws, toml)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert out.strip().endswith("complete")
    last = _recorded(out)
    assert sorted(last) == sorted(planned - before)  # exactly the missing ones, each once
    # and nothing already stored was measured again (a job id without its repetition: "...|t1")
    ran = Counter(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("ran "))
    assert ran == Counter(j.rsplit("|", 1)[0] for j in planned - before)
    after = _store_ids(db)
    assert sorted(after) == sorted(planned)

    # every stored row is whole: its samples are the deterministic ones for its job
    con = sqlite3.connect(db)
    for artifact, fmt, threads, mjson in con.execute(
            "SELECT artifact, format, threads, measurement FROM measurements"):
        m = json.loads(mjson)
        assert tuple(m["latency_ms"]) == pf.expected_latency(artifact, fmt, threads)
