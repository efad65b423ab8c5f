"""Expand a campaign into jobs: artifacts × formats × variants × devices × threads × repetitions.

Each selected artifact's manifest is read with the checked reader (:func:`read_manifest`); a combination the
manifest or the device's runtimes cannot run is skipped with why (:class:`~edgemask.profiling.records.SkippedJob`); with
``sample_clients`` only a spread of clients is measured and the rest predicted (:mod:`edgemask.profiling.predict`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgemask.errors import ConfigError
from edgemask.manifest import MANIFEST, load_artifact
from edgemask.targets import artifact_format
from edgemask.profiling.campaign.config import DENSE_CLIENT, FORMATS
from edgemask.profiling.records import (ArtifactInfo, ArtifactSelection, CampaignConfig, Job, SkippedJob,
                                        is_training_format)


def read_manifest(path: str | Path) -> ArtifactInfo:
    """Read an artifact's ``manifest.json`` (or its directory) with the shared reader into an ``ArtifactInfo``.

    A missing or malformed manifest, one that sits under another run or client than it names, or whose files'
    ``bytes`` / ``sha256`` differ from the files, raises ``CorruptFileError`` naming the file
    (``edgemask.manifest.load_artifact``): the store only ever records what the report can trust."""
    m = load_artifact(path)
    return ArtifactInfo(
        run_id=m.run_id, client_id=m.client_id, kind=m.kind, algorithm=m.algorithm, model=m.model,
        dataset=m.dataset, params_dense=m.params["dense"], params_compacted=m.params["compacted"],
        flops_dense=m.flops["dense"], flops_compacted=m.flops["compacted"], files=tuple(m.files),
        manifest=m.to_dict(),
    )


@dataclass(frozen=True)
class CampaignPlan:
    jobs: tuple[Job, ...]
    skipped: tuple[SkippedJob, ...]
    artifacts: Mapping[str, ArtifactInfo]  # artifact -> manifest numbers


def _select_clients(run_dir: Path, sel: ArtifactSelection) -> list[str]:
    if not run_dir.is_dir():
        raise ConfigError(f"{run_dir}: no artifacts for run {sel.run!r}; run `edgemask export --run {sel.run}` first")
    if sel.clients is None:
        # names with a leading dot are export's own temporary folders (a killed writer's), never clients
        clients = sorted(p.name for p in run_dir.iterdir()
                         if p.name != DENSE_CLIENT and not p.name.startswith(".") and (p / MANIFEST).is_file())
        if not clients:
            raise ConfigError(f"{run_dir}: run {sel.run!r} has no exported client artifacts")
    else:
        clients = list(sel.clients)
        missing = [c for c in clients if not (run_dir / c / MANIFEST).is_file()]
        if missing:
            raise ConfigError(f"{run_dir}: no exported artifact for client(s) {', '.join(missing)}")
    if sel.dense:
        if not (run_dir / DENSE_CLIENT / MANIFEST).is_file():
            raise ConfigError(f"{run_dir / DENSE_CLIENT}: run {sel.run!r} has no dense baseline; "
                              f"export it or set dense = false")
        clients = [DENSE_CLIENT, *clients]
    return clients


def plan_campaign(config: CampaignConfig, workspace: str | Path,
                  inventory: Mapping[str, Any] | None = None) -> CampaignPlan:
    """Expand the config into jobs. Formats a manifest lacks, or a device's runtimes lack, are skipped with why.

    Order on one device: repetition outermost, so every repetition sweeps all artifacts and slow drift
    (heat, background load) spreads over all of them instead of biasing the ones measured last.
    """
    workspace = Path(workspace)
    infos: dict[str, ArtifactInfo] = {}
    for sel in config.artifacts:
        run_dir = workspace / "artifacts" / sel.run
        for client in _select_clients(run_dir, sel):
            info = read_manifest(run_dir / client)
            infos[f"{sel.run}/{client}"] = info
    measure = sampled(config, infos)

    runnable: list[tuple[str, str, str, str]] = []
    skipped: list[SkippedJob] = []
    for device in config.devices:
        runtimes = getattr(inventory.get(device), "runtimes", None) if inventory else None
        for artifact, info in infos.items():
            if artifact not in measure:
                continue
            for fmt in config.formats:
                for variant in config.variants:
                    if info.file_for(artifact_format(fmt), variant) is None:  # trt: the ONNX file
                        have = ", ".join(f"{f.format}/{f.variant}" for f in info.files) or "none"
                        why = f"manifest has no {artifact_format(fmt)}/{variant} file (has: {have})"
                        if is_training_format(fmt):  # a client's local step: fp32 only, written when asked for
                            why += ("; a local training step is exported as fp32 only" if variant != "fp32" else
                                    f"; export with --formats {fmt} to write the client's local step")
                        skipped.append(SkippedJob(artifact, fmt, variant, device, why))
                    elif runtimes and FORMATS.get(fmt) not in runtimes:  # empty: not declared
                        skipped.append(SkippedJob(artifact, fmt, variant, device,
                                                  f"device has no {FORMATS.get(fmt)} runtime "
                                                  f"(has: {', '.join(runtimes) or 'none'})"))
                    else:
                        runnable.append((artifact, fmt, variant, device))

    jobs = [
        Job(artifact, fmt, variant, device, threads, rep)
        for device in config.devices
        for rep in range(config.repetitions)
        for (artifact, fmt, variant, dev) in runnable if dev == device
        for threads in config.threads
    ]
    return CampaignPlan(jobs=tuple(jobs), skipped=tuple(skipped), artifacts=infos)


def sampled(config: CampaignConfig, infos: Mapping[str, ArtifactInfo]) -> set[str]:
    """The artifacts a campaign measures: all, or with ``sample_clients = K`` per run its dense baseline and K
    compacted clients spread over their total kept units (:func:`edgemask.profiling.predict.choose_sample`, seeded with
    ``sample_seed``); the rest stay in the plan's artifacts, to be predicted."""
    if not config.sample_clients:
        return set(infos)
    from edgemask.profiling.predict import choose_sample, kept_totals

    keep = {a for a, i in infos.items() if i.kind != "compacted"}
    for run in sorted({i.run_id for i in infos.values()}):
        clients = {a: i.manifest for a, i in infos.items() if i.run_id == run and i.kind == "compacted"}
        keep.update(choose_sample(kept_totals(clients), config.sample_clients, config.sample_seed))
    return keep


def plan_jobs(config: CampaignConfig, workspace: str | Path) -> list[Job]:
    """The campaign's jobs (see ``plan_campaign`` for the skipped combinations and why)."""
    return list(plan_campaign(config, workspace).jobs)
