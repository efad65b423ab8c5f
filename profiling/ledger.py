"""The per-client ledger ``clients.parquet``: one row per run × client × device × format × variant × threads,
joining what training recorded for the client (``runs/<run>/summary.json``, ``history.parquet``) with what the
campaign measured for the model the client runs (``results.parquet``'s setting row).

Which measured artifact is a client's model: its own compacted artifact (``<run>/<client>``) where the campaign
measured one; in a run where no client artifact was measured at all (FedAvg: every client runs the global model),
the run's dense artifact (``<run>/dense``), said in ``measured_model``. A run with some client artifacts leaves its
unmeasured clients out (a note says which), and its dense baseline is no client's model (FedMask's dense artifact is
the frozen random weights without a mask): it appears in the device trace as the training cost instead
(``profiling.trace``).

The Pareto view (``pareto_front``): per device × format × variant × threads, the clients whose model no other
client's beats on both accuracy and measured p50 latency, among VALID settings only (an INVALID latency is not a
number to compare).

Per client, its local round on the row's board (issue #39): ``local_round_ms``, the measured whole local round of the
training row of the client's model artifact on the same device and threads (``profiling.training.local_rounds``:
``torch-train``'s where both training formats were measured, unless ``train_format`` names the other), with the
format, verdict and training file it came from; NaN where no training format was measured.

Columns in ``docs/contracts.md`` ("clients.parquet").
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from edgemask.fileio import atomic_path
from edgemask.profiling.training import DEFAULT_TRAIN_FORMAT, local_rounds
from edgemask.workspace import check_name

CLIENTS_PARQUET = "clients.parquet"
SETTING = ["device", "format", "variant", "threads"]
# results.parquet's columns the ledger carries for the client's measured model (renamed where the name would
# mislead: ``accuracy`` there is the device's on the artifact's sample_io, not the client's personalized accuracy)
MEASURED = {"artifact": "artifact", "kind": "measured_model", "accuracy": "device_accuracy",
            "params_compacted": "params_compacted", "model_bytes": "model_bytes", "p50_ms": "p50_ms",
            "p90_ms": "p90_ms", "energy_mj": "energy_mj", "peak_rss_kb": "peak_rss_kb", "verdict": "verdict",
            "valid": "valid", "artifact_sha256": "artifact_sha256"}
# history.parquet metrics summed over the rounds a client trained -> ledger column
HISTORY_SUMS = {"bytes_up": ("bytes_up",), "bytes_down": ("bytes_down",), "samples_seen": ("samples_seen",),
                "flops_train": ("flops_fwd", "flops_bwd"),
                "flops_train_structured": ("flops_fwd_structured", "flops_bwd_structured")}


@dataclass
class RunRecord:
    """What the ledger reads of one run directory: ``summary.json`` (or None) and ``history.parquet`` (or None)."""

    run_id: str
    summary: dict[str, Any] | None = None
    history: pd.DataFrame | None = None
    notes: list[str] = field(default_factory=list)

    def accuracies(self, client: str) -> dict[str, float]:
        """The client's personalized accuracy per mask the algorithm reports: ``summary.json``'s per-client
        ``accuracies`` (e.g. FedMask's ``local_mask`` and ``returned_mask``) when present, always with ``accuracy``
        (the figure the run's ``mean_accuracy`` averages)."""
        entry = (self.summary or {}).get("clients", {}).get(client, {})
        out = {"accuracy": _num(entry.get("accuracy"))}
        for name, value in (entry.get("accuracies") or {}).items():
            out[f"accuracy_{name}"] = _num(value)
        return out

    def clients(self) -> list[str]:
        """The run's clients: summary.json's, else the history's."""
        if self.summary and self.summary.get("clients"):
            return sorted(self.summary["clients"])
        if self.history is not None:
            return sorted(c for c in self.history["client"].unique() if c != "server")
        return []


def _num(x: Any) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def read_run(workspace: str | Path, run_id: str) -> RunRecord:
    """Read ``runs/<run_id>/summary.json`` and ``history.parquet``; a missing or unreadable file leaves its part
    None with a note saying which (the ledger then has NaN there, never a guess)."""
    run_dir = Path(workspace) / "runs" / check_name(run_id, "run id in the results")
    rec = RunRecord(run_id)
    path = run_dir / "summary.json"
    try:
        rec.summary = json.loads(path.read_text())
    except FileNotFoundError:
        rec.notes.append(f"no {path}: the ledger has no personalized accuracy for run {run_id}")
    except (OSError, ValueError) as exc:
        rec.notes.append(f"{path} is unreadable ({exc}): the ledger has no personalized accuracy for run {run_id}")
    else:
        rec.notes += collapse_notes(run_id, rec.summary)
    path = run_dir / "history.parquet"
    try:
        history = pd.read_parquet(path)
    except FileNotFoundError:
        rec.notes.append(f"no {path}: the ledger has no bytes or training FLOPs for run {run_id}")
    except (OSError, ValueError) as exc:
        rec.notes.append(f"{path} is unreadable ({exc}): the ledger has no bytes or FLOPs for run {run_id}")
    else:
        if {"round", "client", "metric", "value"} <= set(history.columns):
            rec.history = history
        else:
            rec.notes.append(f"{path} lacks the round/client/metric/value columns: left out")
    return rec


def collapse_notes(run_id: str, summary: Any) -> list[str]:
    """One line when summary.json's ``collapse`` names clients whose model had collapsed at training's last
    evaluation (docs/contracts.md, "summary.json"): their accuracy is that of a constant output."""
    collapse = summary.get("collapse") if isinstance(summary, dict) else None
    clients = collapse.get("clients") if isinstance(collapse, dict) else None
    if not clients or not isinstance(clients, dict):
        return []
    cid, entry = next(iter(clients.items()))
    layers = entry.get("layers") if isinstance(entry, dict) else None
    where = f": no live unit in {layers[0]!r} since round {entry.get('round')}" if layers else ""
    total = summary.get("num_clients", len(summary.get("clients") or {}))
    return [f"run {run_id}: {len(clients)} of {total} client(s) had collapsed when training ended (e.g. {cid}{where}); "
            f"their model gives every input the same output, so their accuracy is a constant's"]


def client_training(history: pd.DataFrame | None, client: str) -> dict[str, float]:
    """What one client's training cost, from the run's long history: the sums over the rounds it trained of
    ``HISTORY_SUMS`` (bytes up and down, samples processed, training FLOPs forward + backward in both labelled
    counts: element sparsity and structured removal), ``rounds_trained``, and ``params_kept`` of its last
    trained round (its final mask). NaN for what the history does not record."""
    out = {col: math.nan for col in [*HISTORY_SUMS, "rounds_trained", "params_kept"]}
    if history is None:
        return out
    h = history[history["client"] == client]
    by_metric = {m: g for m, g in h.groupby("metric")}
    for col, metrics in HISTORY_SUMS.items():
        if all(m in by_metric for m in metrics):
            out[col] = float(sum(by_metric[m]["value"].sum() for m in metrics))
    if "bytes_up" in by_metric:
        out["rounds_trained"] = float(by_metric["bytes_up"]["round"].nunique())
    if "params_kept" in by_metric:
        kept = by_metric["params_kept"].sort_values("round")
        out["params_kept"] = float(kept["value"].iloc[-1])
    return out


# local_rounds' columns the ledger carries (the measured local round of the client's model on the row's board)
LOCAL_ROUND = ["local_round_ms", "local_round_format", "local_round_verdict", "local_round_sha256"]


def ledger_frame(results: pd.DataFrame, runs: dict[str, RunRecord],
                 train_format: str = DEFAULT_TRAIN_FORMAT) -> tuple[pd.DataFrame, list[str]]:
    """Join ``results`` (``results.parquet``'s frame: one row per setting) with each run's training record into
    the ledger (one row per run × client × inference setting), with ``on_front`` from :func:`pareto_front` and the
    measured local round of the client's model on that device and threads (:data:`LOCAL_ROUND`; which training
    format where both were measured: ``train_format``); and the notes on what was left out."""
    notes: list[str] = []
    rows: list[dict[str, Any]] = []
    if results.empty:
        return pd.DataFrame(), notes
    rounds = local_rounds(results, train_format)
    if "workload" in results.columns:  # a training row is no model a client runs: its round is a column
        results = results[results["workload"] != "train"]
        if results.empty:
            return pd.DataFrame(), notes
    for run_id, g in results.groupby("run_id", sort=True):
        rec = runs.get(str(run_id)) or RunRecord(str(run_id))
        notes += rec.notes
        own = g[g["kind"] != "dense"]
        if own.empty:  # every client runs the run's one model (FedAvg): its dense artifact
            pairs = [(c, r) for _, r in g.iterrows() for c in rec.clients()]
            if not pairs and len(g):
                notes.append(f"run {run_id}: no client list (summary.json, history.parquet) to map its dense model to")
        else:
            pairs = [(str(r["client_id"]), r) for _, r in own.iterrows()]
            missing = sorted(set(rec.clients()) - set(own["client_id"].astype(str)))
            if missing:
                notes.append(f"run {run_id}: no measured artifact for client(s) {', '.join(missing)}: "
                             f"not in clients.parquet")
        training = {c: client_training(rec.history, c) for c in {c for c, _ in pairs}}
        for client, r in pairs:
            row = {"run_id": str(run_id), "client_id": client, "algorithm": r.get("algorithm"),
                   "model": r.get("model"), "dataset": r.get("dataset"),
                   **{k: r[k] for k in SETTING}}
            row.update(rec.accuracies(client))
            row.update(training[client])
            row.update({new: r[old] for old, new in MEASURED.items() if old in r.index})
            rows.append(row)
    df = pd.DataFrame(rows)
    if df.empty:
        return df, notes
    acc = [c for c in df.columns if c.startswith("accuracy")]
    first = ["run_id", "client_id", "algorithm", "model", "dataset", *SETTING, "artifact", "measured_model", *acc]
    df = df[first + [c for c in df.columns if c not in first]]
    df["on_front"] = pareto_front(df)
    df = df.merge(rounds[["artifact", "device", "threads", *LOCAL_ROUND]], how="left",
                  on=["artifact", "device", "threads"])
    for col in LOCAL_ROUND[1:]:  # text: None where no round was measured (as parquet reads it back)
        df[col] = df[col].astype(object).where(df[col].notna(), None)
    return df.sort_values(["run_id", "client_id", *SETTING]).reset_index(drop=True), notes


def pareto_front(df: pd.DataFrame, accuracy: str = "accuracy", latency: str = "p50_ms") -> pd.Series:
    """True for each row on its setting's accuracy–latency Pareto front: VALID, with accuracy and latency known,
    and no other VALID row of the same device × format × variant × threads at least as accurate and at least as
    fast while strictly better in one of the two."""
    on = pd.Series(False, index=df.index)
    ok = df[df["valid"].fillna(False).astype(bool) & df[accuracy].notna() & df[latency].notna()]
    for _, g in ok.groupby(SETTING, sort=False):
        a, t = g[accuracy].to_numpy(float), g[latency].to_numpy(float)
        for i, idx in enumerate(g.index):
            dominated = ((a >= a[i]) & (t <= t[i]) & ((a > a[i]) | (t < t[i]))).any()
            on[idx] = not dominated
    return on


def front_lines(ledger: pd.DataFrame) -> list[str]:
    """Per setting, which clients are on the front (``run/client`` with accuracy and p50), in latency order."""
    if ledger.empty:
        return []
    lines = []
    for keys, g in ledger.groupby(SETTING, sort=True):
        name = f"{keys[0]}, {keys[1]}/{keys[2]}, {keys[3]} thread(s)"
        front = g[g["on_front"]].sort_values("p50_ms")
        if front.empty:
            lines.append(f"{name}: no client's setting is VALID, so none is on the front")
            continue
        who = "; ".join(f"{r.run_id}/{r.client_id} ({100 * r.accuracy:.1f} %, {r.p50_ms:.3f} ms)"
                        for r in front.itertuples())
        lines.append(f"{name}: {len(front)} of {len(g)} on the front: {who}")
    return lines


def write_ledger(results_dir: str | Path, ledger: pd.DataFrame) -> Path:
    """Write ``clients.parquet`` into ``results_dir`` atomically (temporary name, then rename)."""
    path = Path(results_dir) / CLIENTS_PARQUET
    with atomic_path(path) as tmp:
        ledger.to_parquet(tmp, index=False)
    return path


def build_ledger(results: pd.DataFrame, workspace: str | Path,
                 train_format: str = DEFAULT_TRAIN_FORMAT) -> tuple[pd.DataFrame, list[str]]:
    """:func:`ledger_frame` with the runs ``results`` names read from ``workspace``."""
    runs = {str(r): read_run(workspace, str(r)) for r in (results["run_id"].unique() if len(results) else [])}
    return ledger_frame(results, runs, train_format)
