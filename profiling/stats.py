"""Statistics derived from raw samples: plain functions, then pandas at the edge (``summarize``).

Percentiles use linear interpolation between order statistics (numpy's default); the standard deviation is the
sample one (ddof=1). ``devices.records.Measurement`` is a record of raw samples: its statistics are the functions
here, e.g. ``energy_per_inference_mj(m.power_w, m.timed_window_s, m.inferences)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from edgemask.profiling.records import is_training_format
from edgemask.profiling.verdict import (CV_THRESHOLD, MIN_TRAIN_SECONDS, MIN_TRAIN_STEPS, VerdictRules, flag_set,
                                        judge)

DEFAULT_CV_THRESHOLD = CV_THRESHOLD
# One setting's repetitions pool into one row only when they measured the same model file: the file's sha256 is a
# key too (issue 27 item 2: a re-export between an interrupted campaign and its resume must not mix two models).
# A row with no digest (stored before digests were kept) is its own group, an unknown file.
SETTING_COLUMNS = ["artifact", "format", "variant", "device", "threads"]
GROUP_KEYS = [*SETTING_COLUMNS, "artifact_sha256"]
# What a setting measured: ``inference`` (a model file, one latency sample per inference or loop of them) or
# ``train`` (a training format, issue #39: one latency sample per local step of ``batch_size`` samples)
INFERENCE, TRAIN = "inference", "train"
# results.parquet's columns for a training row (NaN / null on inference rows; docs/contracts.md)
TRAINING_COLUMNS = ["batch_size", "steps_per_round", "num_train", "epochs", "trained_params", "step_p50_ms",
                    "local_round_ms", "local_rounds", "local_round_pred_ms", "step_energy_mj",
                    "local_round_energy_mj", "check_max_abs_diff", "train_io_sha256"]
# the dense comparison means nothing for a training step (its FLOP bound is the inference model's): left empty there
_COMPARISONS = ["dense_p50_ms", "dense_rss_growth_kb", "dense_model_bytes", "dense_energy_mj", "speedup",
                "memory_reduction", "size_reduction", "energy_reduction", "flop_bound", "speedup_vs_bound",
                "param_ratio"]


# -- samples --------------------------------------------------------------------------------------
def _arr(samples: Sequence[float]) -> np.ndarray:
    return np.asarray(samples, dtype=np.float64)


def mean(samples: Sequence[float]) -> float:
    a = _arr(samples)
    return float(a.mean()) if a.size else math.nan


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; NaN for no samples."""
    a = _arr(samples)
    return float(np.percentile(a, q)) if a.size else math.nan


def std(samples: Sequence[float]) -> float:
    """Sample standard deviation (ddof=1); NaN for fewer than two samples."""
    a = _arr(samples)
    return float(a.std(ddof=1)) if a.size > 1 else math.nan


def cv(samples: Sequence[float]) -> float:
    """Coefficient of variation: sample std ÷ mean."""
    m = mean(samples)
    return std(samples) / m if m else math.nan


def latency_stats(samples: Sequence[float]) -> dict[str, float]:
    return {"runs": len(samples), "mean_ms": mean(samples), "p50_ms": percentile(samples, 50),
            "p90_ms": percentile(samples, 90), "p99_ms": percentile(samples, 99),
            "std_ms": std(samples), "cv": cv(samples)}


# -- energy ---------------------------------------------------------------------------------------
def energy_per_inference_mj(power_w: Sequence[float], window_s: float, runs: int) -> float:
    """Mean power over the timed window × its length ÷ inferences, in mJ. NaN when energy was not measured."""
    if not len(power_w) or not runs or not (window_s > 0):
        return math.nan
    return mean(power_w) * window_s / runs * 1e3


def energy_above_idle_mj(power_w: Sequence[float], idle_w: float, window_s: float, runs: int) -> float:
    """Energy per inference above the board's idle draw, in mJ: what the inference itself costs."""
    if idle_w is None or math.isnan(idle_w):
        return math.nan
    total = energy_per_inference_mj(power_w, window_s, runs)
    return total - idle_w * window_s / runs * 1e3 if not math.isnan(total) else math.nan


# -- device state ---------------------------------------------------------------------------------
def throttled(state: Mapping[str, Any] | str) -> bool:
    """Whether a device state reports throttling: any field whose name contains "throttl" set (recursively)."""
    if isinstance(state, str):
        state = json.loads(state) if state else {}
    for key, value in state.items():
        if "throttl" in str(key).lower() and flag_set(value):
            return True
        if isinstance(value, Mapping) and throttled(value):
            return True
    return False


# -- tables ---------------------------------------------------------------------------------------
_CARRIED = ["run_id", "client_id", "kind", "algorithm", "model", "dataset", "params_dense", "params_compacted",
            "flops_dense", "flops_compacted", "model_bytes"]


def _median(values: pd.Series) -> float:
    v = pd.to_numeric(values, errors="coerce").dropna()
    return float(v.median()) if len(v) else math.nan


def _loops(rows: pd.DataFrame) -> pd.Series:
    """Inferences per latency sample of each row (1 where a table predates the column)."""
    if "inferences_per_sample" not in rows.columns:
        return pd.Series(1, index=rows.index, dtype=int)
    return pd.to_numeric(rows["inferences_per_sample"], errors="coerce").fillna(1).astype(int)


def _summarize_group(g: pd.DataFrame, rules: VerdictRules) -> dict[str, Any]:
    ok = g[g["ok"].astype(bool)]
    samples = [x for xs in ok["latency_ms"] for x in xs]
    row: dict[str, Any] = {"repetitions": len(ok), "n_failed": int(len(g) - len(ok))}
    row.update(latency_stats(samples))
    row["p1_ms"] = percentile(samples, 1)
    row["min_ms"] = float(min(samples)) if samples else math.nan
    row["max_ms"] = float(max(samples)) if samples else math.nan
    row["runs_min"] = int(ok["latency_ms"].map(len).min()) if len(ok) else 0
    row["unstable_attempts"] = int(g["unstable_attempts"].sum()) if "unstable_attempts" in g.columns else 0
    loops = _loops(ok)
    row["inferences_per_sample"] = int(loops.max()) if len(ok) else 0
    row["inferences"] = int((ok["latency_ms"].map(len) * loops).sum()) if len(ok) else 0
    row["timed_window_s_min"] = float(pd.to_numeric(ok["timed_window_s"]).min()) if len(ok) else math.nan
    energies, above = [], []
    for m, k in zip(ok.itertuples(), loops):
        runs = len(m.latency_ms) * int(k)  # timed inferences
        energies.append(energy_per_inference_mj(m.power_w, m.timed_window_s, runs))
        above.append(energy_above_idle_mj(m.power_w, m.idle_power_w, m.timed_window_s, runs))
    finite = [e for e in energies if not math.isnan(e)]
    finite_above = [e for e in above if not math.isnan(e)]
    row["energy_mj"] = float(np.mean(finite)) if finite else math.nan
    row["energy_above_idle_mj"] = float(np.mean(finite_above)) if finite_above else math.nan
    row["mean_power_w"] = mean([p for ps in ok["power_w"] for p in ps])
    row["load_ms"] = _median(ok["load_ms"])
    row["first_inference_ms"] = _median(ok["first_inference_ms"])
    row["peak_rss_kb"] = _median(ok["peak_rss_kb"])
    row["rss_growth_kb"] = _median(ok["rss_growth_kb"])
    row["accuracy"] = _median(ok["accuracy"])
    row["output_max_abs_diff"] = float(pd.to_numeric(g["output_max_abs_diff"], errors="coerce").max())
    sources = [s for s in ok["power_source"] if s]
    row["power_source"] = sources[0] if sources else None
    reasons = [r for r in g["energy_missing_reason"] if r]
    errors = [e for e in g["error"] if e]
    row["energy_missing_reason"] = reasons[0] if reasons else None
    row["error"] = errors[0] if errors else None
    row["flag_energy_missing"] = bool(len(ok) and len(finite) < len(ok))
    row.update(judge(g, row["cv"], rules).columns())
    return row


def workload(fmt: str) -> str:
    """``train`` for a training format's setting (a local step per sample), else ``inference``."""
    return TRAIN if is_training_format(str(fmt)) else INFERENCE


def _first_int(values: Any) -> float:
    v = [x for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return int(v[0]) if v else math.nan


def training_row(g: pd.DataFrame, step_p50_ms: float, step_energy_mj: float) -> dict[str, Any]:
    """The training columns of one training setting's rows: the local round's shape (``batch_size``,
    ``steps_per_round`` from the runner's ``training`` record, ``num_train``, ``epochs`` and ``trained_params`` from
    the manifest), ``step_p50_ms`` (the p50 of the step samples), ``local_round_ms`` (the median of every measured
    whole round, all repetitions pooled) over ``local_rounds`` rounds, ``local_round_pred_ms`` = step p50 ×
    steps_per_round, energy per step and per round (step × steps_per_round) where power was measured, the largest
    one-step check difference and the train_io digest the board checked against."""
    ok = g[g["ok"].astype(bool)]
    info = [t if isinstance(t, dict) else {} for t in (ok["training"] if "training" in ok.columns else [])]
    rounds = [float(x) for t in info for x in (t.get("round_ms") or [])]
    steps = _first_int(t.get("steps_per_round") for t in info)
    diffs = [float(t["check_max_abs_diff"]) for t in info if _finite(t.get("check_max_abs_diff"))]
    ios = [t.get("train_io_sha256") for t in info if t.get("train_io_sha256")]
    out = {"batch_size": _first_int(t.get("batch_size") for t in info), "steps_per_round": steps,
           **{k: _first_int(ok[k]) if k in ok.columns else math.nan for k in ("num_train", "epochs", "trained_params")},
           "step_p50_ms": step_p50_ms, "local_round_ms": float(np.median(rounds)) if rounds else math.nan,
           "local_rounds": len(rounds), "local_round_pred_ms": step_p50_ms * steps,
           "step_energy_mj": step_energy_mj, "local_round_energy_mj": step_energy_mj * steps,
           "check_max_abs_diff": max(diffs) if diffs else math.nan, "train_io_sha256": ios[0] if ios else None}
    return out


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def summarize(df: pd.DataFrame, cv_threshold: float = DEFAULT_CV_THRESHOLD,
              rules: VerdictRules | None = None, training_rules: VerdictRules | None = None) -> pd.DataFrame:
    """One row per artifact × format × variant × device × threads from ``ResultsStore.to_dataframe()``.

    Latency statistics pool the raw samples of all repetitions; memory is the median over repetitions;
    energy per inference is the mean of the repetitions that measured it. Each row carries its verdict
    (``profiling.verdict``: ``verdict``, ``valid``, ``invalid_rules``, ``reasons``, ``not_checked``); then the
    dense comparison (``compare_to_dense``). ``rules`` defaults to ``VerdictRules(cv_threshold=cv_threshold)``.

    ``workload`` says what a row measured: ``inference``, or ``train`` for a training format's setting (each
    latency sample one local step), judged by ``training_rules`` (default: the floors ``MIN_TRAIN_STEPS`` and
    ``MIN_TRAIN_SECONDS``, ``rules``' CV threshold) and given :data:`TRAINING_COLUMNS` (:func:`training_row`);
    its dense comparison columns stay empty (a step is no inference; ``comparison_valid`` False).
    """
    rules = rules or VerdictRules(cv_threshold=cv_threshold)
    training_rules = training_rules or VerdictRules(min_runs=MIN_TRAIN_STEPS, min_seconds=MIN_TRAIN_SECONDS,
                                                    cv_threshold=rules.cv_threshold)
    if df.empty:
        return pd.DataFrame(columns=[*GROUP_KEYS, *_CARRIED, "workload", "p50_ms", "verdict", "valid",
                                     "invalid_rules", "reasons", "not_checked", "comparison_valid"])
    if "artifact_sha256" not in df.columns:
        df = df.assign(artifact_sha256=None)
    rows = []
    for keys, g in df.groupby(GROUP_KEYS, sort=True, dropna=False):
        row = dict(zip(GROUP_KEYS, keys))
        first = g.iloc[0]
        row.update({c: first[c] for c in _CARRIED if c in g.columns})
        row["workload"] = workload(row["format"])
        train = row["workload"] == TRAIN
        row.update(_summarize_group(g, training_rules if train else rules))
        if train:
            row.update(training_row(g, row["p50_ms"], row["energy_mj"]))
        rows.append(row)
    out = pd.DataFrame(rows)
    is_train = out["workload"] == TRAIN
    inference = compare_to_dense(out[~is_train])
    if not is_train.any():
        return inference
    training = out[is_train].assign(comparison_valid=False)
    training = training.assign(**{c: math.nan for c in _COMPARISONS},
                               dense_valid=pd.Series(pd.NA, index=training.index, dtype="boolean"))
    both = pd.concat([inference, training], ignore_index=True)
    return both.sort_values(GROUP_KEYS, kind="stable", na_position="first").reset_index(drop=True)


def compare_to_dense(summary: pd.DataFrame) -> pd.DataFrame:
    """Add comparisons against the dense baseline of the same run, format, variant, device and threads.

    speedup = dense p50 ÷ p50; memory_reduction = 1 − RSS growth ÷ dense RSS growth (the memory the model
    itself takes once loaded); size_reduction likewise for the model file; energy_reduction for energy per
    inference; flop_bound = dense FLOPs ÷ compacted FLOPs (the most compaction can buy if time followed
    FLOPs); speedup_vs_bound = speedup ÷ flop_bound; param_ratio = dense ÷ compacted parameters (the
    parameter-byte ratio: both sides store parameters in the same dtype).

    A comparison rests on two verdicts: ``comparison_valid`` is True only when this setting and its dense
    baseline are both VALID. The ratios are kept either way; readers show an invalid one flagged.
    """
    out = summary.copy()
    dense = out[out["kind"] == "dense"]
    match = ["run_id", "format", "variant", "device", "threads"]
    base = dense[match + ["p50_ms", "rss_growth_kb", "model_bytes", "energy_mj", "valid"]].rename(
        columns={"p50_ms": "dense_p50_ms", "rss_growth_kb": "dense_rss_growth_kb",
                 "model_bytes": "dense_model_bytes", "energy_mj": "dense_energy_mj", "valid": "dense_valid"})
    # a baseline measured from two files (its rows split by artifact_sha256) is no baseline: no comparison
    base = base.drop_duplicates(match, keep=False)
    out = out.merge(base, on=match, how="left")

    def ratio(a: str, b: str) -> pd.Series:
        num = pd.to_numeric(out[a], errors="coerce").astype(float)
        den = pd.to_numeric(out[b], errors="coerce").astype(float)
        return num / den.where(den != 0)

    out["speedup"] = ratio("dense_p50_ms", "p50_ms")
    out["memory_reduction"] = 1.0 - ratio("rss_growth_kb", "dense_rss_growth_kb")
    out["size_reduction"] = 1.0 - ratio("model_bytes", "dense_model_bytes")
    out["energy_reduction"] = 1.0 - ratio("energy_mj", "dense_energy_mj")
    out["flop_bound"] = ratio("flops_dense", "flops_compacted")
    out.loc[out["kind"] == "dense", "flop_bound"] = 1.0
    out["speedup_vs_bound"] = out["speedup"] / out["flop_bound"]
    out["param_ratio"] = ratio("params_dense", "params_compacted")
    out.loc[out["kind"] == "dense", "param_ratio"] = 1.0
    out["dense_valid"] = out["dense_valid"].astype("boolean")
    out["comparison_valid"] = (out["valid"].astype(bool) & out["dense_valid"].fillna(False)).astype(bool)
    return out
