"""The runner as the board gets it: one zipapp, the same bytes from the same sources, deployed under that digest;
and its measurement settings, each default declared once (the runner's table) and derived on the host."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from edgemask.devices.connection import LocalConnection
from edgemask.devices.deploy import deploy_runner
from edgemask.devices.inventory import local_device
from edgemask.devices.records import RunnerSettings
from edgemask.devices.remote.runner import options
from edgemask.devices.remote.runner.cli import build_parser
from edgemask.devices.runner_app import ARCHIVE_PACKAGE, RUNNER_PACKAGE, build_runner, runner_sources, runner_zipapp


def test_the_zipapp_is_the_same_bytes_from_the_same_sources(tmp_path):
    """Two builds agree byte for byte, also from a copy whose files have other times and were written in another
    order (zipfile's own defaults would stamp each member with its file's mtime)."""
    first, second = build_runner(), build_runner()
    assert first == second
    copy = tmp_path / "runner"
    copy.mkdir()
    for i, src in enumerate(reversed(runner_sources())):
        dst = copy / src.name
        shutil.copyfile(src, dst)
        os.utime(dst, (1_700_000_000 + 997 * i, 1_700_000_000 + 997 * i))
    (copy / "__pycache__").mkdir()
    (copy / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"not a source")
    assert build_runner(copy) == first
    with zipfile.ZipFile(copy.parent / "x.pyz", "w") as z:  # what a plain build would do: the mtimes go in
        for src in runner_sources(copy):
            z.write(src, f"{ARCHIVE_PACKAGE}/{src.name}")
    assert (copy.parent / "x.pyz").read_bytes() != first
    # and a changed room changes the bytes (and so the runner's content address)
    (copy / "options.py").write_text((copy / "options.py").read_text() + "\n")
    assert build_runner(copy) != first


def test_the_zipapp_holds_every_room_in_order_with_fixed_stamps():
    with zipfile.ZipFile(runner_zipapp()[0]) as z:
        infos = z.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names) and "__main__.py" in names
    assert {n for n in names if n.startswith(ARCHIVE_PACKAGE + "/")} == {
        f"{ARCHIVE_PACKAGE}/{p.name}" for p in RUNNER_PACKAGE.glob("*.py")}
    assert {(i.date_time, i.compress_type, i.external_attr >> 16) for i in infos} == {
        ((1980, 1, 1, 0, 0, 0), zipfile.ZIP_STORED, 0o644)}


def test_the_zipapp_runs_alone(tmp_path):
    """Copied away from the source tree and run with PYTHONPATH unset and the user's site off (-I): it imports
    nothing of ours from the host; only numpy and the runtime come from the interpreter."""
    pyz = tmp_path / "blobs" / "runner.pyz"
    pyz.parent.mkdir()
    shutil.copyfile(runner_zipapp()[0], pyz)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([sys.executable, "-I", str(pyz), "--probe"], capture_output=True, text=True, cwd=tmp_path,
                         env=env, timeout=300)
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["ok"] is True
    assert doc["runtimes"]["onnxruntime"].startswith("onnxruntime ")
    assert doc["disk_free_mb"] > 0  # measured where the zipapp lies (its folder, not inside the archive)
    bad = subprocess.run([sys.executable, "-I", str(pyz), "--format", "onnx"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert bad.returncode == 1 and json.loads(bad.stdout) == {"ok": False, "error": "--model is required"}
    # a person at the board asks for help: the usage on stdout, exit 0, no error document
    helped = subprocess.run([sys.executable, "-I", str(pyz), "--help"], capture_output=True, text=True, env=env,
                            timeout=60)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: runner ") and "--profile-layers" in helped.stdout


def test_deploy_sends_the_zipapp_under_its_sha256_and_checks_it(tmp_path):
    spec = local_device(tmp_path / "ws")
    conn = LocalConnection(spec)
    want = hashlib.sha256(build_runner()).hexdigest()
    remote = Path(deploy_runner(conn, spec))
    assert remote == Path(spec.workdir) / "blobs" / f"{want}.pyz" and conn.uploads == 1
    assert hashlib.sha256(remote.read_bytes()).hexdigest() == want
    assert deploy_runner(conn, spec) == str(remote) and conn.uploads == 1  # present: not sent again
    damaged = bytearray(remote.read_bytes())
    damaged[100] ^= 0xFF
    remote.write_bytes(bytes(damaged))  # the board's copy damaged: hashed, found, sent again
    assert deploy_runner(conn, spec) == str(remote) and conn.uploads == 2
    assert hashlib.sha256(remote.read_bytes()).hexdigest() == want


def test_every_runner_setting_is_one_field_whose_default_is_the_runners():
    fields = {f.name: f for f in dataclasses.fields(RunnerSettings)}
    assert set(fields) == {name for name, *_ in options.MEASUREMENT}
    for name, kind, default, _ in options.MEASUREMENT:
        assert fields[name].type == kind.__name__ and fields[name].default == default
    parsed = vars(build_parser().parse_args([]))
    assert {name: parsed[name] for name in fields} == dataclasses.asdict(RunnerSettings())


@pytest.mark.parametrize("settings", [
    RunnerSettings(),
    RunnerSettings(warmup_runs=3, warmup_seconds=0.25, min_runs=7, min_seconds=2.5, sample_min_ms=10.0, threads=4,
                   tolerance=2.5e-4, rtol=1e-3, power_rate_hz=20.0, idle_seconds=0.0, profile_layers=True, profile_warmup=2,
                   profile_runs=9),
])
def test_the_runner_reads_back_what_the_host_sends(settings):
    parsed = vars(build_parser().parse_args(settings.to_args()))
    got = {name: parsed[name] for name, *_ in options.MEASUREMENT}
    assert got == dataclasses.asdict(settings)


def test_profiling_off_sends_no_profiling_option():
    """A job without per-operator profiling keeps the runner's command as it was (profile_runs is only read when
    profile_layers is on, on both sides)."""
    args = RunnerSettings(profile_runs=9, profile_warmup=2).to_args()
    assert not any(a.startswith("--profile") for a in args)
    assert vars(build_parser().parse_args(args))["profile_layers"] is False


def test_a_stray_is_a_zipapp_of_this_workdirs_blobs(tmp_path):
    """The stray cleanup knows the runner by its deployed name, now ``<sha256>.pyz`` (``.py``: one deployed before)."""
    from edgemask.devices.remote.runner.session import is_our_runner

    blobs = tmp_path / "blobs"
    blobs.mkdir()
    ours = str(blobs / f"{'a' * 64}.pyz")
    assert is_our_runner(["python3", ours, "--model", "m.onnx"], str(blobs))
    assert is_our_runner(["python3", "-u", str(blobs / "old.py"), "--model", "m.onnx"], str(blobs))
    assert not is_our_runner(["python3", ours, "--probe"], str(blobs))  # not a benchmark run
    assert not is_our_runner(["python3", str(tmp_path / "x.pyz"), "--model", "m"], str(blobs))  # another folder
    assert not is_our_runner(["python3", str(blobs / "m.onnx"), "--model", "m"], str(blobs))
