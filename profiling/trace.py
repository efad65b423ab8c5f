"""Device traces: the campaign's measured per-client costs written as files other simulators read.

Per measured device × format × variant × threads, ``results/<campaign>/traces/<device>-<format>-<variant>-t<threads>/``:

- ``fedscale/<run-id>/client_device_capacity``: FedScale's device trace (Lai et al., "FedScale: Benchmarking Model
  and System Performance of Federated Learning at Scale", ICML 2022; ``benchmark/dataset/data/device_info``), a
  pickle of ``{client id (int): {"computation": ms per sample, "communication": kbit/s}}``, read by FedScale's
  ``Aggregator.load_client_profile`` (``pickle.load``) and by FederatedScope's ``get_resource_info``. FedScale's
  meaning of ``computation``: "compute_speed is the inference latency of models (ms/sample)", which its
  ``get_completion_time`` multiplies by 3 × batch × local steps ("backward-pass takes around 2x the latency").
  Here it is the measured p50 of one batch-1 inference of the model the client *trains* (``train_model``), and
  ``communication`` the bandwidth the trace was written for (assumed, never measured: ``bandwidth_kbps``).
  FedScale ids are integers from 1: a run's clients in name order get 1, 2, ... (``fedscale_id`` in the trace).
- ``trace.parquet``: edgemask's own trace, one row per run × client: both costs (the model trained:
  ``computation_ms``; the client's own inference model: ``inference_ms``), energy per sample of each, the
  artifacts and verdicts they came from, the device and format. Columns in ``docs/contracts.md``.
- ``trace.json``: the setting, units, the assumed bandwidth, and the sha256 of each file above (checked by
  :func:`read_trace`).

Where the campaign measured a training format on the same device and threads (issue #39), ``trace.parquet`` also
holds each client's measured local round (``local_round_ms``: the median whole round of the training row of the
client's model artifact, ``profiling.training.local_rounds``; ``local_round_source`` says which format, e.g.
``"torch-train measured"``, and is null where the client has none), the samples that round stands for, its steps,
energy per step, training file and verdict: ``edgemask replay`` takes it in place of FedScale's 3× assumption.
FedScale's pickle stays as FedScale defines it (ms per sample).

What a client trains (``train_model``, a named setting): ``"dense"`` (default): the run's dense artifact, because
every algorithm here trains the full network with its mask multiplied in (FedMask learns masks over the whole
frozen network: dense kernels do not skip its zeros, docs/contracts.md), so the compacted model's latency is
not its training's; ``"compacted"``: the client's own compacted model, the cost a trainer that removed dead units
would pay (structured removal's promise, an optimistic bound).
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from edgemask.errors import ConfigError, CorruptFileError
from edgemask.fileio import (
    atomic_path,
    sha256_file,
    write_bytes_atomic,
    write_json_atomic,
)
from edgemask.workspace import check_name
from edgemask.profiling.provenance import RunIdentity, finite_column
from edgemask.profiling.training import DEFAULT_TRAIN_FORMAT, local_rounds

FEDSCALE_FILE = "client_device_capacity"
TRACE_PARQUET = "trace.parquet"
TRACE_JSON = "trace.json"
# Assumed client bandwidth when a trace is written without one: 10 Mbit/s each way. Not measured; FedScale's own
# trace draws communication from MobiPerf measurements. `edgemask replay --bandwidth` replaces it.
DEFAULT_BANDWIDTH_KBPS = 10_000.0
TRAIN_MODELS = ("dense", "compacted")
DEFAULT_TRAIN_MODEL = "dense"
UNITS = {"computation_ms": "ms per sample (p50 of batch-1 inference of the model trained)",
         "inference_ms": "ms per sample (p50 of batch-1 inference of the client's model)",
         "train_energy_mj": "mJ per sample (one inference of the model trained, whole device)",
         "inference_energy_mj": "mJ per sample (one inference of the client's model, whole device)",
         "communication_kbps": "kbit/s (1 kbit = 1000 bit), assumed",
         "local_round_ms": "ms per local round of round_samples training samples (measured, median)",
         "round_samples": "training samples the measured local round processed (num_train × epochs)",
         "step_energy_mj": "mJ per local step (whole device)"}


def setting_dir_name(device: str, fmt: str, variant: str, threads: int) -> str:
    return check_name(f"{device}-{fmt}-{variant}-t{int(threads)}", "trace directory name")


def trace_frame(ledger: pd.DataFrame, results: pd.DataFrame, setting: tuple[str, str, str, int], *,
                bandwidth_kbps: float = DEFAULT_BANDWIDTH_KBPS, train_model: str = DEFAULT_TRAIN_MODEL,
                train_format: str = DEFAULT_TRAIN_FORMAT) -> tuple[pd.DataFrame, list[str]]:
    """One setting's trace rows (one per run × client of the ledger measured there) and notes on gaps. A client's
    measured local round is its model artifact's training row on the same device and threads (``train_format``'s
    where both training formats were measured)."""
    if train_model not in TRAIN_MODELS:
        raise ConfigError(f"train model {train_model!r}: expected one of {', '.join(TRAIN_MODELS)}")
    if not (bandwidth_kbps > 0 and math.isfinite(bandwidth_kbps)):
        raise ConfigError(f"bandwidth {bandwidth_kbps!r} kbit/s: expected a positive number")
    device, fmt, variant, threads = setting
    sel = lambda df: df[(df["device"] == device) & (df["format"] == fmt) & (df["variant"] == variant)
                        & (df["threads"] == threads)]
    led, res = sel(ledger), sel(results)
    dense = {str(r.run_id): r for r in res[res["kind"] == "dense"].itertuples()}
    rounds = local_rounds(results, train_format)
    rounds = {r.artifact: r for r in rounds[(rounds["device"] == device) & (rounds["threads"] == threads)].itertuples()}
    notes, rows = [], []
    for run_id, g in led.groupby("run_id", sort=True):
        for i, r in enumerate(g.sort_values("client_id").itertuples(), start=1):
            t = dense.get(str(run_id)) if train_model == "dense" else None
            if train_model == "dense" and t is None:
                notes.append(f"run {run_id} has no measured dense artifact on {device} {fmt}/{variant}: its "
                             f"training cost is missing from this trace")
            train = {"artifact": t.artifact, "p50_ms": t.p50_ms, "energy_mj": t.energy_mj, "verdict": t.verdict,
                     "sha": getattr(t, "artifact_sha256", None)} if t is not None else (
                {"artifact": r.artifact, "p50_ms": r.p50_ms, "energy_mj": r.energy_mj, "verdict": r.verdict,
                 "sha": getattr(r, "artifact_sha256", None)} if train_model == "compacted" else
                {"artifact": None, "p50_ms": math.nan, "energy_mj": math.nan, "verdict": None, "sha": None})
            rows.append({"run_id": str(run_id), "client_id": r.client_id, "fedscale_id": i,
                         "algorithm": r.algorithm, "device": device, "format": fmt, "variant": variant,
                         "threads": int(threads), "train_model": train_model,
                         "computation_ms": float(train["p50_ms"]), "train_energy_mj": float(train["energy_mj"]),
                         "train_artifact": train["artifact"], "train_verdict": train["verdict"],
                         "train_artifact_sha256": train["sha"],
                         "inference_ms": float(r.p50_ms), "inference_energy_mj": float(r.energy_mj),
                         "inference_artifact": r.artifact, "inference_verdict": r.verdict,
                         "inference_artifact_sha256": getattr(r, "artifact_sha256", None),
                         "communication_kbps": float(bandwidth_kbps), **_local_round(rounds.get(r.artifact))})
    return pd.DataFrame(rows), sorted(set(notes))


def _local_round(t: Any) -> dict[str, Any]:
    """A trace row's measured local round (None: the client has no measured training row here)."""
    if t is None:
        return {"local_round_ms": math.nan, "local_round_source": None, "round_samples": math.nan,
                "steps_per_round": math.nan, "step_energy_mj": math.nan, "train_round_artifact": None,
                "train_round_verdict": None, "train_round_sha256": None}
    return {"local_round_ms": float(t.local_round_ms), "local_round_source": f"{t.local_round_format} measured",
            "round_samples": float(t.round_samples), "steps_per_round": float(t.steps_per_round),
            "step_energy_mj": float(t.step_energy_mj), "train_round_artifact": t.artifact,
            "train_round_verdict": t.local_round_verdict, "train_round_sha256": t.local_round_sha256}


def fedscale_capacity(trace: pd.DataFrame, run_id: str) -> dict[int, dict[str, float]]:
    """FedScale's ``client_device_capacity`` mapping for one run's clients: ``{fedscale_id: {"computation": ms
    per sample, "communication": kbit/s}}``; a client without a measured training cost is left out (FedScale
    gives an absent id its default, 1 ms and 1 kbit/s)."""
    g = trace[(trace["run_id"] == run_id) & trace["computation_ms"].notna()]
    return {int(r.fedscale_id): {"computation": float(r.computation_ms), "communication": float(r.communication_kbps)}
            for r in g.itertuples()}


def run_identities(results: pd.DataFrame) -> dict[str, RunIdentity]:
    """Each run of ``results`` (``results.parquet``'s frame) as its manifests state it: model, data set and dense
    parameter count (absent columns: not stated). What a trace records when the report gives it nothing more."""
    out = {}
    if results.empty or "run_id" not in results.columns:
        return out
    for run_id, g in results.groupby("run_id", sort=True):
        first = lambda col: next((v for v in g[col] if not pd.isna(v)), None) if col in g.columns else None  # noqa: E731
        params = first("params_dense")
        out[str(run_id)] = RunIdentity(str(run_id), "results", first("model"), first("dataset"),
                                       None if params is None else int(params))
    return out


def write_traces(results_dir: str | Path, ledger: pd.DataFrame, results: pd.DataFrame, *,
                 bandwidth_kbps: float = DEFAULT_BANDWIDTH_KBPS, train_model: str = DEFAULT_TRAIN_MODEL,
                 train_format: str = DEFAULT_TRAIN_FORMAT, runs: Mapping[str, RunIdentity] | None = None,
                 inputs: Mapping[str, str] | None = None) -> tuple[list[Path], list[str]]:
    """Write every setting's trace directory under ``results_dir/traces/`` (each file atomically; ``trace.json``
    last, with the others' digests); return the directories and the notes. ``trace.json`` records, per run, what
    its costs are of (``runs``: the report's identities, checked against the run directories; default: the
    manifests' model, data set and parameters in ``results``) and the digests of ``inputs`` (file -> sha256, e.g.
    the store), so ``edgemask replay`` can check a run against it (issue #44)."""
    out, notes = [], []
    if ledger.empty:
        return out, notes
    runs = {**run_identities(results), **(runs or {})}
    for setting, _ in ledger.groupby(["device", "format", "variant", "threads"], sort=True):
        frame, n = trace_frame(ledger, results, setting, bandwidth_kbps=bandwidth_kbps, train_model=train_model,
                               train_format=train_format)
        notes += n
        d = Path(results_dir) / "traces" / setting_dir_name(*setting)
        d.mkdir(parents=True, exist_ok=True)
        with atomic_path(d / TRACE_PARQUET) as tmp:
            frame.to_parquet(tmp, index=False)
        files = {TRACE_PARQUET: sha256_file(d / TRACE_PARQUET)}
        for run_id in sorted(frame["run_id"].unique()):
            rel = f"fedscale/{check_name(run_id, 'run id in the ledger')}/{FEDSCALE_FILE}"
            (d / rel).parent.mkdir(parents=True, exist_ok=True)
            write_bytes_atomic(d / rel, pickle.dumps(fedscale_capacity(frame, run_id), protocol=4))
            files[rel] = sha256_file(d / rel)
        device, fmt, variant, threads = setting
        write_json_atomic(d / TRACE_JSON, {
            "schema": 1, "device": device, "format": fmt, "variant": variant, "threads": int(threads),
            "train_model": train_model, "train_format": train_format, "bandwidth_kbps": float(bandwidth_kbps),
            "bandwidth_source": "assumed",
            "units": UNITS, "fedscale": {"computation": UNITS["computation_ms"],
                                         "communication": UNITS["communication_kbps"], "ids": "fedscale_id"},
            "runs": {r: (runs[r] if r in runs else RunIdentity(r, "results")).to_dict()
                     for r in sorted(frame["run_id"].unique())},
            "inputs": dict(inputs or {}), "files": files})
        out.append(d)
    return out, notes


def read_trace(trace_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Read a trace directory's ``trace.parquet`` after checking its sha256 against ``trace.json``; a missing
    file, unreadable JSON or a digest mismatch is refused in one line naming the file."""
    d = Path(trace_dir)
    meta_path = d / TRACE_JSON
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise CorruptFileError(f"{meta_path}: no trace here; `edgemask report` writes traces under "
                               f"results/<campaign>/traces/") from None
    except (OSError, ValueError) as exc:
        raise CorruptFileError(f"{meta_path}: unreadable ({exc}); rerun `edgemask report`") from None
    want = (meta.get("files") or {}).get(TRACE_PARQUET) if isinstance(meta, dict) else None
    path = d / TRACE_PARQUET
    if not want:
        raise CorruptFileError(f"{meta_path}: names no digest for {TRACE_PARQUET}; rerun `edgemask report`")
    if not path.is_file():
        raise CorruptFileError(f"{path}: missing; rerun `edgemask report`")
    got = sha256_file(path)
    if got != want:
        raise CorruptFileError(f"{path}: sha256 {got[:12]}… is not the {want[:12]}… {TRACE_JSON} records; the "
                               f"trace was changed after it was written: rerun `edgemask report`")
    trace = pd.read_parquet(path)
    check_numbers(trace, meta, path)
    return trace, meta


# trace.parquet's numbers: a latency or a count must be above 0, an energy at least 0; NaN is "not measured"
_POSITIVE = ("computation_ms", "inference_ms", "communication_kbps", "local_round_ms", "round_samples",
             "steps_per_round")
_NONNEGATIVE = ("train_energy_mj", "inference_energy_mj", "step_energy_mj")


def check_numbers(trace: pd.DataFrame, meta: Mapping[str, Any], path: Path) -> None:
    """Refuse a trace whose numbers are no finite numbers (NaN/±inf latency, negative energy), naming the file,
    the field and the client; NaN stays "not measured" except a local round whose source says it was."""
    fix = "rerun `edgemask report` on the campaign"
    label = lambda r: f"{r.get('run_id')}/{r.get('client_id')}"  # noqa: E731
    for col in _POSITIVE:
        finite_column(trace, col, str(path), label, positive=True, fix=fix)
    for col in _NONNEGATIVE:
        finite_column(trace, col, str(path), label, nonnegative=True, fix=fix)
    if "local_round_source" in trace.columns:
        said = trace[trace["local_round_source"].notna()]
        for col in ("local_round_ms", "round_samples"):
            finite_column(said, col, str(path), label, positive=True, missing_ok=False, fix=fix)
    bw = meta.get("bandwidth_kbps")
    if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not (math.isfinite(bw) and bw > 0):
        raise CorruptFileError(f"{path.with_name(TRACE_JSON)}: field bandwidth_kbps is {bw!r}; expected a finite "
                               f"positive number: {fix}")
