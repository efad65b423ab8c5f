"""Profiling campaigns and their reports.

- ``campaign``: ``campaign.toml`` -> ``CampaignConfig`` (``campaign.config``) -> ``Job``s (``campaign.plan``) ->
  ``run_campaign`` (``campaign.run``: one worker per device, ``campaign.worker``; resumable, retries on connection
  faults; each board held by one campaign, ``campaign.boards``);
- ``store``: the campaign's SQLite results store (one transaction per finished job, raw samples kept);
- ``stats``: percentiles, CV, energy per inference, comparisons against the dense baseline;
- ``verdict``: VALID / INVALID per setting, each failed rule named (runs, seconds, CV, output check,
  throttling, temperature drift);
- ``tidy``: ``results.parquet`` (one row per setting) and ``samples.parquet`` (one row per raw sample);
- ``report`` / ``plots``: one self-contained HTML page, a Markdown summary and a terminal table;
- ``layers``: per-layer attribution of profiled runs (operator -> layer -> mask): FLOP bound, measured speedup;
- ``ledger`` / ``trace`` / ``replay``: ``clients.parquet`` (one row per run × client × setting) and its Pareto front,
  device traces (FedScale's ``client_device_capacity`` and edgemask's own), time- and energy-to-accuracy replay;
- ``rounds``: a run trained with ``[system]`` read back as it trained: its rounds' in-loop times and the updates
  dropped per board (the report's "Rounds with deadlines" section);
- ``training`` / ``budgets`` / ``train_predict``: a campaign's training rows, PerFedMask's budgets from them, and the
  per-layer model of a training step (a board's layers by their state: trained, gradient through, frozen);
- ``provenance``: what a derived number rests on (a run's identity: model, parameters, digests) and the check that
  a budget's, a replay's, a report's or a prediction's inputs belong together.

Names are imported on first use, so running a campaign does not load pandas and matplotlib up front.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ArtifactInfo": "edgemask.profiling.records",
    "ArtifactSelection": "edgemask.profiling.records",
    "CampaignConfig": "edgemask.profiling.records",
    "CampaignPlan": "edgemask.profiling.campaign",
    "CampaignResult": "edgemask.profiling.campaign",
    "FailedJob": "edgemask.profiling.campaign",
    "Job": "edgemask.profiling.records",
    "SkippedJob": "edgemask.profiling.records",
    "load_campaign": "edgemask.profiling.campaign",
    "parse_campaign": "edgemask.profiling.campaign",
    "plan_campaign": "edgemask.profiling.campaign",
    "plan_jobs": "edgemask.profiling.campaign",
    "read_manifest": "edgemask.profiling.campaign",
    "run_campaign": "edgemask.profiling.campaign",
    "ResultsStore": "edgemask.profiling.store",
    "load_results": "edgemask.profiling.store",
    "summarize": "edgemask.profiling.stats",
    "compare_to_dense": "edgemask.profiling.stats",
    "write_report": "edgemask.profiling.report",
    "summary_table": "edgemask.profiling.report",
    "VerdictRules": "edgemask.profiling.verdict",
    "write_tidy": "edgemask.profiling.tidy",
    "LayerBreakdown": "edgemask.profiling.layers",
    "LayerRow": "edgemask.profiling.layers",
    "breakdowns": "edgemask.profiling.layers",
    "layer_table": "edgemask.profiling.layers",
    "build_ledger": "edgemask.profiling.ledger",
    "pareto_front": "edgemask.profiling.ledger",
    "write_traces": "edgemask.profiling.trace",
    "read_trace": "edgemask.profiling.trace",
    "replay_report": "edgemask.profiling.replay",
    "RunRounds": "edgemask.profiling.rounds",
    "read_rounds": "edgemask.profiling.rounds",
    "RunIdentity": "edgemask.profiling.provenance",
    "check_same": "edgemask.profiling.provenance",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'profiling' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
