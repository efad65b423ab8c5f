"""The campaign report: one self-contained HTML page (plots embedded as PNG) and a Markdown summary.

The main table follows the FedMask paper's runtime evaluation (Li et al., "FedMask: Joint Computation and
Communication-Efficient Personalized Federated Learning via Heterogeneous Masking", SenSys 2021, §7): per
application (dataset / model), each algorithm's model size, inference time and energy per inference, here
split further into the dense baseline and the compacted personalized models, per device and format.
"""

from __future__ import annotations

import base64
import html
import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from edgemask.errors import CorruptFileError
from edgemask.fileio import sha256_file, write_bytes_atomic, write_text_atomic
from edgemask.targets import TRAINING_FORMATS
from edgemask.profiling import plots
from edgemask.profiling.layers import REALIZED_FLAG, LayerBreakdown, LayerRow, breakdowns, time_text
from edgemask.profiling.rounds import RunRounds, read_rounds
from edgemask.profiling.stats import DEFAULT_CV_THRESHOLD, SETTING_COLUMNS, TRAIN, summarize
from edgemask.profiling.store import ResultsStore
from edgemask.profiling.tidy import write_tidy
from edgemask.profiling.verdict import CV_THRESHOLD, RULES, VerdictRules, headline


# -- number formatting (one place, so HTML and Markdown agree) ----------------------------------------
def _is_missing(x: Any) -> bool:
    return x is None or x is pd.NA or (isinstance(x, float) and math.isnan(x))


def fmt_ms(x: Any) -> str:
    return "—" if _is_missing(x) else f"{float(x):.3f}"


def fmt_ratio(x: Any) -> str:
    return "—" if _is_missing(x) else f"{float(x):.2f}×"


def fmt_pct(x: Any) -> str:
    return "—" if _is_missing(x) else f"{100 * float(x):.1f}%"


def fmt_kb(x: Any) -> str:
    return "—" if _is_missing(x) else f"{float(x) / 1024:.1f}"


def fmt_int(x: Any) -> str:
    return "—" if _is_missing(x) else f"{int(round(float(x))):,}"


def fmt_text(x: Any) -> str:
    return "—" if _is_missing(x) or x == "" else str(x)


def _short_digest(x: Any) -> str:
    """A model file's sha256, shortened for a table cell; "unknown" where the store has none."""
    return "unknown" if _is_missing(x) or not x else f"{str(x)[:12]}…"


# -- tables ---------------------------------------------------------------------------------------------
def runtime_table(summary: pd.DataFrame) -> pd.DataFrame:
    """FedMask-style runtime table: per application × device × format × variant × threads × algorithm ×
    dense/compacted, the mean over that group's artifacts (clients) of size, latency and energy.

    Measured numbers average the VALID settings only, comparisons (speedup, its ratio to the FLOP bound) only
    those whose dense baseline is VALID too; ``valid`` says how many of the group's settings that is. A group
    without one VALID setting shows no measured number (the detail table still has them, flagged)."""
    if summary.empty:
        return pd.DataFrame()
    s = summary.copy()
    s["application"] = s["dataset"].fillna("?").astype(str) + " / " + s["model"].fillna("?").astype(str)
    s["params"] = s["params_compacted"].where(s["kind"] != "dense", s["params_dense"]).astype("Float64")
    keys = ["application", "device", "format", "variant", "threads", "algorithm", "kind"]
    static = ["params", "model_bytes", "flop_bound"]
    measured = ["p50_ms", "p90_ms", "energy_mj", "energy_above_idle_mj"]
    compared = ["speedup", "speedup_vs_bound"]
    for col in static + measured + compared:
        s[col] = pd.to_numeric(s[col], errors="coerce").astype(float)
    # a setting measured from two files (one detail row per file, see _digest_notes) is left out of the means:
    # which file the group's number would stand for is not one answer
    single = ~_split_settings(s)
    s[measured] = s[measured].where(s["valid"].astype(bool) & single)
    s[compared] = s[compared].where(s["comparison_valid"].astype(bool) & single)
    g = s.groupby(keys, sort=True, dropna=False)
    out = g[static + measured + compared].mean()
    out["clients"] = g["artifact"].nunique()
    out["valid"] = [f"{int(v)}/{n}" for v, n in zip(g["valid"].sum(), g["valid"].size())]
    out = out.reset_index()
    # dense baseline first within each application and setting
    out["_order"] = (out["kind"] != "dense").astype(int)
    return out.sort_values(keys[:6] + ["_order"]).drop(columns="_order").reset_index(drop=True)


_RUNTIME_COLUMNS = [
    ("algorithm", "algorithm", fmt_text), ("kind", "model", fmt_text), ("clients", "clients", fmt_int),
    ("valid", "VALID", fmt_text), ("params", "params", fmt_int), ("model_bytes", "size (KB)", fmt_kb),
    ("p50_ms", "p50 (ms)", fmt_ms),
    ("p90_ms", "p90 (ms)", fmt_ms), ("energy_mj", "energy (mJ/inf)", fmt_ms),
    ("energy_above_idle_mj", "above idle (mJ/inf)", fmt_ms), ("speedup", "speedup", fmt_ratio),
    ("flop_bound", "FLOP bound", fmt_ratio), ("speedup_vs_bound", "speedup ÷ bound", fmt_pct),
]

# (column, title, formatter[, boolean column that must be True, else the value is marked INVALID_MARK])
_DETAIL_COLUMNS = [
    ("artifact", "artifact", fmt_text), ("device", "device", fmt_text), ("format", "format", fmt_text),
    ("variant", "variant", fmt_text), ("threads", "threads", fmt_int),
    ("artifact_sha256", "model sha256", _short_digest), ("verdict", "verdict", fmt_text),
    ("repetitions", "reps", fmt_int), ("runs", "runs", fmt_int), ("p50_ms", "p50 (ms)", fmt_ms),
    ("p90_ms", "p90 (ms)", fmt_ms), ("p99_ms", "p99 (ms)", fmt_ms), ("mean_ms", "mean (ms)", fmt_ms),
    ("cv", "CV", fmt_pct), ("load_ms", "load (ms)", fmt_ms), ("peak_rss_kb", "peak RSS (KB)", fmt_int),
    ("rss_growth_kb", "RSS growth (KB)", fmt_int), ("energy_mj", "energy (mJ/inf)", fmt_ms),
    ("energy_above_idle_mj", "above idle (mJ/inf)", fmt_ms), ("power_source", "power source", fmt_text),
    ("speedup", "speedup", fmt_ratio, "comparison_valid"),
    ("memory_reduction", "memory saved", fmt_pct, "comparison_valid"),
    ("energy_reduction", "energy saved", fmt_pct, "comparison_valid"),
    ("flop_bound", "FLOP bound", fmt_ratio), ("param_ratio", "param-byte ratio", fmt_ratio),
    ("speedup_vs_bound", "speedup ÷ bound", fmt_pct, "comparison_valid"), ("accuracy", "accuracy", fmt_pct),
    ("reasons", "INVALID because", fmt_text),
]  # what went unchecked is said once per rule and device above the tables (verdict_lines)

INVALID_MARK = "†"
INVALID_LEGEND = (f"{INVALID_MARK} rests on an INVALID setting (this one or its dense baseline): shown, "
                  "not to be quoted")


# Algorithms whose dense artifact is the frozen random weights the masks select from: without its mask it is near
# chance, so the tables say what it is (a latency baseline, the same network before compaction, not an accuracy one).
FROZEN_DENSE = {"fedmask": "frozen random weights, no mask"}


def _artifact_labels(df: pd.DataFrame) -> list[str]:
    """Each row's artifact name, with what a dense baseline is where that is not the trained model."""
    kinds = df["kind"] if "kind" in df else [None] * len(df)
    algos = df["algorithm"] if "algorithm" in df else [None] * len(df)
    return [f"{a} ({FROZEN_DENSE[al]})" if k == "dense" and al in FROZEN_DENSE else str(a)
            for a, k, al in zip(df["artifact"], kinds, algos)]


def _formatted(df: pd.DataFrame, columns: list[tuple]) -> pd.DataFrame:
    out = {}
    for col, title, fn, *guard in columns:
        if col not in df:
            continue
        cells = _artifact_labels(df) if col == "artifact" else [fn(v) for v in df[col]]
        if guard:
            cells = [c if ok or c == "—" else f"{c} {INVALID_MARK}" for c, ok in zip(cells, df[guard[0]])]
        out[title] = cells
    return pd.DataFrame(out)


def _markdown_table(df: pd.DataFrame) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(c) for c in df.columns) + " |",
             "| " + " | ".join("---" for _ in df.columns) + " |"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join(lines)


def _html_table(df: pd.DataFrame) -> str:
    return "<div class='wrap'>" + df.to_html(index=False, escape=True, border=0, classes="t") + "</div>"


# -- inputs ---------------------------------------------------------------------------------------------
def _run_curves(workspace: Path, artifacts: pd.DataFrame) -> tuple[dict[str, pd.DataFrame], list[str]]:
    curves: dict[str, pd.DataFrame] = {}
    notes: list[str] = []
    for run_id, g in artifacts.groupby("run_id", sort=True):
        path = workspace / "runs" / str(run_id) / "history.parquet"
        label = f"{g['algorithm'].iloc[0] or '?'} ({run_id})"
        if not path.is_file():
            notes.append(f"no training history for run {run_id} ({path} is absent); its accuracy curve is left out")
            continue
        try:
            history = pd.read_parquet(path)
        except (OSError, ValueError) as exc:
            notes.append(f"training history {path} is unreadable ({exc}); its accuracy curve is left out")
            continue
        missing = {"round", "client", "metric", "value"} - set(history.columns)
        if missing:
            notes.append(f"training history {path} lacks columns {', '.join(sorted(missing))}; left out")
            continue
        curve = plots.accuracy_curve(history)
        if curve.empty:
            notes.append(f"training history {path} has no accuracy rows; left out")
            continue
        # an algorithm scoring clients on more than one model (FedMask: the local mask and the returned one,
        # docs/fedmask.md) gets one line per measure, each named
        measures = sorted(m[len("accuracy_"):] for m in history["metric"].unique() if str(m).startswith("accuracy_"))
        curves[label if not measures else f"{label}, local mask"] = curve
        for m in measures:
            curves[f"{label}, {m.replace('_', ' ')}"] = plots.accuracy_curve(history, f"accuracy_{m}")
    return curves, notes


def _split_settings(summary: pd.DataFrame) -> pd.Series:
    """True for each row whose setting (artifact × format × variant × device × threads) has rows of more than one
    model file (``artifact_sha256``; a missing digest counts as one more, unknown file)."""
    if summary.empty or "artifact_sha256" not in summary.columns:
        return pd.Series(False, index=summary.index)
    files = summary["artifact_sha256"].map(lambda d: "" if _is_missing(d) else str(d))
    keys = [summary[c].astype(str) for c in SETTING_COLUMNS]
    return files.groupby(keys).transform("nunique").gt(1).reindex(summary.index, fill_value=False)


def _digest_notes(summary: pd.DataFrame) -> list[str]:
    """One note per setting measured from more than one model file: shown as one row per file, never pooled."""
    split = summary[_split_settings(summary)]
    notes = []
    for keys, g in split.groupby(SETTING_COLUMNS, sort=True):
        artifact, fmt, variant, device, threads = keys
        files = ", ".join(f"{_short_digest(d)} ({int(r)} rep.)" for d, r in zip(g["artifact_sha256"],
                                                                                 g["repetitions"]))
        notes.append(f"{artifact} {fmt}/{variant} on {device} with {threads} thread(s) was measured from "
                     f"{len(g)} different model files (sha256 {files}): one row per file, never pooled, and left "
                     "out of the runtime table's means")
    return notes


def _energy_notes(summary: pd.DataFrame) -> list[str]:
    notes = []
    missing = summary[summary["flag_energy_missing"]]
    for device, g in missing.groupby("device", sort=True):
        reasons = sorted({r for r in g["energy_missing_reason"] if r}) or ["the runner gave no reason"]
        notes.append(f"energy is missing on {device} for {len(g)} of "
                     f"{int((summary['device'] == device).sum())} settings: {'; '.join(reasons)}")
    return notes


@dataclass
class _Figure:
    name: str
    title: str
    png: bytes | None
    note: str | None = None


# -- the report -----------------------------------------------------------------------------------------
def _load(results_dir: Path) -> dict[str, Any]:
    store_path = results_dir / "results.sqlite"
    if not store_path.is_file():
        raise CorruptFileError(f"{store_path}: no results store; run `edgemask profile` first")
    with ResultsStore.open(store_path) as store:
        return {"df": store.to_dataframe(), "artifacts": store.artifacts(), "failures": store.failures(),
                "skipped": store.skipped(), "config": store.campaign_config() or {},
                "profiles": store.profiles(), "profiled_runs": store.profiled_runs(),
                "operator_samples": store.operator_samples(), "runs": store.runs()}


def write_report(results_dir: str | Path, workspace: str | Path, cv_threshold: float = DEFAULT_CV_THRESHOLD,
                 *, rules: VerdictRules | None = None, csv: bool = False,
                 training_rules: VerdictRules | None = None, train_format: str | None = None) -> tuple[Path, Path]:
    """Write ``report.html``, ``summary.md``, ``plots/*.png`` and the tidy tables (``results.parquet``,
    ``samples.parquet``; also ``results.csv`` and ``samples.csv`` when ``csv``) into ``results_dir``, beside the
    store; return the paths of the page and the summary. ``rules`` (default: the verdict module's thresholds
    and the campaign's own minimums, :meth:`VerdictRules.for_campaign`, with ``cv_threshold``) decide each
    setting's verdict; a training format's settings (a local step per sample, issue #39) are judged by
    ``training_rules`` (default :meth:`VerdictRules.for_training`), kept out of every inference table and plot, and
    shown in their own table (:func:`training_sections`); ``train_format`` (default
    ``profiling.training.DEFAULT_TRAIN_FORMAT``, torch-train) is the one whose round the ledger and traces take
    where both were measured."""
    from edgemask.profiling.training import DEFAULT_TRAIN_FORMAT

    from edgemask.profiling.provenance import changed_artifacts, checked_runs, finite_samples

    results_dir, workspace = Path(results_dir), Path(workspace)
    data = _load(results_dir)
    df, artifacts, failures, skipped, config = (data[k] for k in ("df", "artifacts", "failures", "skipped",
                                                                     "config"))
    # before anything is written: each run's artifacts state one model, and the run directory the ledger and the
    # traces read is the run they were exported from (issue #44)
    store_path = results_dir / "results.sqlite"
    finite_samples(df, str(store_path))
    runs = checked_runs(artifacts, data["runs"], workspace, str(store_path))
    inputs = {"results.sqlite": sha256_file(store_path)}
    # runs trained with [system]: their own rounds, as the training loop timed them (issue #46)
    in_loop = [r for r in (read_rounds(workspace, run_id) for run_id in sorted(runs)) if r is not None]
    rules = rules or VerdictRules.for_campaign(config, cv_threshold)
    training_rules = training_rules or VerdictRules.for_training(config, rules.cv_threshold)
    train_format = train_format or DEFAULT_TRAIN_FORMAT
    name = config.get("name", results_dir.name)
    every = summarize(df, rules=rules, training_rules=training_rules)
    # the inference settings: every table and plot below but the training table
    summary = every[every["workload"] != TRAIN].reset_index(drop=True) if not every.empty else every
    df = df[~df["format"].isin(TRAINING_FORMATS)] if not df.empty else df
    predicted, prediction_errors = _predictions(config, summary, data)
    write_tidy(results_dir, every, data["df"], csv=csv, predicted=predicted)
    ledger_fig, ledger_sections, ledger_notes = ledger_part(results_dir, workspace, every, train_format, runs,
                                                            inputs)
    runtime = runtime_table(summary)
    curves, history_notes = _run_curves(workspace, artifacts)
    energy_notes = _energy_notes(summary) if not summary.empty else []

    figures = [
        _Figure("latency", "Latency per setting (log scale; whiskers p1–p99, samples beyond them counted)",
                _png(plots.latency_distributions(df, summary) if not df.empty else None),
                "no successful measurements to plot"),
        _Figure("speedup", "Per client: measured speedup against its FLOP bound and parameter-byte ratio",
                _png(plots.speedup_per_client(summary) if not summary.empty else None),
                "no compacted artifact has a measured dense baseline"),
        _Figure("accuracy_vs_communication", "Accuracy against bytes communicated per algorithm",
                _png(plots.accuracy_vs_communication(curves)),
                "no run has a training history with accuracy; " + "; ".join(history_notes)),
        _Figure("energy", "Energy per inference",
                _png(plots.energy_per_inference(summary) if not summary.empty else None),
                "energy is missing for every measurement: " + ("; ".join(energy_notes) or "no measurements")),
        ledger_fig,
    ]
    if predicted is not None:
        figures.append(_Figure("predicted", "Measured (●) and predicted (not measured: ✕, or a hexagon density where "
                               "many) p50 latency per client",
                               _png(plots.measured_and_predicted(summary, predicted)),
                               "no client was predicted"))
    plot_dir = results_dir / "plots"
    for f in figures:
        if f.png is not None:
            write_bytes_atomic(plot_dir / f"{f.name}.png", f.png)

    notes = [*changed_artifacts(workspace, artifacts), *(_digest_notes(summary) if not summary.empty else []),
             *energy_notes, *history_notes, *ledger_notes]
    if not failures.empty:
        notes.append(f"{len(failures)} job(s) failed after their retries and are not in the tables "
                     f"(rerun `edgemask profile` to retry them)")

    layer_bds, layer_notes = breakdowns(artifacts, data["profiles"], data["profiled_runs"],
                                        data["operator_samples"])
    if not data["profiles"].empty:
        figures.append(_Figure("layer_time", "Where the time goes: per layer, dense against compacted (profiled runs)",
                               _png(plots.layer_time_stacks(layer_bds)),
                               "no compacted artifact has per-layer times: " + ("; ".join(layer_notes) or "none")))
        fig = figures[-1]
        if fig.png is not None:
            write_bytes_atomic(plot_dir / f"{fig.name}.png", fig.png)
    notes += layer_notes

    generated = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    verdict = verdict_lines(every, rules, training_rules)
    trained = not every.empty and bool((every["workload"] == TRAIN).any())
    sections = (_sections(runtime, summary, failures, skipped, trained) + training_sections(every, train_format)
                + in_loop_sections(in_loop) + ledger_sections + layer_sections(layer_bds)
                + predicted_sections(predicted, prediction_errors))
    derived = inputs_text({**inputs, **{f"runs/{r.run_id}/{name}": d for r in in_loop for name, d in r.inputs.items()}},
                          runs)
    md = _markdown(name, generated, config, verdict, sections, figures, notes, derived)
    page = _html(name, generated, config, verdict, sections, figures, notes, derived)
    md_path, html_path = results_dir / "summary.md", results_dir / "report.html"
    write_text_atomic(md_path, md)
    write_text_atomic(html_path, page)
    return html_path, md_path


def _predictions(config: dict[str, Any], summary: pd.DataFrame,
                 data: dict[str, Any]) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """With ``sample_clients`` set: the unmeasured clients' predicted rows and each setting's held-out error
    (:mod:`edgemask.profiling.predict`); otherwise (None, None)."""
    if not config.get("sample_clients"):
        return None, None
    from edgemask.profiling.predict import predicted_rows

    return predicted_rows(summary, data["artifacts"], data["profiles"], data["profiled_runs"],
                          data["operator_samples"])


PREDICTED_MARK = "≈"


def predicted_sections(predicted: pd.DataFrame | None,
                       errors: pd.DataFrame | None) -> list[tuple[int, str, pd.DataFrame | None]]:
    """The predicted clients, apart from every measured table (never in a VALID count or a comparison): per
    setting the held-out error of the predictor, then one row per predicted client, its p50 marked ≈."""
    if predicted is None:
        return []
    from edgemask.profiling.predict import error_lines

    out: list[tuple[int, str, pd.DataFrame | None]] = [
        (2, f"Predicted, not measured ({PREDICTED_MARK}: sum over layers of per-layer fits on the measured "
            "clients + the fixed per-inference cost; no verdict, in no comparison)", None)]
    for line in error_lines(errors if errors is not None else pd.DataFrame()):
        out.append((3, line, None))
    if predicted.empty:  # a setting with clients left and none predicted has said why above
        if errors is None or errors.empty:
            out.append((3, "No client left to predict (every client has a measured setting).", None))
        return out
    table = pd.DataFrame({"artifact": predicted["artifact"], "device": predicted["device"],
                          "format": predicted["format"] + "/" + predicted["variant"],
                          "threads": predicted["threads"].astype(str),
                          "p50 ms": [f"{PREDICTED_MARK}{fmt_ms(x)}" for x in predicted["p50_ms"]],
                          "verdict": predicted["verdict"],
                          "fitted on": predicted["predicted_from"].str.count(",") + 1})
    out.append((3, "Predicted clients", table.astype(str)))
    return out


def verdict_lines(summary: pd.DataFrame, rules: VerdictRules, training_rules: VerdictRules | None = None
                  ) -> list[str]:
    """What every summary leads with: how many settings are VALID, the rules, and what could not be checked
    where."""
    lines = [headline(summary), f"A setting is VALID with {rules.describe()}."]
    if training_rules is not None and "workload" in summary.columns and (summary["workload"] == TRAIN).any():
        lines.append(f"A training setting (one local step per sample) is VALID with {training_rules.describe()}.")
    if summary.empty:
        return lines
    unchecked: dict[tuple[str, str], set[str]] = {}  # (rule, why) -> devices
    for device, text in zip(summary["device"], summary["not_checked"]):
        for part in filter(None, str(text).split("; ")):
            rule, _, why = part.partition(": not checked: ")
            unchecked.setdefault((rule, why), set()).add(str(device))
    for (rule, why), devices in sorted(unchecked.items(), key=lambda kv: (RULES.index(kv[0][0]), kv[0][1])):
        lines.append(f"{rule} not checked on {', '.join(sorted(devices))}: {why}.")
    again = summary[summary["unstable_attempts"] > 0]
    if len(again):
        which = ", ".join(f"{r.artifact} {r.format} {r.device} ({int(r.unstable_attempts)})"
                          for r in again.itertuples())
        lines.append(f"Measured again after an attempt with CV above {100 * CV_THRESHOLD:g} % (campaign "
                     f"remeasure_unstable; the dropped attempts are kept in the store): {which}.")
    if not summary["comparison_valid"].all():
        lines.append(INVALID_LEGEND + ".")
    return lines


_SUMMARY_COLUMNS = [
    ("artifact", "setting", fmt_text), ("device", "device", fmt_text), ("format", "format", fmt_text),
    ("variant", "variant", fmt_text), ("threads", "thr", fmt_int), ("runs", "runs", fmt_int),
    ("inferences_per_sample", "inf/sample", fmt_int),
    ("p50_ms", "p50 ms", fmt_ms), ("p99_ms", "p99 ms", fmt_ms), ("cv", "CV", fmt_pct),
    ("speedup", "speedup", fmt_ratio, "comparison_valid"), ("flop_bound", "FLOP bound", fmt_ratio),
    ("param_ratio", "param bytes", fmt_ratio), ("verdict", "verdict", fmt_text),
    ("invalid_rules", "INVALID because", fmt_text),
]


def summary_table(results_dir: str | Path, *, rules: VerdictRules | None = None) -> str:
    """The campaign's settings as plain text for a terminal: the verdict lines first, then one row per setting
    (latency, CV, speedup over the dense baseline against its FLOP bound and parameter-byte ratio, verdict)."""
    data = _load(Path(results_dir))
    rules = rules or VerdictRules.for_campaign(data["config"])
    training_rules = VerdictRules.for_training(data["config"], rules.cv_threshold)
    summary = summarize(data["df"], rules=rules, training_rules=training_rules)
    lines = verdict_lines(summary, rules, training_rules)
    if summary.empty:
        return "\n".join(lines)
    table = _formatted(summary, _SUMMARY_COLUMNS)
    rows = [list(table.columns), *table.astype(str).values.tolist()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = {0, 1, 2, 3, len(widths) - 2, len(widths) - 1}  # text columns
    cell = lambda i, c: c.ljust(widths[i]) if i in left else c.rjust(widths[i])  # noqa: E731
    text = ["  ".join(cell(i, c) for i, c in enumerate(r)).rstrip() for r in rows]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([*lines, "", *text])


def _png(fig: Any) -> bytes | None:
    return None if fig is None else plots.to_png(fig)


def _sections(runtime: pd.DataFrame, summary: pd.DataFrame, failures: pd.DataFrame,
              skipped: pd.DataFrame, trained: bool = False) -> list[tuple[int, str, pd.DataFrame | None]]:
    """(heading level, heading, formatted table or None) in page order; ``trained``: the campaign measured a
    training format (said where no inference setting was measured)."""
    out: list[tuple[int, str, pd.DataFrame | None]] = [
        (2, "Runtime per application (FedMask-style; measured numbers averaged over VALID settings only, "
            "— where none is)", None)]
    if runtime.empty:  # nothing to group (its columns too are absent): a campaign of training formats only
        out.append((3, "No inference setting measured: the campaign measured training formats only (their table "
                       "below)." if trained else "No successful measurements yet.", None))
        runtime = pd.DataFrame(columns=["application", "device", "format", "variant", "threads"])
    for keys, g in runtime.groupby(["application", "device", "format", "variant", "threads"], sort=True):
        app, device, fmt, variant, threads = keys
        out.append((3, f"{app} — {device}, {fmt}/{variant}, {threads} thread(s)",
                    _formatted(g, _RUNTIME_COLUMNS)))
    if not summary.empty:
        out.append((2, "Every artifact and setting", _formatted(summary, _DETAIL_COLUMNS)))
    if not failures.empty:
        out.append((2, "Failed jobs", failures[["job_id", "attempts", "reason"]].astype(str)))
    if not skipped.empty:
        out.append((2, "Skipped combinations", skipped.astype(str)))
    return out


FLAG_MARK = "⚑"


def layer_table_frame(bd: LayerBreakdown) -> pd.DataFrame:
    """One breakdown as the report shows it: per layer, units kept, FLOP bound, dense and compacted ms (``< 1 µs``
    under the timer's tick), measured speedup, speedup ÷ bound and the flag; then what no layer claims, and the
    operators' sum beside the profiled runs' end-to-end latency."""
    tick = bd.rows[0].tick_ms if bd.rows else 1e-3
    rows = [{"layer": r.layer, "units kept": f"{r.kept}/{r.total}", "FLOP ratio": fmt_ratio(r.flop_bound),
             "dense ms": time_text(r.dense_ms, r.tick_ms), "compacted ms": time_text(r.compacted_ms, r.tick_ms),
             "measured speedup": r.speedup_text, "speedup ÷ bound": _fmt_fraction(r.realized),
             "flag": _layer_flag(r)} for r in bd.rows]
    blank = {k: "" for k in rows[0]} if rows else {}
    rows.append({**blank, "layer": "(other operators)", "dense ms": time_text(bd.other_dense_ms, tick),
                 "compacted ms": time_text(bd.other_compacted_ms, tick)})
    rows.append({**blank, "layer": "sum of operators / end to end",
                 "dense ms": f"{fmt_ms(bd.ops_dense_ms)} / {fmt_ms(bd.e2e_dense_ms)}",
                 "compacted ms": f"{fmt_ms(bd.ops_compacted_ms)} / {fmt_ms(bd.e2e_compacted_ms)}"})
    return pd.DataFrame(rows)


def _layer_flag(r: LayerRow) -> str:
    """The per-layer check's word on one row: an unchanged layer outside its band (suspect, or tiny: not judged;
    with the cause where known), else the realized-fraction flag."""
    if r.out_of_band:
        lo, hi = r.band
        cause = f"; {r.cause}" if r.cause else ""
        if r.suspect:
            return f"unchanged, outside {lo:.2f}-{hi:.2f}×: suspect{cause}"
        return f"unchanged, outside {lo:.2f}-{hi:.2f}×: tiny ({r.tiny_text()}), not judged{cause}"
    return f"{FLAG_MARK} < {REALIZED_FLAG:g} of its bound" if r.flagged else ""


def _fmt_fraction(x: Any) -> str:
    return "—" if _is_missing(x) else f"{x:.2f}"


def layer_summary_frame(bds: list[LayerBreakdown]) -> pd.DataFrame:
    """One row per comparison, in setting then artifact order: the operators' summed median time, dense and
    compacted, how much faster the compacted model's operators are, the model's FLOP bound (its layers' dense
    ÷ compacted FLOPs) and how much of it they realize, and how many layers are flagged."""
    rows = []
    for bd in sorted(bds, key=lambda b: (b.device, b.format, b.variant, b.threads, b.artifact)):
        fd, fc = sum(r.flops_dense for r in bd.rows), sum(r.flops_compacted for r in bd.rows)
        faster = bd.ops_dense_ms / bd.ops_compacted_ms if bd.ops_compacted_ms else math.nan
        bound = fd / fc if fc else math.nan
        rows.append({"artifact": bd.artifact, "device": bd.device, "format": f"{bd.format}/{bd.variant}",
                     "threads": str(bd.threads), "dense ms": fmt_ms(bd.ops_dense_ms),
                     "compacted ms": fmt_ms(bd.ops_compacted_ms), "operators faster": fmt_ratio(faster),
                     "FLOP bound": fmt_ratio(bound),
                     "faster ÷ bound": _fmt_fraction(faster / bound if bound == bound and bound else math.nan),
                     f"layers {FLAG_MARK}": str(sum(r.flagged for r in bd.rows))})
    return pd.DataFrame(rows)


def layer_sections(bds: list[LayerBreakdown]) -> list[tuple[int, str, pd.DataFrame | None]]:
    """The per-layer sections (profiled runs, apart from the timed ones): one table per compacted artifact and
    setting."""
    if not bds:
        return []
    out: list[tuple[int, str, pd.DataFrame | None]] = [
        (2, f"Per layer: where compaction's time goes (profiled runs, separate from the timed ones; "
            f"{FLAG_MARK}: a layer realizing less than {REALIZED_FLAG:g} of its FLOP bound)", None)]
    trusted = [bd for bd in bds if bd.suspect is None]
    if trusted:  # the summary: only comparisons whose unchanged layers measure alike in both profiles
        left_out = len(bds) - len(trusted)
        out.append((3, f"Summary: {len(trusted)} comparison(s)"
                       + (f", {left_out} suspect left out" if left_out else "")
                       + " (sum of the layers' operators, dense against compacted)", layer_summary_frame(trusted)))
    for bd in bds:
        why = (f" — SUSPECT: {bd.suspect}" if bd.suspect else "") + (f" — {bd.unjudged}" if bd.unjudged else "")
        out.append((3, f"{bd.artifact} — {bd.device}, {bd.format}/{bd.variant}, {bd.threads} thread(s){why}",
                    layer_table_frame(bd)))
    return out


def _config_line(config: dict[str, Any]) -> str:
    if not config:
        return "campaign configuration not recorded"
    runner = config.get("runner", {})
    return (f"formats {', '.join(config.get('formats', []))}; variants {', '.join(config.get('variants', []))}; "
            f"devices {', '.join(config.get('devices', []))}; threads {config.get('threads')}; "
            f"repetitions {config.get('repetitions')}; runner: warm-up {runner.get('warmup_runs')} runs / "
            f"{runner.get('warmup_seconds')} s, at least {runner.get('min_runs')} runs and "
            f"{runner.get('min_seconds')} s"
            + (f"; then {runner.get('profile_runs')} per-operator profiled runs after {runner.get('profile_warmup')} "
               "warm-up runs (not in the latency figures)" if runner.get("profile_layers") else "")
            + _training_runner_text(config))


def _training_runner_text(config: dict[str, Any]) -> str:
    """The [training_runner] settings, where the campaign names a training format."""
    if not set(config.get("formats") or ()) & set(TRAINING_FORMATS):
        return ""
    t = config.get("training_runner") or {}
    return (f"; training formats: warm-up {t.get('warmup_runs')} steps / {t.get('warmup_seconds')} s, at least "
            f"{t.get('min_runs')} steps and {t.get('min_seconds')} s ([training_runner])")


def inputs_text(inputs: dict[str, str], runs: dict[str, Any]) -> str:
    """What the report is derived from, by digest: the store, and each run as its manifests and directory state
    it (``profiling.provenance``)."""
    parts = [f"{name} sha256 {_short_digest(d)}" for name, d in sorted(inputs.items())]
    parts += [r.describe() for _, r in sorted(runs.items())]
    return "Derived from " + "; ".join(parts)


def _markdown(name: str, generated: str, config: dict[str, Any], verdict: list[str], sections: list,
              figures: list[_Figure], notes: list[str], derived: str = "") -> str:
    parts = [f"# Campaign {name}", "", f"**{verdict[0]}.**", "", *[f"- {v}" for v in verdict[1:]], "",
             f"Generated {generated}. {_config_line(config)}.", *(["", f"{derived}."] if derived else []), ""]
    for level, heading, table in sections:
        parts += ["#" * level + " " + heading, ""]
        if table is not None:
            parts += [_markdown_table(table), ""]
    parts += ["## Plots", ""]
    for f in figures:
        parts += [f"![{f.title}](plots/{f.name}.png)" if f.png is not None else f"- {f.title}: {f.note}", ""]
    if notes:
        parts += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(parts)


_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 1.6em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; } h3 { font-size: 1.05em; }
table.t { border-collapse: collapse; font-size: 12px; margin: 8px 0 16px; }
.wrap { overflow-x: auto; max-width: 100%; }
table.t th, table.t td { border: 1px solid #ccc; padding: 3px 7px; text-align: right; white-space: nowrap; }
table.t th { background: #f3f3f3; } table.t td:first-child { text-align: left; }
.note { background: #fff8e1; border-left: 4px solid #f0b400; padding: 6px 10px; margin: 6px 0; }
figure { margin: 12px 0 24px; } figure img { max-width: 100%; border: 1px solid #eee; }
.meta { color: #666; font-size: 0.9em; } .verdict { font-size: 1.15em; }
"""


def _html(name: str, generated: str, config: dict[str, Any], verdict: list[str], sections: list,
          figures: list[_Figure], notes: list[str], derived: str = "") -> str:
    e = html.escape
    body = [f"<h1>Campaign {e(name)}</h1>", f"<p class='verdict'><b>{e(verdict[0])}.</b></p>",
            "<ul>" + "".join(f"<li>{e(v)}</li>" for v in verdict[1:]) + "</ul>",
            f"<p class='meta'>Generated {e(generated)}. {e(_config_line(config))}.</p>",
            *([f"<p class='meta'>{e(derived)}.</p>"] if derived else [])]
    if notes:
        body.append("<h2>Notes</h2>")
        body += [f"<div class='note'>{e(n)}</div>" for n in notes]
    for level, heading, table in sections:
        body.append(f"<h{level}>{e(heading)}</h{level}>")
        if table is not None:
            body.append(_html_table(table))
    body.append("<h2>Plots</h2>")
    for f in figures:
        body.append(f"<h3>{e(f.title)}</h3>")
        if f.png is None:
            body.append(f"<div class='note'>{e(f.note or 'nothing to plot')}</div>")
        else:
            data = base64.b64encode(f.png).decode("ascii")
            body.append(f"<figure><img alt='{e(f.title)}' src='data:image/png;base64,{data}'></figure>")
    config_json = e(json.dumps(config, indent=2, sort_keys=True))
    body.append(f"<details><summary>Campaign configuration</summary><pre>{config_json}</pre></details>")
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>edgemask campaign {e(name)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def fmt_s(x: Any) -> str:
    return "—" if _is_missing(x) else f"{float(x):.3f}"


def in_loop_sections(runs: list[RunRounds]) -> list[tuple[int, str, pd.DataFrame | None]]:
    """The runs trained with ``[system]`` (issue #46), each timed by its own rounds (``profiling.rounds``): per run,
    its rounds' in-loop seconds (the deadline and the drops included, as the training loop decided them), how
    many updates were dropped, and the time to the highest mean accuracy every such run reaches; per board, the
    updates its devices were selected for and how many were dropped. Empty without such a run."""
    from edgemask.profiling.replay import pct

    if not runs:
        return []
    best = [float(r.rounds["accuracy"].max()) for r in runs if r.rounds["accuracy"].notna().any()]
    target = min(best) if best else math.nan
    offline = any(r.availability for r in runs)
    rows = []
    for r in runs:
        t = r.to_target(target) if best else {"rounds": math.nan, "time_s": math.nan}
        rd, deadline = r.rounds, float(r.system.get("deadline_s", math.nan))
        selected, dropped = rd["selected"].sum(), rd["dropped"].sum()
        row = {"algorithm": r.algorithm, "run": r.run_id, "device mix": r.mix_text(),
               "deadline (s)": fmt_s(deadline), "over-commit": f"{float(r.system.get('over_commit', 0.0)):g}",
               "K": fmt_int(r.system.get("aggregated_per_round")), "rounds": fmt_int(len(rd)),
               "all rounds (s)": fmt_s(r.total_s), "mean round (s)": fmt_s(rd["round_time_s"].mean()),
               "rounds at the deadline": fmt_int((rd["round_time_s"] >= deadline).sum()),
               "updates": fmt_int(selected), "dropped": fmt_int(dropped),
               "dropped share": fmt_pct(dropped / selected if selected else math.nan)}
        if offline:
            row["offline"] = fmt_int(rd["offline"].sum()) if r.availability else "—"
        if best:
            row[f"rounds to {pct(target)} %"] = fmt_int(t["rounds"])
            row[f"time to {pct(target)} % (s)"] = fmt_s(t["time_s"])
        rows.append(row)
    boards = []
    for r in runs:
        for b in r.boards.itertuples():
            row = {"run": r.run_id, "board": b.board, "devices": fmt_int(b.devices), "updates": fmt_int(b.updates),
                   "dropped": fmt_int(b.dropped), "dropped share": fmt_pct(b.dropped / b.updates if b.updates
                                                                           else math.nan)}
            if offline:
                row["offline"] = fmt_int(b.offline)
            boards.append(row)
    target_text = (f"; time to {pct(target)} % mean accuracy, the highest every such run reaches, is the sum of the "
                   f"rounds' times through the first round reaching it" if best else "")
    return [(2, "Rounds with deadlines, as trained: each run's own in-loop times ([system]: history.parquet's "
                "round_time_s, the round's wall-clock as the training loop decided it, the deadline and the dropped "
                f"updates included; not derived again from a device trace{target_text})", pd.DataFrame(rows)),
            (3, "Updates dropped per board (in the loop: past the deadline, after the first K to finish"
                + (", or offline: the availability trace" if offline else "") + ")", pd.DataFrame(boards))]


def training_sections(summary: pd.DataFrame, train_format: str) -> list[tuple[int, str, pd.DataFrame | None]]:
    """The training table (issue #39): per client × board × training format × threads and per inference setting
    there, the measured step p50 and local round beside the 3× assumption's figure for the same round (3 × the
    round's samples × the dense model's batch-1 inference p50, what `edgemask replay` falls back to) and their
    ratio, with both verdicts. Empty without training rows."""
    from edgemask.profiling.training import training_table

    t = training_table(summary)
    if t.empty:
        return []
    table = pd.DataFrame({
        "artifact": t["artifact"], "device": t["device"], "threads": t["threads"].map(fmt_int),
        "training format": t["format"], "step p50 (ms)": t["step_p50_ms"].map(fmt_ms),
        "steps/round": t["steps_per_round"].map(fmt_int), "samples/round": t["round_samples"].map(fmt_int),
        "local round on board (ms)": t["local_round_ms"].map(fmt_ms),
        "step × steps (ms)": t["local_round_pred_ms"].map(fmt_ms),
        "3× assumption (ms)": t["assumed_round_ms"].map(fmt_ms), "3× from": t["assumed_from"].map(fmt_text),
        "measured ÷ 3×": t["measured_over_assumed"].map(fmt_ratio), "verdict": t["verdict"].map(fmt_text),
        "3× verdict": t["assumed_verdict"].map(fmt_text)})
    return [(2, "Local training on the boards (training formats: one local step per sample, whole local rounds "
                "timed back to back; the 3× assumption is FedScale's 3 × samples × the dense model's batch-1 "
                f"inference p50; clients.parquet and the traces take {train_format}'s round where both formats "
                "were measured)", table)]


def ledger_part(results_dir: Path, workspace: Path, summary: pd.DataFrame, train_format: str = "torch-train",
                runs: dict[str, Any] | None = None, inputs: dict[str, str] | None = None
                ) -> tuple[_Figure, list[tuple[int, str, pd.DataFrame | None]], list[str]]:
    """Write ``clients.parquet`` (``profiling.ledger``) and the device traces (``profiling.trace``, at the assumed
    default bandwidth) beside the store; return the Pareto figure, the section naming each setting's front, and
    the notes on what the ledger left out."""
    from edgemask.profiling.ledger import build_ledger, write_ledger
    from edgemask.profiling.tidy import results_frame
    from edgemask.profiling.trace import DEFAULT_BANDWIDTH_KBPS, write_traces

    results = results_frame(summary) if not summary.empty else summary
    ledger, notes = build_ledger(results, workspace, train_format)
    write_ledger(results_dir, ledger)
    _, trace_notes = write_traces(results_dir, ledger, results, train_format=train_format, runs=runs,
                                  inputs=inputs)
    fig = _Figure("accuracy_vs_latency", "Per client: personalized accuracy against measured latency (Pareto view; "
                  "hollow: INVALID setting; ringed and joined: on the front)",
                  _png(plots.accuracy_vs_latency(ledger)), "no client has both an accuracy and a measured latency")
    sections: list[tuple[int, str, pd.DataFrame | None]] = []
    if not ledger.empty:
        rows = []
        for keys, g in ledger.groupby(["device", "format", "variant", "threads"], sort=True):
            front = g[g["on_front"]].sort_values("p50_ms")
            rows.append({"setting": f"{keys[0]}, {keys[1]}/{keys[2]}, {keys[3]} thread(s)",
                         "on the front": f"{len(front)} of {len(g)}",
                         "clients on the front (accuracy, p50 ms)": "; ".join(
                             f"{r.run_id}/{r.client_id} ({fmt_pct(r.accuracy)}, {fmt_ms(r.p50_ms)})"
                             for r in front.itertuples()) or "none: no VALID setting"})
        heading = (f"Which clients are both accurate and fast: the accuracy–latency front among VALID settings "
                   f"(clients.parquet; device traces for FedScale and `edgemask replay` in traces/, at an assumed "
                   f"{DEFAULT_BANDWIDTH_KBPS / 1000:g} Mbit/s)")
        sections.append((2, heading, pd.DataFrame(rows)))
    return fig, sections, notes + trace_notes
