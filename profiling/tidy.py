"""Tidy data beside the store: ``results.parquet`` (one row per setting) and ``samples.parquet`` (one row per raw
sample), so ``pandas.read_parquet`` is all a user needs. Columns are documented in ``docs/contracts.md``.

Tidy in Wickham's sense (each variable a column, each observation a row): a setting is one observation of the
statistics table; one timed latency sample (or one power reading) is one observation of the samples table, in the same
long format as a run's ``history.parquet`` (``metric``, ``value``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from edgemask.fileio import atomic_path

RESULTS_PARQUET = "results.parquet"
SAMPLES_PARQUET = "samples.parquet"

# The artifact and setting, first in both tables (results.parquet and samples.parquet join on SETTING_KEYS).
# artifact_sha256: the model file measured (store column); a setting measured from two files has one row per file,
# never one pooled row (profiling.stats.GROUP_KEYS), and its samples say which file each came from.
ID_COLUMNS = ["run_id", "client_id", "algorithm", "kind", "model", "dataset", "format", "variant", "device",
              "threads", "artifact", "artifact_sha256"]
SETTING_KEYS = ["artifact", "format", "variant", "device", "threads", "artifact_sha256"]
VERDICT_COLUMNS = ["verdict", "valid", "invalid_rules", "reasons", "not_checked", "comparison_valid"]
# Raw sample lists of ResultsStore.to_dataframe() -> the metric name they get in samples.parquet.
SAMPLE_METRICS = {"latency_ms": "latency_ms", "power_w": "power_w"}


def results_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """``profiling.stats.summarize``'s table with the identifying columns, ``workload`` (``inference`` or
    ``train``) and the verdict columns first; a training row's own columns (``profiling.stats.TRAINING_COLUMNS``)
    are there when the campaign measured a training format."""
    first = [c for c in [*ID_COLUMNS, "workload", *VERDICT_COLUMNS] if c in summary.columns]
    return summary[first + [c for c in summary.columns if c not in first]].reset_index(drop=True)


def with_predicted(results: pd.DataFrame, predicted: pd.DataFrame | None) -> pd.DataFrame:
    """``results`` with a ``predicted`` column (False: every row there was measured) and, after them, the rows
    :func:`edgemask.profiling.predict.predicted_rows` made (``predicted`` True, ``verdict`` ``PREDICTED``, never VALID).
    Without predictions the table is returned as it was: campaigns that measure every client keep their columns."""
    if predicted is None or predicted.empty:
        return results
    out = results.assign(predicted=False)
    rows = predicted.assign(predicted=True, valid=False, comparison_valid=False)
    return pd.concat([out, rows], ignore_index=True)


def samples_frame(measurements: pd.DataFrame) -> pd.DataFrame:
    """One row per raw sample of ``ResultsStore.to_dataframe()``: the artifact and setting columns, ``job_id``,
    ``repetition``, ``inferences_per_sample`` (how many back-to-back inferences a latency sample averages),
    ``metric`` (``latency_ms`` or ``power_w``), ``sample`` (its index within the repetition, in the order taken)
    and ``value``. Failed repetitions hold no samples, so they have no rows."""
    keys = [*ID_COLUMNS, "job_id", "repetition", "inferences_per_sample"]
    parts = []
    for column, metric in SAMPLE_METRICS.items():
        lengths = measurements[column].map(len).to_numpy() if len(measurements) else np.zeros(0, int)
        part = measurements.loc[measurements.index.repeat(lengths), keys].reset_index(drop=True)
        part["metric"] = metric
        part["sample"] = np.concatenate([np.arange(n) for n in lengths]) if lengths.sum() else np.zeros(0, int)
        values = [np.asarray(x, dtype=np.float64) for x in measurements[column]]
        part["value"] = np.concatenate(values) if lengths.sum() else np.zeros(0)
        parts.append(part)
    out = pd.concat(parts, ignore_index=True)
    out["sample"] = out["sample"].astype("int64")
    return out


def write_tidy(results_dir: str | Path, summary: pd.DataFrame, measurements: pd.DataFrame, *,
               csv: bool = False, predicted: pd.DataFrame | None = None) -> list[Path]:
    """Write ``results.parquet`` and ``samples.parquet`` (and ``results.csv``, ``samples.csv`` when ``csv``)
    into ``results_dir``, each atomically; return the paths written. ``predicted``: rows of clients a sampled
    campaign did not measure (:func:`with_predicted`), in ``results`` only (a prediction has no samples)."""
    results_dir = Path(results_dir)
    written = []
    for name, table in (("results", with_predicted(results_frame(summary), predicted)), ("samples", samples_frame(measurements))):
        path = results_dir / f"{name}.parquet"
        with atomic_path(path) as tmp:
            table.to_parquet(tmp, index=False)
        written.append(path)
        if csv:
            path = results_dir / f"{name}.csv"
            with atomic_path(path) as tmp:
                table.to_csv(tmp, index=False)
            written.append(path)
    return written
