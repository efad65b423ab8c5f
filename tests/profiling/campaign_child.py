"""Run a campaign with a slow deterministic benchmark; print each job id once its measurement is committed.

Used by test_resume_kill.py, which kills this process with SIGKILL at random points.
usage: campaign_child.py WORKSPACE CAMPAIGN_TOML
"""

import sys
import threading
from pathlib import Path

import profiling_fakes as pf
from edgemask.profiling.campaign import load_campaign, run_campaign


_lock = threading.Lock()


def emit(*words: str) -> None:
    """One whole line per call: print() from two device threads can interleave its pieces."""
    with _lock:
        sys.stdout.write(" ".join(words) + "\n")
        sys.stdout.flush()


def main() -> None:
    workspace, campaign = Path(sys.argv[1]), Path(sys.argv[2])
    config = load_campaign(campaign)
    emit("started")
    bench = pf.FakeBenchmark(sleep_s=0.03)

    def benchmark(conn, spec, artifact_dir, fmt, variant="fp32", settings=None, timeout=600):
        emit("ran", f"{artifact_dir.parent.name}/{artifact_dir.name}|{fmt}|{variant}|{spec.name}|t{settings.threads}")
        return bench(conn, spec, artifact_dir, fmt, variant=variant, settings=settings, timeout=timeout)

    result = run_campaign(config, workspace, benchmark=benchmark, progress=False,
                          inventory=pf.fleet(*config.devices), connect=pf.FakeConnect(),
                          on_recorded=lambda job: emit("recorded", job.job_id))
    emit("complete" if result.complete else "incomplete")


if __name__ == "__main__":
    main()
