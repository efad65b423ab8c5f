"""Helpers for the profiling tests: a workspace with manifests, a deterministic benchmark, a fake fleet.

Also imported by ``campaign_child.py``, which runs a campaign in a subprocess that the tests kill.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgemask.devices.inventory import FORMAT_RUNTIME
from edgemask.devices.records import Measurement, RunnerSettings
from edgemask.manifest import SAMPLE_IO, ArtifactFile, Manifest, TensorSpec
from edgemask.manifest import write_manifest as write_manifest_file

from edgemask.devices.errors import DeviceError, HostKeyError  # noqa: F401  (re-exported for the tests)


@dataclass(frozen=True)
class FakeSpec:
    name: str
    runtimes: tuple[str, ...] | None = None


def fleet(*names: str, runtimes: tuple[str, ...] | None = None) -> dict[str, FakeSpec]:
    return {n: FakeSpec(n, runtimes) for n in names}


class FakeConnect:
    """A connect() that counts opened and closed connections."""

    def __init__(self) -> None:
        self.opened = 0
        self.closed = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def __call__(self, spec: Any):
        with self._lock:
            self.opened += 1
        try:
            yield f"conn-{spec.name}"
        finally:
            with self._lock:
                self.closed += 1


def write_manifest(workspace: Path, run: str, client: str, *, kind: str, algorithm: str = "fedmask",
                   model: str = "cnn", dataset: str = "digits", formats=(("onnx", "fp32"), ("pte", "fp32")),
                   params=(1000, 400), flops=(10_000, 2_000), nbytes: int = 4000,
                   training: dict[str, Any] | None = None) -> Path:
    """A complete manifest.json written by the contract's writer, with files it describes truly: stand-in model
    files of ``nbytes`` bytes (not runnable models: the fake benchmark never runs them) and a real sample_io, each
    with its real size and sha256, so the campaign's checked reader (``edgemask.manifest.load_artifact``) takes it."""
    import numpy as np

    from edgemask.fileio import sha256_file
    from edgemask.manifest import write_sample_io

    d = workspace / "artifacts" / run / client
    d.mkdir(parents=True, exist_ok=True)
    digests = {}
    for f, v in formats:
        path = d / f"model.{v}.{f}"
        path.write_bytes((f"{run}/{client}/{f}/{v}|".encode() * (nbytes // 8 + 1))[:nbytes])
        digests[path.name] = sha256_file(path)
    write_sample_io(d / SAMPLE_IO, np.zeros((32, 1, 8, 8), np.float32), np.zeros((32, 10), np.float32),
                    np.zeros(32, np.int64))
    if training is not None:  # the local step's numbers (manifest `training`): a stand-in train_io.npz beside
        (d / "train_io.npz").write_bytes(f"{run}/{client}/train_io".encode())
        training = {"file": "train_io.npz", "sha256": sha256_file(d / "train_io.npz"), "batch_size": 32,
                    "steps_per_round": 1, "epochs": 1, "num_train": 32, "lr": 0.1, "momentum": 0.0,
                    "trained": ["t0"], "frozen": [], "trained_params": 100, "step": "fedmask.forward",
                    "limit": 1e-3, "rtol": 1e-4, "max_abs_diff": {}, **training}
    manifest = Manifest(
        run_id=run, client_id=client, kind=kind, algorithm=algorithm, model=model, dataset=dataset,
        inputs=[TensorSpec("input", [1, 1, 8, 8], "float32")], outputs=[TensorSpec("output", [1, 10], "float32")],
        files=[ArtifactFile(format=f, variant=v, file=f"model.{v}.{f}", sha256=digests[f"model.{v}.{f}"], bytes=nbytes,
                            runtime=FORMAT_RUNTIME[f]) for f, v in formats],
        sample_io={"file": SAMPLE_IO, "sha256": sha256_file(d / SAMPLE_IO), "count": 32},
        params={"dense": params[0], "compacted": params[1]}, flops={"dense": flops[0], "compacted": flops[1]},
        layers=[{"name": "conv1", "kept": 10, "total": 16}], tolerance={"limit": 1e-5, "max_abs_diff": {}},
        created="2026-11-22T10:00:00Z", training=training,
    )
    write_manifest_file(d, manifest)
    return d


def small_workspace(root: Path, run: str = "run-a", clients=("client-000", "client-001"), **kw) -> Path:
    write_manifest(root, run, "dense", kind="dense", params=(1000, 1000), flops=(10_000, 10_000), nbytes=8000, **kw)
    for c in clients:
        write_manifest(root, run, c, kind="compacted", **kw)
    return root


def campaign_toml(name: str = "camp", *, run: str = "run-a", clients="all", dense: bool = True,
                  devices=("dev-a", "dev-b"), formats=("onnx", "pte"), threads=(1,), repetitions: int = 2,
                  retries: int = 2, cooldown_s: float = 0.0, backoff: float = 0.001, timeout_s: float = 30,
                  runner: dict[str, Any] | None = None, training_runner: dict[str, Any] | None = None) -> str:
    """The one campaign.toml template of the tests. Defaults: the fake fleet's campaign (every client of run-a and
    its dense baseline on dev-a and dev-b, runner 5 samples / 0.01 s); ``runner``: the [runner] table instead."""
    q = lambda xs: "[" + ", ".join(json.dumps(x) for x in xs) + "]"  # noqa: E731
    runner = {"min_runs": 5, "min_seconds": 0.01} if runner is None else runner
    return f"""
[campaign]
name = "{name}"
formats = {q(formats)}
devices = {q(devices)}
threads = {q(threads)}
repetitions = {repetitions}
retries = {retries}
cooldown_s = {cooldown_s}
retry_backoff_s = {backoff}
timeout_s = {timeout_s}

[[artifacts]]
run = "{run}"
clients = {json.dumps(clients) if isinstance(clients, str) else q(clients)}
dense = {json.dumps(dense)}

[runner]
""" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in runner.items()) + (
        "" if training_runner is None else "\n[training_runner]\n" + "".join(
            f"{key} = {json.dumps(value)}\n" for key, value in training_runner.items()))


def real_campaign_toml(name: str, *, seconds: float, repetitions: int = 2, device: str = "local") -> str:
    """The campaign of the tests that run the real runner: the one real ONNX artifact that tests/devices/
    artifacts.py's ``make_artifact`` writes at ``artifacts/run-test/client-007``, on one device, each job at least
    20 samples over at least ``seconds``, no idle reading; a link fault retried once after the default backoff."""
    return campaign_toml(name, run="run-test", clients=("client-007",), dense=False, devices=(device,),
                         formats=("onnx",), repetitions=repetitions, retries=1, backoff=2.0, timeout_s=120,
                         runner={"warmup_runs": 1, "warmup_seconds": 0.0, "min_runs": 20, "min_seconds": seconds,
                                 "idle_seconds": 0.0, "power_rate_hz": 10.0})


def expected_latency(artifact: str, fmt: str, threads: int) -> tuple[float, ...]:
    """Deterministic samples: the dense model is slower than the compacted ones."""
    seed = int(hashlib.sha256(f"{artifact}|{fmt}|{threads}".encode()).hexdigest()[:8], 16)
    base = 10.0 if artifact.endswith("/dense") else 4.0
    return tuple(base + ((seed >> i) % 7) * 0.01 for i in range(5))


def fake_measurement(spec: Any, artifact_dir: Path, fmt: str, variant: str, settings: RunnerSettings,
                     **overrides: Any) -> Measurement:
    artifact = f"{artifact_dir.parent.name}/{artifact_dir.name}"
    latency = expected_latency(artifact, fmt, settings.threads)
    fields = dict(
        device=spec.name, artifact=artifact, format=fmt, variant=variant, threads=settings.threads, ok=True,
        latency_ms=latency, load_ms=12.0, first_inference_ms=20.0,
        peak_rss_kb=50_000, rss_growth_kb=8000 if artifact.endswith("/dense") else 2000,
        output_max_abs_diff=1e-7, output_check_passed=True, accuracy=0.9,
        power_source="ina3221:VDD_IN", power_w=(3.0, 3.0, 5.0, 5.0), power_rate_hz=50.0, idle_power_w=2.0,
        timed_window_s=sum(latency) / 1e3, state_before={"governor": "performance", "temp_c": 40.0},
        state_after={"governor": "performance", "temp_c": 41.0}, runtime_version="1.31.1",
    )
    fields.update(overrides)
    return Measurement(**fields)


class FakeBenchmark:
    """Deterministic benchmark; raises DeviceError on the first ``fail_first`` calls for matching jobs."""

    def __init__(self, sleep_s: float = 0.0, fail_first: int = 0, fail_when=lambda artifact, fmt: True,
                 exc_type: type[Exception] = DeviceError) -> None:
        self.exc_type = exc_type
        self.sleep_s, self.fail_first, self.fail_when = sleep_s, fail_first, fail_when
        self.calls: list[tuple[str, str, str, int]] = []
        self.active: dict[str, int] = {}
        self.max_active: dict[str, int] = {}
        self.max_total = 0  # most jobs running at once over all devices
        self.failures = 0
        self._lock = threading.Lock()

    def __call__(self, conn, spec, artifact_dir: Path, fmt: str, variant: str = "fp32",
                 settings: RunnerSettings = RunnerSettings(), timeout: float = 600) -> Measurement:
        assert conn == f"conn-{spec.name}"
        artifact = f"{artifact_dir.parent.name}/{artifact_dir.name}"
        with self._lock:
            self.calls.append((spec.name, artifact, fmt, settings.threads))
            self.active[spec.name] = self.active.get(spec.name, 0) + 1
            self.max_active[spec.name] = max(self.max_active.get(spec.name, 0), self.active[spec.name])
            self.max_total = max(self.max_total, sum(self.active.values()))
            fail = self.fail_when(artifact, fmt) and self.failures < self.fail_first
            if fail:
                self.failures += 1
        try:
            if self.sleep_s:
                time.sleep(self.sleep_s)
            if fail:
                raise self.exc_type(f"{spec.name}: connection reset by peer")
            return fake_measurement(spec, artifact_dir, fmt, variant, settings)
        finally:
            with self._lock:
                self.active[spec.name] -= 1
