"""Profiling campaigns, in rooms that import one way (``tests/test_architecture.py`` checks it):

- ``config``: ``campaign.toml`` -> a checked :class:`~edgemask.profiling.records.CampaignConfig` (the schema derived
  from the dataclasses);
- ``plan``: the config and the artifacts' manifests -> :class:`~edgemask.profiling.records.Job`s, skipped combinations
  and why, the sampled clients;
- ``boards``: what a campaign does to a board around its jobs, and the lock that makes the board its own;
- ``worker``: one device's jobs in turn: retries, re-measures, every outcome stored before the next;
- ``run``: :func:`run_campaign`: the campaign's lock, resume from the store, one worker thread per device.

config and plan import no later room; boards imports no other; worker imports boards; run imports all but
config. Callers import the names below from ``profiling.campaign``.
"""

from edgemask.profiling.campaign.boards import BoardHooks, holder_identity
from edgemask.profiling.campaign.config import DENSE_CLIENT, FORMATS, VARIANTS, load_campaign, parse_campaign
from edgemask.profiling.campaign.plan import CampaignPlan, plan_campaign, plan_jobs, read_manifest, sampled
from edgemask.profiling.campaign.run import CampaignResult, run_campaign
from edgemask.profiling.campaign.worker import FailedJob, backoff_delay
from edgemask.profiling.records import ArtifactInfo, ArtifactSelection, CampaignConfig, Job, SkippedJob

__all__ = ["DENSE_CLIENT", "FORMATS", "VARIANTS", "ArtifactInfo", "ArtifactSelection", "BoardHooks",
           "CampaignConfig", "CampaignPlan", "CampaignResult", "FailedJob", "Job", "SkippedJob", "backoff_delay",
           "holder_identity", "load_campaign", "parse_campaign", "plan_campaign", "plan_jobs", "read_manifest",
           "run_campaign", "sampled"]
