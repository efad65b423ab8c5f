"""Typed records that cross the devices boundary: runner settings in, measurements out."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from edgemask.devices.remote.runner import options as runner_options


# The runner's measurement settings: each default is declared once, in the runner's own table (it runs on the
# board and cannot import this module); the fields below take theirs from it.
_DEFAULT = runner_options.DEFAULTS


@dataclass(frozen=True)
class RunnerSettings:
    """How the remote runner measures: one field per option of the runner's table
    (``devices/remote/runner/options.py``, which says what each means). Defaults follow TFLite's benchmark_model."""

    warmup_runs: int = _DEFAULT["warmup_runs"]
    warmup_seconds: float = _DEFAULT["warmup_seconds"]
    min_runs: int = _DEFAULT["min_runs"]
    min_seconds: float = _DEFAULT["min_seconds"]
    # each latency sample times back-to-back inferences until it lasts this long, and records their mean
    # (pyperf's loops calibrated to min_time); 0: one inference per sample, as benchmark_model does
    sample_min_ms: float = _DEFAULT["sample_min_ms"]
    threads: int = _DEFAULT["threads"]
    # the output check |y - y_ref| <= tolerance + rtol*|y_ref|, elementwise: the job's floor. Each part is the larger
    # of the job's and the rule export held the artifact to (its manifest's; devices.benchmark)
    tolerance: float = _DEFAULT["tolerance"]
    rtol: float = _DEFAULT["rtol"]
    power_rate_hz: float = _DEFAULT["power_rate_hz"]
    idle_seconds: float = _DEFAULT["idle_seconds"]
    # per-operator profiled runs after the timed ones (never mixed into the latency samples)
    profile_layers: bool = _DEFAULT["profile_layers"]
    profile_warmup: int = _DEFAULT["profile_warmup"]
    profile_runs: int = _DEFAULT["profile_runs"]

    def to_args(self) -> list[str]:
        """Command-line arguments for the runner: every setting, the profiling ones only when profiling is on."""
        profiling = self.profile_layers and self.profile_runs > 0
        args: list[str] = []
        for name, kind, _, _ in runner_options.MEASUREMENT:
            if name in runner_options.PROFILE_OPTIONS and not profiling:
                continue
            value = getattr(self, name)
            if kind is bool:
                args += [runner_options.flag(name)] if value else []
            else:
                args += [runner_options.flag(name), repr(value) if kind is float else str(value)]
        return args


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
    # a training job (formats pte-train, torch-train; issue #39): each latency sample is one local step (forward,
    # backward, SGD update) of ``batch_size`` samples; ``steps_per_round`` (from the manifest: ⌈num_train / batch⌉ ·
    # epochs); ``round_ms``: wall times of whole local rounds run back to back after the timed steps;
    # ``check_max_abs_diff``: the board's one step from the file's state against the host's updated tensors;
    # ``train_io_sha256``: the digest of the train_io.npz the check read. Empty for inference jobs.
    training: dict[str, Any] = field(default_factory=dict)

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
