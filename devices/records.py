"""Typed records that cross the devices boundary: runner settings in, measurements out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class RunnerSettings:
    """How the remote runner measures. Defaults follow TFLite's benchmark_model."""

    warmup_runs: int = 1
    warmup_seconds: float = 0.5
    min_runs: int = 50
    min_seconds: float = 1.0
    # each latency sample times back-to-back inferences until it lasts this long, and records their mean
    # (pyperf's loops calibrated to min_time); 0: one inference per sample, as benchmark_model does
    sample_min_ms: float = 0.0
    threads: int = 1
    tolerance: float = 1e-5
    power_rate_hz: float = 50.0
    idle_seconds: float = 0.5
    # per-operator profiled runs after the timed ones (never mixed into the latency samples)
    profile_layers: bool = False
    profile_warmup: int = 5
    profile_runs: int = 20

    def to_args(self) -> list[str]:
        """Command-line arguments for the runner script."""
        return [
            "--warmup-runs", str(self.warmup_runs),
            "--warmup-seconds", str(self.warmup_seconds),
            "--min-runs", str(self.min_runs),
            "--min-seconds", str(self.min_seconds),
            "--sample-min-ms", str(self.sample_min_ms),
            "--threads", str(self.threads),
            "--tolerance", repr(self.tolerance),
            "--power-rate-hz", str(self.power_rate_hz),
            "--idle-seconds", str(self.idle_seconds),
        ] + (["--profile-runs", str(self.profile_runs), "--profile-warmup", str(self.profile_warmup)]
             if self.profile_layers and self.profile_runs > 0 else [])


@dataclass(frozen=True)
class Measurement:
    """One finished benchmark job on one device: the raw samples, as the runner took them. The statistics of them
    (percentiles, mean power, energy per inference) are ``profiling.stats``'s, one implementation."""

    device: str
    artifact: str  # "<run-id>/<client-id>"
    format: str  # onnx | pte | tflite
    variant: str  # fp32 | int8
    threads: int
    ok: bool
    error: str | None = None
    latency_ms: tuple[float, ...] = ()  # one per timed sample: the mean of its inferences, ms
    inferences_per_sample: int = 1  # back-to-back inferences each latency sample timed (sample_min_ms)
    load_ms: float = math.nan
    first_inference_ms: float = math.nan
    peak_rss_kb: int = 0
    rss_growth_kb: int = 0  # RSS after loading the model minus RSS before
    output_max_abs_diff: float = math.nan
    output_check_passed: bool = False
    accuracy: float = math.nan  # on the sample_io labels
    power_source: str | None = None  # sensor name; None when energy is missing
    power_w: tuple[float, ...] = ()  # samples during the timed window
    power_rate_hz: float = math.nan
    idle_power_w: float = math.nan
    energy_missing_reason: str | None = None
    timed_window_s: float = math.nan
    state_before: dict[str, Any] = field(default_factory=dict)
    state_after: dict[str, Any] = field(default_factory=dict)
    runtime_version: str | None = None
    # profiled runs (RunnerSettings.profile_layers): the runner's "profile" document; the store keeps its
    # per-operator samples in their own tables
    profile: dict[str, Any] = field(default_factory=dict)
    # sha256 of the model file measured: the digest devices.benchmark checked the local file against and
    # devices.deploy verified on the board (the blob's name); None when no file was deployed
    artifact_sha256: str | None = None

    # -- counts (never stored separately) ------------------------------------------------------------
    @property
    def runs(self) -> int:
        """Timed latency samples."""
        return len(self.latency_ms)

    @property
    def inferences(self) -> int:
        """Timed inferences: samples × inferences per sample."""
        return self.runs * self.inferences_per_sample

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["latency_ms"] = list(self.latency_ms)
        d["power_w"] = list(self.power_w)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Measurement":
        known = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in known}
        kw["latency_ms"] = tuple(float(x) for x in kw.get("latency_ms", ()))
        kw["power_w"] = tuple(float(x) for x in kw.get("power_w", ()))
        return cls(**kw)
