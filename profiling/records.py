"""The records a campaign and its store share: what a campaign is (:class:`CampaignConfig`), the artifacts it
measures (:class:`ArtifactInfo`), the jobs it runs (:class:`Job`) and those it leaves out (:class:`SkippedJob`).

`profiling.campaign` makes them (from ``campaign.toml`` and the manifests) and `profiling.store` writes and reads
them back; both import this module, which imports neither.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgemask.devices.records import RunnerSettings
from edgemask.manifest import ArtifactFile
from edgemask.targets import TRAINING_FORMATS

# How a training job (formats pte-train, torch-train: a client's local step, issue #39) is measured when the
# campaign's [training_runner] table does not say otherwise: a step is 10^2-10^4 times an inference (demo MLP: ~150 ms
# a torch step, ~1.9 s an ExecuTorch portable step), so [runner]'s inference settings (hundreds of runs, a warm-up of
# seconds, back-to-back loops of sample_min_ms) would take minutes a job. The one declaration of these defaults: the
# [training_runner] schema (profiling.campaign.config) takes its defaults from here.
TRAINING_RUNNER = RunnerSettings(warmup_runs=3, warmup_seconds=0.0, min_runs=20, min_seconds=2.0, sample_min_ms=0.0,
                                 profile_layers=False)


@dataclass(frozen=True)
class ArtifactSelection:
    """Which artifacts of one run: some clients or all of them, plus the run's dense baseline."""

    run: str
    clients: tuple[str, ...] | None = None  # None means every client the run exported
    dense: bool = True


@dataclass(frozen=True)
class CampaignConfig:
    """A campaign: ``campaign.toml``'s ``[campaign]`` table, its ``[[artifacts]]``, ``[runner]`` and
    ``[training_runner]``. The one declaration of each setting's type and default (``profiling.campaign.config``
    derives the file's schema)."""

    name: str  # results/<name>/
    artifacts: tuple[ArtifactSelection, ...]
    formats: tuple[str, ...]  # onnx | pte | tflite | trt
    variants: tuple[str, ...] = ("fp32",)  # fp32 | int8
    devices: tuple[str, ...] = ("local",)  # names from the inventory
    threads: tuple[int, ...] = (1,)  # runtime threads per measurement
    repetitions: int = 1  # each artifact × format × variant × device × threads measured this many times
    runner: RunnerSettings = field(default_factory=RunnerSettings)  # threads: each job's, from ``threads``
    # the settings of a training format's jobs (pte-train, torch-train): [training_runner], same fields as [runner]
    training_runner: RunnerSettings = field(default_factory=lambda: TRAINING_RUNNER)
    timeout_s: float = 600.0  # per job
    cooldown_s: float = 0.0  # idle seconds between two jobs on one device
    retries: int = 2  # extra attempts after a connection fault
    retry_backoff_s: float = 2.0  # base of the jittered exponential backoff between them
    inventory: str | None = None  # relative to the workspace; None: <workspace>/devices.toml where it exists
    # measure a repetition again when its own CV exceeds the verdict's threshold (a disturbance on the board),
    # up to this many times; each dropped attempt is kept in the store (superseded, status "unstable")
    remeasure_unstable: int = 0
    # measure only this many clients per run (0: all), spread over their kept units; the others are predicted
    # from the measured ones' per-layer times (profiling.predict); sample_seed makes the draw repeatable
    sample_clients: int = 0
    sample_seed: int = 0

    def results_dir(self, workspace: str | Path) -> Path:
        return Path(workspace) / "results" / self.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def settings_for(self, fmt: str) -> RunnerSettings:
        """The runner settings of a job of format ``fmt``: ``training_runner`` for a training format, else
        ``runner`` (threads: the job's own, set by the worker)."""
        return self.training_runner if is_training_format(fmt) else self.runner


def is_training_format(fmt: str) -> bool:
    """Whether a job of ``fmt`` measures a local training step (edgemask.targets.TRAINING_FORMATS)."""
    return fmt in TRAINING_FORMATS


@dataclass(frozen=True)
class ArtifactInfo:
    """The key numbers of one artifact's ``manifest.json`` that the report needs."""

    run_id: str
    client_id: str
    kind: str  # "dense" | "compacted"
    algorithm: str
    model: str
    dataset: str
    params_dense: int
    params_compacted: int
    flops_dense: int
    flops_compacted: int
    files: tuple[ArtifactFile, ...]
    manifest: Mapping[str, Any] = field(compare=False, repr=False)  # the whole manifest, as JSON (the store keeps it)

    @property
    def artifact(self) -> str:
        return f"{self.run_id}/{self.client_id}"

    def file_for(self, fmt: str, variant: str) -> ArtifactFile | None:
        return next((f for f in self.files if f.format == fmt and f.variant == variant), None)


@dataclass(frozen=True)
class Job:
    """One measurement to take. ``job_id`` is stable across runs of the same campaign: it keys resume."""

    artifact: str  # "<run-id>/<client-id>"
    format: str
    variant: str
    device: str
    threads: int
    repetition: int

    @property
    def job_id(self) -> str:
        return f"{self.artifact}|{self.format}|{self.variant}|{self.device}|t{self.threads}|r{self.repetition}"


@dataclass(frozen=True)
class SkippedJob:
    """A (artifact, format, variant, device) combination the plan left out, and why."""

    artifact: str
    format: str
    variant: str
    device: str
    reason: str
