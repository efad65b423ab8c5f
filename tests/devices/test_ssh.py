"""The SSH harness against a real OpenSSH server (a stand-in device on 127.0.0.1)."""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from artifacts import make_artifact

from edgemask.devices.benchmark import run_benchmark
from edgemask.devices.connection import open_connection
from edgemask.devices.connection_ssh import SSHConnection
from edgemask.devices.deploy import deploy, remote_path
from edgemask.devices.errors import DeviceError, HostKeyError, RunTimeout
from edgemask.devices.probe import check_device
from edgemask.devices.records import RunnerSettings

pytestmark = pytest.mark.fleet

ECHO_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


def nasty_args(marker_dir: Path) -> list[str]:
    return ["a b", "it's", 'say "hi"', f"$(touch {marker_dir}/pwned1)", f"`touch {marker_dir}/pwned2`",
            f"; touch {marker_dir}/pwned3", "*", "~", "$HOME", "back\\slash", "new\nline", "", "-c", "&&|<>"]


def test_nasty_arguments_reach_the_remote_program_verbatim(sshd, tmp_path):
    args = nasty_args(tmp_path)
    with open_connection(sshd.spec(tmp_path)) as conn:
        res = conn.run([sys.executable, "-c", ECHO_ARGV, *args], timeout=20)
    assert res.rc == 0, res.stderr
    assert json.loads(res.stdout) == args
    assert not list(tmp_path.glob("pwned*"))  # nothing was expanded by the remote shell


def test_unknown_host_key_is_refused_and_not_recorded(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text("")
    spec = sshd.spec(tmp_path, known_hosts=known)
    with pytest.raises(HostKeyError) as e:
        open_connection(spec).run(["true"])
    msg = str(e.value)
    assert f"ssh-keyscan -p {sshd.port} 127.0.0.1 >> {known}" in msg
    assert "stand-in" in msg and "trust_on_first_use" in msg
    assert known.read_text() == ""


def test_changed_host_key_is_refused_even_with_trust_on_first_use(sshd, tmp_path):
    from conftest import keygen

    other = keygen(tmp_path / "impostor").split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n")
    for tofu in (False, True):
        spec = sshd.spec(tmp_path, known_hosts=known, trust_on_first_use=tofu)
        with pytest.raises(HostKeyError, match="CHANGED") as e:
            open_connection(spec).run(["true"])
        assert f"ssh-keygen -R '[127.0.0.1]:{sshd.port}'" in str(e.value)
    assert known.read_text().count("\n") == 1  # the recorded key was not replaced


def test_trust_on_first_use_records_the_real_host_key(sshd, tmp_path):
    known = tmp_path / "sub" / "known_hosts"
    spec = sshd.spec(tmp_path, known_hosts=known, trust_on_first_use=True)
    with open_connection(spec) as conn:
        assert conn.run(["true"]).rc == 0
    assert known.read_text() == sshd.known_hosts_line()
    # the recorded key now lets a strict connection in
    with open_connection(replace(spec, trust_on_first_use=False)) as conn:
        assert conn.run([sys.executable, "-c", "print(6*7)"]).stdout.strip() == "42"


def test_wrong_client_key_fails_fast_with_a_fix(sshd, tmp_path):
    from conftest import keygen

    keygen(tmp_path / "stranger")
    spec = sshd.spec(tmp_path, key_file=tmp_path / "stranger")
    conn = SSHConnection(spec, retries=3, backoff_s=2.0)
    t0 = time.monotonic()
    with pytest.raises(DeviceError, match="authorized_keys"):
        conn.run(["true"])
    assert time.monotonic() - t0 < 2.0  # authentication failures are not retried


def test_closed_port_is_retried_then_reported(sshd, tmp_path):
    from conftest import free_port

    spec = sshd.spec(tmp_path, port=free_port())
    with pytest.raises(DeviceError, match=r"cannot connect after 3 attempts") as e:
        SSHConnection(spec, retries=2, backoff_s=0.01).run(["true"])
    assert "127.0.0.1" in str(e.value)


def test_remote_timeout_raises_run_timeout(sshd, tmp_path):
    with open_connection(sshd.spec(tmp_path)) as conn:
        t0 = time.monotonic()
        with pytest.raises(RunTimeout):
            conn.run(["sleep", "5"], timeout=0.5)
        assert time.monotonic() - t0 < 3
        assert conn.run(["true"]).rc == 0  # the connection is still usable


def test_large_stderr_and_stdout_do_not_deadlock(sshd, tmp_path):
    code = "import sys; sys.stderr.write('e' * 3000000); sys.stdout.write('o' * 3000000)"
    with open_connection(sshd.spec(tmp_path)) as conn:
        res = conn.run([sys.executable, "-c", code], timeout=30)
    assert (len(res.stdout), len(res.stderr), res.rc) == (3000000, 3000000, 0)


def test_deploy_sends_once_and_resends_a_corrupted_blob(sshd, tmp_path):
    # a workdir with a space and quotes: every remote argument must be quoted
    spec = sshd.spec(tmp_path, workdir=str(tmp_path / "work dir 'q' \"dq\""))
    blob = tmp_path / "model.onnx"
    blob.write_bytes(os.urandom(100_000))
    digest = hashlib.sha256(blob.read_bytes()).hexdigest()
    with open_connection(spec) as conn:
        path = deploy(conn, spec, blob)
        assert path == remote_path(spec, "blobs", f"{digest}.onnx")
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == digest
        inode = os.stat(path).st_ino
        assert deploy(conn, spec, blob) == path
        assert conn.uploads == 1 and os.stat(path).st_ino == inode
        Path(path).write_bytes(b"garbage")  # a blob whose bytes are wrong is replaced
        assert deploy(conn, spec, blob) == path
        assert conn.uploads == 2
        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == digest


def test_transfer_cut_midway_never_leaves_the_real_name(sshd, tmp_path, cutting_proxy):
    blob = tmp_path / "big.pte"
    blob.write_bytes(os.urandom(3_000_000))
    proxy = cutting_proxy(sshd.port, cut_after=600_000)
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line() + sshd.known_hosts_line(proxy.port))
    direct = sshd.spec(tmp_path)
    cut = replace(direct, port=proxy.port)
    target = Path(remote_path(direct, "blobs", hashlib.sha256(blob.read_bytes()).hexdigest() + ".pte"))
    with pytest.raises(DeviceError, match="127.0.0.1"):
        with open_connection(cut) as conn:
            deploy(conn, cut, blob)
    assert proxy.cut.is_set()
    assert not target.exists()
    with open_connection(direct) as conn:  # a later deploy over a good link completes it
        assert deploy(conn, direct, blob) == str(target)
    assert target.read_bytes() == blob.read_bytes()


def test_runner_over_ssh_measures_a_real_onnx_model(sshd, tmp_path):
    art = make_artifact(tmp_path / "art", n=8, wrong_labels=2)
    spec = sshd.spec(tmp_path, power_sensor="none")
    settings = RunnerSettings(warmup_runs=3, warmup_seconds=0.0, min_runs=40, min_seconds=0.1, idle_seconds=0)
    with open_connection(spec) as conn:
        m = run_benchmark(conn, spec, art, "onnx", settings=settings, timeout=120)
        assert conn.uploads == 3  # runner, model, sample_io
    assert m.ok, m.error
    assert (m.device, m.artifact, m.format, m.variant, m.threads) == ("stand-in", "run-test/client-007", "onnx", "fp32", 1)
    assert m.accuracy == pytest.approx(6 / 8)
    assert m.output_check_passed and m.output_max_abs_diff <= 1e-5
    assert m.runs >= 40 and all(x > 0 for x in m.latency_ms)
    assert m.timed_window_s >= 0.1 and m.timed_window_s * 1000 >= sum(m.latency_ms)
    assert m.load_ms > 0 and m.first_inference_ms > 0 and m.peak_rss_kb > 10_000
    assert m.runtime_version.startswith("onnxruntime 1.")
    assert m.power_source is None and "none" in m.energy_missing_reason
    assert "temps_c" in m.state_before and "governors" in m.state_after


def test_check_device_over_ssh(sshd, tmp_path):
    row = check_device(sshd.spec(tmp_path))
    assert row["reachable"] is True
    assert row["python"] == ".".join(map(str, sys.version_info[:3]))
    assert row["runtimes"]["onnxruntime"].startswith("onnxruntime")
    assert "onnx" in row["formats"]
    unknown = check_device(sshd.spec(tmp_path, known_hosts=tmp_path / "empty_known_hosts"))
    assert unknown["reachable"] is False and "ssh-keyscan" in unknown["error"]


class _LateChannel:
    """A channel whose exit status arrives first and whose output trickles in after it, in chunks apart by
    ``gap_s`` (as sshd may send them under load), then EOF; or never EOF (``eof=False``)."""

    def __init__(self, chunks: list[bytes], gap_s: float, eof: bool = True) -> None:
        self.t0, self.chunks, self.gap_s, self.eof = time.monotonic(), list(chunks), gap_s, eof
        self.sent = 0

    def _due(self) -> int:  # chunks that have arrived by now
        return min(len(self.chunks), 1 + int((time.monotonic() - self.t0) / self.gap_s))

    def recv_ready(self) -> bool:
        return self.sent < self._due()

    def recv(self, n: int) -> bytes:
        self.sent += 1
        return self.chunks[self.sent - 1]

    def recv_stderr_ready(self) -> bool:
        return False

    def exit_status_ready(self) -> bool:
        return True

    @property
    def eof_received(self) -> bool:
        return self.eof and self.sent == len(self.chunks)


def test_output_arriving_after_the_exit_status_is_read_to_the_end():
    """The exit status is not the end of the output: a pause after it must not cut stdout short (the old loop
    stopped at the first moment with the exit status in and nothing to read)."""
    from edgemask.devices.connection_ssh import OutputDrain

    chunks = [b"a" * 1000, b"b" * 1000, b"c" * 1000]
    drain = OutputDrain(_LateChannel(chunks, gap_s=0.05), idle_s=0.001)
    while not drain.done():
        pass
    assert b"".join(drain.out) == b"".join(chunks)
    # no EOF ever (a background child holds stdout open): done once nothing came for eof_grace_s
    t0 = time.monotonic()
    drain = OutputDrain(_LateChannel([b"x"], gap_s=1.0, eof=False), eof_grace_s=0.2, idle_s=0.001)
    while not drain.done():
        pass
    assert drain.out == [b"x"] and 0.2 <= time.monotonic() - t0 < 1.0
