"""How the runner measures: the one declaration of each measurement setting and its default.

The runner's command line is built from this table (``--warmup-runs`` for ``warmup_runs``, ...), and the host's
``devices.records.RunnerSettings`` takes its fields' defaults from it, so a default is written here and nowhere
else. Defaults follow TFLite's benchmark_model (at least 50 runs and 1 s, after a warm-up)."""

# (name, type, default, help); a bool is a flag, given when true
MEASUREMENT = (
    ("warmup_runs", int, 1, "warm-up: at least this many runs"),
    ("warmup_seconds", float, 0.5, "warm-up: at least this long"),
    ("min_runs", int, 50, "timed: at least this many latency samples"),
    ("min_seconds", float, 1.0, "timed: at least this long"),
    ("sample_min_ms", float, 0.0, "time back-to-back inferences per latency sample until it lasts this long, and "
                                  "record their mean (pyperf's loops calibrated to min_time); 0: one each"),
    ("threads", int, 1, "the runtime's intra-op threads"),
    # the output check, elementwise on every sample: |y - y_ref| <= tolerance + rtol*|y_ref| (y_ref: sample_io's);
    # the host sends the artifact's export rule (its manifest's), raised to these where they are larger
    ("tolerance", float, 1e-5, "output check: the absolute part (atol) of |y - y_ref| <= atol + rtol*|y_ref|"),
    ("rtol", float, 0.0, "output check: the relative part, times each reference element's |y_ref|"),
    ("power_rate_hz", float, 50.0, "power samples per second"),
    ("idle_seconds", float, 0.5, "idle power read this long before the timed runs (0: none)"),
    ("profile_layers", bool, False, "per-operator profiled runs after the timed ones (never mixed into the "
                                    "latency samples)"),
    ("profile_runs", int, 20, "profiled runs: how many"),
    ("profile_warmup", int, 5, "profiled runs: warm-up runs first"),
)
# A training job (formats pte-train, torch-train): the rounds timed after the step samples. --round-steps (a round's
# steps) is the artifact's own (its manifest's steps_per_round), sent by the host with --train-io.
TRAINING = (
    ("train_rounds", int, 1, "training job: whole local rounds (--round-steps steps each) timed after the steps"),
    # glibc hands a freed block of 128 KiB to 32 MiB back to the OS (munmap, heap trim) and faults it in again at the
    # next step: a step that frees and reallocates large activations and gradients pays page faults every time
    # (the demo's FedMask step on torch: p50 202 ms, CV 16 % by default; 139 ms, CV 7 % keeping them). "keep": the
    # training process keeps what it freed (mallopt M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_TOP_PAD), as a long-running
    # trainer tuned for its board would; "release": glibc's defaults. Not glibc: defaults, said in the result.
    ("train_malloc", str, "keep", "training job: keep freed memory in the process (keep) or glibc's defaults "
                                  "(release)"),
)
DEFAULTS = dict((name, default) for name, _, default, _ in MEASUREMENT)
TRAINING_DEFAULTS = dict((name, default) for name, _, default, _ in TRAINING)
# sent by the host only when profile_layers is on: a runner command without profiling stays as it was
PROFILE_OPTIONS = ("profile_layers", "profile_warmup", "profile_runs")


def flag(name):
    """``sample_min_ms`` -> ``--sample-min-ms``."""
    return "--" + name.replace("_", "-")
