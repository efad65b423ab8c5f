"""Attribution on the host: each profiled operator to the layer it computes, each layer to its mask.

Inputs: the runner's profiled runs (``devices.remote.runner.profile_runs``: per run, ``[name, op type, us,
provider]`` per operator and the run's end-to-end ms) and the manifests' per-layer records (``export.layers``:
units kept/total, FLOPs dense and compacted, the names each ONNX file carries for the layer).

Per layer, with the dense artifact's time ``t_d`` and the compacted one's ``t_c`` (median over profiled runs of
the layer's summed operator time):

* FLOP bound ``B = F_dense / F_compacted`` — the speedup if time followed FLOPs;
* measured speedup ``S = t_d / t_c``;
* realized fraction ``S / B``; a layer realizing less than :data:`REALIZED_FLAG` of its bound is flagged.

Operators no layer claims (pooling, reductions, layout reorders) are summed under :data:`OTHER`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from edgemask.targets import artifact_format
from profiling.trt_profile import trt_layer_of

OTHER = "(other)"
REALIZED_FLAG = 0.5  # flag layers realizing less than half their FLOP bound
COARSE_MS = 0.01  # onnxruntime's trace has whole microseconds: below this a layer's time is coarse

# onnxruntime renames the kernels its graph transformers build from a node: "fused <name>" (Conv + activation
# fusion, 1.10), "<conv>_<activation>" (the same fusion later), "<name>_nchwc" (x86 NCHWc layout),
# "<name>_token_<n>" (a generated name that collided).
_FUSED_PREFIX = re.compile(r"^fused\s+")
_ORT_SUFFIX = re.compile(r"_(nchwc|token_\d+)")


def name_index(layers: Iterable[Mapping], file: str) -> dict[str, str]:
    """Graph name (node or tensor) -> layer, for the ONNX ``file`` (manifest ``layers[i].graph_names``)."""
    index: dict[str, str] = {}
    for layer in layers:
        for n in (layer.get("graph_names") or {}).get(file, []):
            index.setdefault(n, layer["name"])
    return index


def _renamed_rest(rest: str, index: Mapping[str, str]) -> bool:
    """Whether ``rest`` is made only of onnxruntime's rename suffixes and ``_<graph name>`` parts."""
    while rest:
        m = _ORT_SUFFIX.match(rest)
        if m:
            rest = rest[m.end():]
            continue
        part = max((n for n in index if rest.startswith("_" + n)), key=len, default=None)
        if part is None:
            return False
        rest = rest[len(part) + 1:]
    return True


def layer_of(op_name: str, index: Mapping[str, str]) -> str:
    """The layer an operator event belongs to: its name as the graph has it, else the longest graph name it
    starts with when the rest is one of onnxruntime's renamings (above); :data:`OTHER` when none."""
    key = _FUSED_PREFIX.sub("", op_name)
    if key in index:
        return index[key]
    hits = [n for n in index if key.startswith(n) and _renamed_rest(key[len(n):], index)]
    return index[max(hits, key=len)] if hits else OTHER


def run_layer_us(ops: Sequence[Sequence], index: Mapping[str, str]) -> dict[str, float]:
    """One profiled run's operators ``[name, op type, us, ...]`` -> layer -> summed microseconds."""
    out: dict[str, float] = {}
    for op in ops:  # TensorRT's layers fuse ONNX nodes: split their names (profiling.trt_profile)
        layer = trt_layer_of(op[0], index, layer_of, OTHER) if op[1] == "TensorRT" else layer_of(op[0], index)
        out[layer] = out.get(layer, 0.0) + float(op[2])
    return out


def layer_ms(runs: Sequence[Mapping], index: Mapping[str, str]) -> dict[str, float]:
    """Layer -> median over the profiled runs of its summed operator time, in ms (a layer absent from a run
    counts 0 there)."""
    per_run = [run_layer_us(r["ops"], index) for r in runs]
    layers = sorted({k for r in per_run for k in r})
    return {k: statistics.median(r.get(k, 0.0) for r in per_run) / 1000.0 for k in layers}


def coverage(run: Mapping) -> float:
    """Share of a profiled run's end-to-end latency its operator events account for (sum of ops ÷ end to end)."""
    e2e = float(run.get("end_to_end_ms") or math.nan)
    return sum(float(op[2]) for op in run["ops"]) / 1000.0 / e2e if e2e > 0 else math.nan


@dataclass(frozen=True)
class LayerRow:
    """One layer of one compacted artifact against the dense one, on one device/runtime/thread count."""

    layer: str
    kept: int
    total: int
    flops_dense: int
    flops_compacted: int
    dense_ms: float
    compacted_ms: float

    @property
    def flop_bound(self) -> float:
        return self.flops_dense / self.flops_compacted if self.flops_compacted else math.nan

    @property
    def speedup(self) -> float:
        return self.dense_ms / self.compacted_ms if self.compacted_ms > 0 else math.nan

    @property
    def realized(self) -> float:
        """Measured speedup ÷ FLOP bound (1: the FLOPs removed became time saved in proportion)."""
        return self.speedup / self.flop_bound

    @property
    def flagged(self) -> bool:
        return self.realized < REALIZED_FLAG  # NaN compares False: an unmeasured layer is not flagged


def layer_table(layers: Sequence[Mapping], dense_ms: Mapping[str, float],
                compacted_ms: Mapping[str, float]) -> list[LayerRow]:
    """Rows for the compacted artifact's manifest ``layers`` (with FLOPs), in its order; times looked up by the
    same module path in the dense and the compacted profile (NaN where a profile has no such layer)."""
    return [LayerRow(lay["name"], lay["kept"], lay["total"], int(lay.get("flops_dense", 0)),
                     int(lay.get("flops_compacted", 0)), dense_ms.get(lay["name"], math.nan),
                     compacted_ms.get(lay["name"], math.nan)) for lay in layers]


# -- from the campaign's store to per-layer tables ------------------------------------------------------------
@dataclass(frozen=True)
class LayerBreakdown:
    """Where one compacted artifact's time goes against its dense baseline, on one setting (device, format,
    variant, threads): per-layer rows, what no layer claims, and what the breakdown covers (median over the
    profiled runs of the summed operator times, beside the runs' end-to-end latency)."""

    artifact: str
    device: str
    format: str
    variant: str
    threads: int
    rows: tuple[LayerRow, ...]
    other_dense_ms: float
    other_compacted_ms: float
    ops_dense_ms: float
    e2e_dense_ms: float
    ops_compacted_ms: float
    e2e_compacted_ms: float


_SETTING = ["format", "variant", "device", "threads"]


def _runs(ops: pd.DataFrame, runs: pd.DataFrame) -> list[dict]:
    """The store's rows of one setting back into the runner's shape: [{"end_to_end_ms", "ops": [...]}, ...]."""
    by_run = {k: g[["name", "op_type", "us"]].values.tolist() for k, g in ops.groupby(["job_id", "run"])}
    return [{"end_to_end_ms": r.end_to_end_ms, "ops": by_run.get((r.job_id, r.run), [])}
            for r in runs.itertuples()]


def _median(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else math.nan


def breakdowns(artifacts: pd.DataFrame, profiles: pd.DataFrame, runs: pd.DataFrame,
               ops: pd.DataFrame) -> tuple[list[LayerBreakdown], list[str]]:
    """Per compacted artifact and setting with profiled runs of it and of its run's dense baseline: a
    :class:`LayerBreakdown`; and one line per reason a setting has none (runtime without per-operator events,
    no dense profile, a manifest without per-layer FLOPs or graph names). Inputs: the store's ``artifacts()``,
    ``profiles()``, ``profiled_runs()`` and ``operator_samples()``."""
    manifests = {a: json.loads(m) for a, m in zip(artifacts["artifact"], artifacts["manifest"])}
    out: list[LayerBreakdown] = []
    notes: dict[str, None] = {}  # ordered set
    if profiles.empty:
        return out, []
    for (art, *setting), prof in profiles.groupby(["artifact", *_SETTING], sort=True):
        man = manifests.get(art)
        if man is None or man.get("kind") != "compacted":
            continue
        fmt, variant, device, threads = setting
        where = f"{device}, {fmt}/{variant}, {threads} thread(s)"
        dense_art = f"{man['run_id']}/dense"
        dense_prof = profiles[(profiles["artifact"] == dense_art)
                              & (profiles[_SETTING] == setting).all(axis=1)]
        for blocks in (*prof["blocks"], *dense_prof["blocks"]):
            for block in json.loads(blocks or "[]"):  # a delegate the runtime reports as one block
                notes[f"{device}, {fmt}: {block}"] = None
        unavailable = [r for r in (*prof["reason"], *dense_prof["reason"]) if r]
        if not prof["available"].all() or (len(dense_prof) and not dense_prof["available"].all()):
            notes[f"per-layer times not available on {device} for {fmt}: {unavailable[0]}"] = None
            continue
        if dense_prof.empty:
            notes[f"{art} on {where}: no profiled runs of its dense baseline {dense_art}"] = None
            continue
        dense_man = manifests[dense_art]
        files = {tag: next((f["file"] for f in m["files"] if f["format"] == artifact_format(fmt)
                            and f["variant"] == variant), "")
                 for tag, m in (("dense", dense_man), ("compacted", man))}
        index = {"dense": name_index(dense_man["layers"], files["dense"]),
                 "compacted": name_index(man["layers"], files["compacted"])}
        if not all(index.values()) or any("flops_dense" not in lay for lay in man["layers"]):
            notes[f"{art} ({fmt}/{variant}): its manifest has no per-layer graph names or FLOPs for this file; "
                  f"re-export it with this edgemask"] = None
            continue
        per: dict[str, Any] = {}
        for tag, a in (("dense", dense_art), ("compacted", art)):
            sel = lambda df: df[(df["artifact"] == a) & (df[_SETTING] == setting).all(axis=1)]  # noqa: E731
            rs = _runs(sel(ops), sel(runs))
            per[tag] = (layer_ms(rs, index[tag]), _median(sum(op[2] for op in r["ops"]) / 1e3 for r in rs),
                        _median(r["end_to_end_ms"] for r in rs))
        rows = tuple(layer_table(man["layers"], per["dense"][0], per["compacted"][0]))
        if fmt == "onnx" and any(r.compacted_ms < COARSE_MS for r in rows):
            notes["onnxruntime's trace counts whole microseconds: per-layer times under "
                  f"{COARSE_MS * 1e3:.0f} µs (and their speedups) are coarse"] = None
        out.append(LayerBreakdown(art, device, fmt, variant, int(threads), rows,
                                  per["dense"][0].get(OTHER, 0.0), per["compacted"][0].get(OTHER, 0.0),
                                  per["dense"][1], per["dense"][2], per["compacted"][1], per["compacted"][2]))
    return out, list(notes)
