"""A verdict per measured setting: VALID or INVALID, each failed rule named, each unchecked rule said.

In the spirit of MLPerf Inference's result validity (a run is VALID only when it met the minimum query count and
duration and its accuracy check passed; otherwise INVALID with the reason): a setting — one artifact × format ×
variant × device × threads, all its repetitions — is VALID when every rule below holds for every repetition.

| code                  | rule                                                                           |
| --------------------- | ------------------------------------------------------------------------------ |
| `failed`              | every repetition produced a measurement (the runner did not fail)             |
| `output-check-failed` | the outputs on the device matched the host's reference within tolerance        |
| `too-few-runs`        | each repetition timed at least ``min_runs`` latency samples                    |
|                       | (inference: max(``MIN_RUNS`` 50, ``[runner] min_runs``); a training step:      |
|                       | max(``MIN_TRAIN_STEPS`` 20, ``[training_runner] min_runs``) steps)             |
| `too-short`           | each repetition's timed window lasted at least ``min_seconds``                 |
|                       | (inference: max(``MIN_SECONDS`` 1 s, ``[runner] min_seconds``); a training    |
|                       | step: max(``MIN_TRAIN_SECONDS`` 1 s, ``[training_runner] min_seconds``))      |
| `high-cv`             | the pooled latency samples' CV (sample std ÷ mean) is at most ``cv_threshold`` |
| `throttled`           | the board reported no throttling during any repetition                         |
| `temperature-drift`   | no thermal zone warmed by more than ``max_temp_drift_c`` across a window        |

A training job (formats pte-train, torch-train; each latency sample one local step) is judged by the same rules
with its own floors (:meth:`VerdictRules.for_training`): a step lasts 10^2-10^4 inferences, so 50 of them would
make a job minutes long, while 20 steps over at least a second already put p50 on 20 samples that each span many
scheduler ticks.

A board that cannot report a signal (no thermal zone, no throttling flags: most x86 hosts and the ``local``
device) is neither failed nor silently passed on that rule: the verdict lists it under ``not_checked`` with why.

Inputs are the rows of ``ResultsStore.to_dataframe()``; the device state is the runner's ``device_state()``
(``temps_c``: {zone: °C}; ``throttled``: Raspberry Pi ``vcgencmd get_throttled`` decoded to named bits, or any
field whose name contains "throttl").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from edgemask.profiling.records import TRAINING_RUNNER

# The runner's defaults (devices.records.RunnerSettings, after TFLite's benchmark_model): at least 50 timed
# inferences and 1 s per repetition, so p50/p90 rest on enough samples and a window spans many scheduler ticks.
MIN_RUNS = 50
MIN_SECONDS = 1.0
# A training step's floors (issue #39): at least 20 timed steps and 1 s per repetition (demo MLP: a torch step
# ~150 ms, an ExecuTorch portable step ~1.9 s: 20 steps is 3 s to 40 s a job).
MIN_TRAIN_STEPS = 20
MIN_TRAIN_SECONDS = 1.0
# Latency spread above which a setting's percentiles are not quoted (the 10 %).
CV_THRESHOLD = 0.10
# A zone warming by more than this across one repetition (before loading -> after the timed window) means the
# board was heating up while it was measured: later inferences ran hotter, and likely slower, than earlier ones.
MAX_TEMP_DRIFT_C = 5.0

VALID, INVALID = "VALID", "INVALID"
RULES = ("failed", "output-check-failed", "too-few-runs", "too-short", "high-cv", "throttled", "temperature-drift")


@dataclass(frozen=True)
class VerdictRules:
    """The thresholds a setting must meet; defaults are the module's constants."""

    min_runs: int = MIN_RUNS
    min_seconds: float = MIN_SECONDS
    cv_threshold: float = CV_THRESHOLD
    max_temp_drift_c: float = MAX_TEMP_DRIFT_C

    @classmethod
    def for_campaign(cls, config: Mapping[str, Any] | None, cv_threshold: float = CV_THRESHOLD) -> "VerdictRules":
        """The rules for a stored campaign (``ResultsStore.campaign_config()``): the minimums are the module's
        floor or the campaign's own ``[runner] min_runs`` / ``min_seconds``, whichever is higher — a repetition
        that timed less than the campaign asked for is not the measurement it planned."""
        runner = (config or {}).get("runner") or {}
        return cls(min_runs=max(MIN_RUNS, int(runner.get("min_runs") or 0)),
                   min_seconds=max(MIN_SECONDS, float(runner.get("min_seconds") or 0.0)),
                   cv_threshold=cv_threshold)

    @classmethod
    def for_training(cls, config: Mapping[str, Any] | None, cv_threshold: float = CV_THRESHOLD) -> "VerdictRules":
        """The rules for the stored campaign's training rows (a local step per latency sample): the floors
        ``MIN_TRAIN_STEPS`` / ``MIN_TRAIN_SECONDS`` or the campaign's ``[training_runner] min_runs`` /
        ``min_seconds`` (``profiling.records.TRAINING_RUNNER``'s where the stored config has no such table),
        whichever is higher."""
        runner = (config or {}).get("training_runner") or {}
        min_runs = runner.get("min_runs", TRAINING_RUNNER.min_runs)
        min_seconds = runner.get("min_seconds", TRAINING_RUNNER.min_seconds)
        return cls(min_runs=max(MIN_TRAIN_STEPS, int(min_runs or 0)),
                   min_seconds=max(MIN_TRAIN_SECONDS, float(min_seconds or 0.0)), cv_threshold=cv_threshold)

    def describe(self) -> str:
        return (f"at least {self.min_runs} timed samples and {self.min_seconds:g} s per repetition, CV at most "
                f"{100 * self.cv_threshold:g} %, output check passed, no throttling, temperature drift at most "
                f"{self.max_temp_drift_c:g} °C")


@dataclass(frozen=True)
class Verdict:
    """``reasons``: (rule code, what was measured) per failed rule; ``not_checked``: (rule, why) per rule the
    device gave no signal for."""

    reasons: tuple[tuple[str, str], ...] = ()
    not_checked: tuple[tuple[str, str], ...] = ()
    temp_drift_c: float = math.nan  # the largest zone warming over the setting's repetitions, °C

    @property
    def valid(self) -> bool:
        return not self.reasons

    @property
    def verdict(self) -> str:
        return VALID if self.valid else INVALID

    def columns(self) -> dict[str, Any]:
        """The verdict as the columns of ``results.parquet``."""
        return {"verdict": self.verdict, "valid": self.valid,
                "invalid_rules": ";".join(code for code, _ in self.reasons),
                "reasons": "; ".join(f"{code}: {why}" for code, why in self.reasons),
                "not_checked": "; ".join(f"{rule}: not checked: {why}" for rule, why in self.not_checked),
                "temp_drift_c": self.temp_drift_c}


# -- device state ---------------------------------------------------------------------------------------
def _state(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return json.loads(value) if value else {}
    return dict(value or {})


def temperatures(state: Mapping[str, Any]) -> dict[str, float]:
    """{zone: °C} from a runner device state (``temps_c``; a bare ``temp_c`` counts as one zone)."""
    temps = {str(k): float(v) for k, v in (state.get("temps_c") or {}).items() if _finite(v)}
    if not temps and _finite(state.get("temp_c")):
        temps["temp"] = float(state["temp_c"])
    return temps


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def flag_set(value: Any) -> bool:
    """Whether a reported flag is set: True, a non-zero number, or a non-zero hex/decimal string ("0x50005")."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "0", "0x0", "no", "false", "none"):
            return False
        try:
            return int(text, 0) != 0  # Raspberry Pi: vcgencmd get_throttled -> "0x50005"
        except ValueError:
            return text in ("1", "yes", "true", "throttled")
    if isinstance(value, Mapping):
        return any(flag_set(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(flag_set(v) for v in value)
    return False


def throttle_flags(state: Mapping[str, Any]) -> dict[str, bool] | None:
    """The throttling flags a state reports, by name; None when it reports none (the board has no such signal).

    A Raspberry Pi's decoded ``get_throttled`` gives one flag per bit (``throttled``, ``under_voltage``, ...,
    and their sticky ``*_occurred`` twins); any other field whose name contains "throttl" is one flag.
    """
    flags: dict[str, bool] = {}
    for key, value in state.items():
        if "throttl" in str(key).lower():
            if isinstance(value, Mapping) and "unparsed" not in value:
                flags.update({str(k): flag_set(v) for k, v in value.items() if k != "raw"})
            elif not isinstance(value, Mapping):
                flags[str(key)] = flag_set(value)
        elif isinstance(value, Mapping):
            inner = throttle_flags(value)
            if inner:
                flags.update({f"{key}.{k}": v for k, v in inner.items()})
    return flags or None


def throttled_during(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str] | None:
    """Flags that show throttling within one repetition; None when neither state reports throttling flags.

    A flag set now (before or after) counts; a sticky ``*_occurred`` flag (set at any time since boot) counts only
    when it is set after the window and was not before, i.e. the throttling happened during this repetition.
    """
    fb, fa = throttle_flags(before), throttle_flags(after)
    if fb is None and fa is None:
        return None
    fb, fa = fb or {}, fa or {}
    out = []
    for name in sorted(set(fb) | set(fa)):
        if name.endswith("_occurred"):
            if fa.get(name) and not fb.get(name):
                out.append(name)
        elif fb.get(name) or fa.get(name):
            out.append(name)
    return out


# -- the verdict ------------------------------------------------------------------------------------------
def judge(rows: pd.DataFrame, cv: float, rules: VerdictRules = VerdictRules()) -> Verdict:
    """The verdict of one setting from its measurement rows (``ResultsStore.to_dataframe()`` shape) and the CV
    of its pooled latency samples."""
    reasons: list[tuple[str, str]] = []
    not_checked: list[tuple[str, str]] = []
    ok = rows[rows["ok"].astype(bool)]
    bad = rows[~rows["ok"].astype(bool)]

    # A runner that returned ok=False with a measured difference failed the output check (runner.benchmark);
    # any other ok=False is a failed run.
    diffs = pd.to_numeric(rows["output_max_abs_diff"], errors="coerce")
    check_failed = ~rows["output_check_passed"].astype(bool) & (rows["ok"].astype(bool) | diffs.notna())
    if check_failed.any():
        worst = diffs[check_failed].max()
        reasons.append(("output-check-failed", f"{int(check_failed.sum())} of {len(rows)} repetition(s) differ "
                        f"from the host's outputs" + (f" (max |diff| {worst:.3g})" if pd.notna(worst) else "")))
    other_failed = bad[~check_failed[bad.index]]
    if len(other_failed):
        errors = sorted({str(e) for e in other_failed["error"] if e}) or ["no reason given"]
        reasons.append(("failed", f"{len(other_failed)} of {len(rows)} repetition(s) failed: {errors[0]}"))
    if ok.empty:
        return Verdict(tuple(reasons), tuple(not_checked))

    runs = ok["latency_ms"].map(len)
    if (runs < rules.min_runs).any():
        reasons.append(("too-few-runs", f"{int(runs.min())} timed samples < {rules.min_runs}"))
    window = pd.to_numeric(ok["timed_window_s"], errors="coerce")
    if window.isna().any() or (window < rules.min_seconds).any():
        shortest = "no timed window" if window.isna().any() else f"timed window {window.min():.3g} s"
        reasons.append(("too-short", f"{shortest} < {rules.min_seconds:g} s"))
    if not (cv <= rules.cv_threshold):  # NaN (fewer than two samples) fails too
        shown = "undefined (fewer than 2 samples)" if math.isnan(cv) else f"{100 * cv:.1f} %"
        reasons.append(("high-cv", f"CV {shown} > {100 * rules.cv_threshold:g} %"))

    states = [(_state(b), _state(a)) for b, a in zip(ok["state_before"], ok["state_after"])]
    flags = [throttled_during(b, a) for b, a in states]
    if all(f is None for f in flags):
        not_checked.append(("throttled", "the board reports no throttling flags"))
    else:
        hit = sorted({name for f in flags if f for name in f})
        if hit:
            reasons.append(("throttled", f"the board reported {', '.join(hit)}"))

    drift, where = math.nan, ""
    for b, a in states:
        tb, ta = temperatures(b), temperatures(a)
        for zone in set(tb) & set(ta):
            d = ta[zone] - tb[zone]
            if math.isnan(drift) or d > drift:
                drift, where = d, f"{zone} {tb[zone]:.1f} -> {ta[zone]:.1f} °C"
    if math.isnan(drift):
        not_checked.append(("temperature-drift", "the board reports no temperature (no thermal zone)"))
    elif drift > rules.max_temp_drift_c:
        reasons.append(("temperature-drift", f"{where} (+{drift:.1f} > {rules.max_temp_drift_c:g} °C)"))
    return Verdict(tuple(reasons), tuple(not_checked), drift)


def headline(results: pd.DataFrame) -> str:
    """'12 of 20 settings VALID; INVALID: high-cv 6, too-short 2' — the line every summary leads with."""
    n = len(results)
    if not n:
        return "no measured settings"
    valid = int(results["valid"].sum())
    counts: dict[str, int] = {}
    for codes in results["invalid_rules"]:
        for code in filter(None, str(codes).split(";")):
            counts[code] = counts.get(code, 0) + 1
    line = f"{valid} of {n} settings VALID"
    if counts:
        line += "; INVALID for " + ", ".join(f"{code} ({counts[code]})" for code in RULES if code in counts)
    return line
