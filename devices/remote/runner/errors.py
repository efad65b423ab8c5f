"""The runner's two failures that are answers, not crashes: each ends as {"ok": false, "error": reason}."""


class RunFailed(Exception):
    """The model cannot be measured (bad output, missing runtime, unreadable file)."""


class ProfilerMissing(Exception):
    """The runtime offers no per-operator profiler here; the message says why."""
