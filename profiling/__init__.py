"""Profiling campaigns and their reports.

- ``campaign``: ``campaign.toml`` -> ``CampaignConfig`` -> ``Job``s -> ``run_campaign`` (one worker per device,
  resumable, retries on connection faults);
- ``store``: the campaign's SQLite results store (one transaction per finished job, raw samples kept);
- ``stats``: percentiles, CV, energy per inference, comparisons against the dense baseline;
- ``report`` / ``plots``: one self-contained HTML page and a Markdown summary.
"""

from profiling.campaign import (
    ArtifactInfo,
    ArtifactSelection,
    CampaignConfig,
    CampaignPlan,
    CampaignResult,
    FailedJob,
    Job,
    SkippedJob,
    load_campaign,
    parse_campaign,
    plan_campaign,
    plan_jobs,
    read_manifest,
    run_campaign,
)
from profiling.report import write_report
from profiling.stats import compare_to_dense, summarize
from profiling.store import ResultsStore, load_results

__all__ = [
    "ArtifactInfo",
    "ArtifactSelection",
    "CampaignConfig",
    "CampaignPlan",
    "CampaignResult",
    "FailedJob",
    "Job",
    "ResultsStore",
    "SkippedJob",
    "compare_to_dense",
    "load_campaign",
    "load_results",
    "parse_campaign",
    "plan_campaign",
    "plan_jobs",
    "read_manifest",
    "run_campaign",
    "summarize",
    "write_report",
]
