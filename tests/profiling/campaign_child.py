"""Run a campaign with a slow deterministic benchmark; print each job id once its measurement is committed.

Used by test_resume_kill.py, which kills this process with SIGKILL at random points.
usage: campaign_child.py WORKSPACE CAMPAIGN_TOML
"""

import sys
from pathlib import Path

import profiling_fakes as pf
from profiling.campaign import load_campaign, run_campaign


def main() -> None:
    workspace, campaign = Path(sys.argv[1]), Path(sys.argv[2])
    config = load_campaign(campaign)
    print("started", flush=True)
    result = run_campaign(config, workspace, benchmark=pf.FakeBenchmark(sleep_s=0.03), progress=False,
                          inventory=pf.fleet(*config.devices), connect=pf.FakeConnect(),
                          on_recorded=lambda job: print("recorded", job.job_id, flush=True))
    print("complete" if result.complete else "incomplete", flush=True)


if __name__ == "__main__":
    main()
