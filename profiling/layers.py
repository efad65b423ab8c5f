"""Attribution on the host: each profiled operator to the layer it computes, each layer to its mask.

Inputs: the runner's profiled runs (``devices.remote.runner.benchmark.profile_runs``: per run, ``[name, op type, us,
provider]`` per operator and the run's end-to-end ms) and the manifests' per-layer records (``export.layers``:
units kept/total, FLOPs dense and compacted, the names each ONNX file carries for the layer).

Per layer, with the dense artifact's time ``t_d`` and the compacted one's ``t_c`` (median over profiled runs of
the layer's summed operator time):

* FLOP bound ``B = F_dense / F_compacted`` — the speedup if time followed FLOPs;
* measured speedup ``S = t_d / t_c``;
* realized fraction ``S / B``; a layer realizing less than :data:`REALIZED_FLAG` of its bound is flagged.

Operators no layer claims (pooling, reductions, layout reorders) are summed under :data:`OTHER`.

ExecuTorch (:func:`etdump_runs`): the board's ETDump is read here with ExecuTorch's Inspector and the artifact's
ETRecord. XNNPACK names its own events by operator and ordinal ("Convolution (NHWC, F32) IGEMM #2", "Fully
Connected (NC, F32) GEMM #1") with **no link to a source op** (the ETRecord's delegate map for XNNPACK is empty);
the DELEGATE_CALL event carries, from the ETRecord, the delegate's aten ops in graph order with their module paths.
So delegated operators are mapped **by order, per kind**: the k-th Convolution event of a delegate call is the k-th
``aten.convolution`` of that delegate, the k-th Fully Connected event its k-th ``aten.linear``/``addmm``/``mm``
(XNNPACK creates its operators in the order of the serialized graph's nodes). A kind whose counts differ is left
unmapped (its time under :data:`OTHER`) and said so. Operators run outside a delegate carry debug handles, mapped
through the ETRecord's module hierarchy.

A comparison checks itself (:attr:`LayerBreakdown.suspect`): a layer the mask left unchanged (same FLOPs dense and
compacted) runs the same kernel on the same shapes in both models, so its speedup must be 1 up to noise. The noise
a layer may show is its own (:func:`unchanged_band`): the base band :data:`UNCHANGED_BAND`, widened by the layer's
run-to-run spread in the dense profile (capped at :data:`SPREAD_CAP`) and by :data:`BAND_TICKS` ticks of the
timer (:data:`TIMER_TICK_MS`) relative to its time. A *tiny* layer (under :data:`TINY_SHARE` of the dense run's
operator time, or under :data:`TINY_TICKS` ticks) outside its band is shown and named but does not make the
comparison suspect: a few microseconds of cache or timer decide it. A large unchanged layer outside its band says
the two profiles were not taken alike (threads, load, clocks): the breakdown is marked suspect with the layers
named, and kept out of the summary. The first layer of a run reads a cache the run before it left: the dense
model's larger last layers evict its data, the compacted model's do not, so the dense first layer is slower (a
real effect, named "first layer: cold cache" where it is the one out of band).
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from edgemask.targets import TRAINING_FORMATS, artifact_format
from edgemask.profiling.trt_profile import trt_layer_of

OTHER = "(other)"
REALIZED_FLAG = 0.5  # flag layers realizing less than half their FLOP bound
# The step of each per-layer source's timer, in ms: onnxruntime's trace ("dur") and XNNPACK's ETDump events both count
# whole microseconds (0, 1, 2, ... us in the stored operator samples); a format not listed is taken as the same.
TIMER_TICK_MS = {"onnx": 1e-3, "pte": 1e-3}
DEFAULT_TICK_MS = 1e-3
# The per-layer check (unchanged_band): an unchanged layer (flops_dense == flops_compacted) must measure a speedup
# within [1/w, w], w = UNCHANGED_BAND[1] * (1 + min(spread, SPREAD_CAP)) * (1 + BAND_TICKS * tick / t), where
# spread is its run-to-run IQR / median in the dense profile and t the smaller of its dense and compacted times.
# 0.8-1.25x: symmetric in log; unchanged VGG16 layers on an idle machine measured 0.98-1.09x at 1 thread (issue 28).
# The spread term lets a layer that is noisy by itself be as noisy as it measured, the cap keeps a profile taken
# under load (whose spread grows with the load) from widening its own band past 1.5x; 2 ticks: each of the two
# medians is off by up to one tick of a whole-microsecond timer.
UNCHANGED_BAND = (0.8, 1.25)
SPREAD_CAP = 0.2
BAND_TICKS = 2
# A tiny layer is shown but not judged: under 2 % of the dense run's operator time (VGG16's conv1 on 3 channels is
# ~0.6 %: 35-48 us of ~7 ms), or under 10 ticks (10 us), where one tick is 10 % and the cache state of the
# layer before decides the rest.
TINY_SHARE = 0.02
TINY_TICKS = 10

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


def layer_index(layers: Iterable[Mapping], fmt: str, file: str) -> dict[str, str]:
    """Operator name -> layer for a profile of ``fmt`` reading ``file``: for ``pte`` each layer's own name
    (:func:`etdump_runs` names every mapped ExecuTorch event after its layer), else the ONNX graph names
    (:func:`name_index`). Empty: nothing in this profile can be given to a layer."""
    layers = list(layers)
    if fmt == "pte":
        return {lay["name"]: lay["name"] for lay in layers}
    return name_index(layers, file)


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


def layer_runs_ms(runs: Sequence[Mapping], index: Mapping[str, str]) -> dict[str, list[float]]:
    """Layer -> its summed operator time in each profiled run, in ms (a layer absent from a run counts 0 there)."""
    per_run = [run_layer_us(r["ops"], index) for r in runs]
    layers = sorted({k for r in per_run for k in r})
    return {k: [r.get(k, 0.0) / 1000.0 for r in per_run] for k in layers}


def layer_ms(runs: Sequence[Mapping], index: Mapping[str, str]) -> dict[str, float]:
    """Layer -> median over the profiled runs of its summed operator time, in ms (a layer absent from a run
    counts 0 there)."""
    return {k: statistics.median(xs) for k, xs in layer_runs_ms(runs, index).items()}


def coverage(run: Mapping) -> float:
    """Share of a profiled run's end-to-end latency its operator events account for (sum of ops ÷ end to end)."""
    e2e = float(run.get("end_to_end_ms") or math.nan)
    return sum(float(op[2]) for op in run["ops"]) / 1000.0 / e2e if e2e > 0 else math.nan


def relative_spread(xs: Sequence[float]) -> float:
    """Run-to-run spread of one layer's times: interquartile range ÷ median (0 with fewer than 2 runs or a zero
    median: nothing to widen by)."""
    if len(xs) < 2:
        return 0.0
    q1, q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return (q3 - q1) / q2 if q2 > 0 else 0.0


def unchanged_band(t_ms: float, spread: float, tick_ms: float) -> tuple[float, float]:
    """The speedup an unchanged layer of time ``t_ms`` (the smaller of dense and compacted) may measure:
    ``[1/w, w]``, ``w = UNCHANGED_BAND[1] · (1 + min(spread, SPREAD_CAP)) · (1 + BAND_TICKS · tick_ms / t_ms)``.
    E.g. 1 ms, spread 5 %, 1 µs ticks: w = 1.25 · 1.05 · 1.002 = 1.315."""
    w = UNCHANGED_BAND[1] * (1 + min(max(spread, 0.0), SPREAD_CAP)) * (1 + BAND_TICKS * tick_ms / t_ms)
    return 1 / w, w


def time_text(ms: float, tick_ms: float = DEFAULT_TICK_MS) -> str:
    """A per-layer time as the tables print it: ms to 3 decimals, ``< 1 µs`` under the timer's tick, ``—``
    unmeasured."""
    if not ms == ms:
        return "—"
    return f"< {tick_ms * 1e3:g} µs" if ms < tick_ms else f"{ms:.3f}"


@dataclass(frozen=True)
class LayerRow:
    """One layer of one compacted artifact against the dense one, on one device/runtime/thread count.

    Besides the two medians, what the unchanged-layer check needs: the dense profile's per-run times of this layer
    (its spread), the dense run's summed operator time (the layer's share), the timer's tick and whether this is
    the first of the model's layers (the one a cold cache hits)."""

    layer: str
    kept: int
    total: int
    flops_dense: int
    flops_compacted: int
    dense_ms: float
    compacted_ms: float
    dense_runs_ms: tuple[float, ...] = ()
    dense_total_ms: float = math.nan
    tick_ms: float = DEFAULT_TICK_MS
    first: bool = False

    @property
    def flop_bound(self) -> float:
        return self.flops_dense / self.flops_compacted if self.flops_compacted else math.nan

    @property
    def measured(self) -> bool:
        """Both times are at least one tick of the timer (a time under it is a count of 0 or 1: no ratio)."""
        return self.dense_ms >= self.tick_ms and self.compacted_ms >= self.tick_ms  # NaN compares False

    @property
    def shorter_ms(self) -> float:
        """The smaller of the two times (NaN when either is unmeasured; ``min`` would drop a NaN)."""
        return math.nan if math.isnan(self.dense_ms) or math.isnan(self.compacted_ms) else \
            min(self.dense_ms, self.compacted_ms)

    @property
    def speedup(self) -> float:
        return self.dense_ms / self.compacted_ms if self.measured else math.nan

    @property
    def speedup_text(self) -> str:
        """The speedup as the tables print it; where one side is under a tick, the bound it gives (``> 36×``: the
        compacted layer took under 1 µs of the dense one's 36 µs); ``—`` where neither is measured."""
        if self.measured:
            return f"{self.speedup:.2f}×"
        if self.dense_ms >= self.tick_ms and self.compacted_ms < self.tick_ms:
            return f"> {self.dense_ms / self.tick_ms:.2f}×"
        if self.compacted_ms >= self.tick_ms and self.dense_ms < self.tick_ms:
            return f"< {self.tick_ms / self.compacted_ms:.2f}×"
        return "—"

    @property
    def realized(self) -> float:
        """Measured speedup ÷ FLOP bound (1: the FLOPs removed became time saved in proportion)."""
        return self.speedup / self.flop_bound

    @property
    def flagged(self) -> bool:
        return self.realized < REALIZED_FLAG  # NaN compares False: an unmeasured layer is not flagged

    @property
    def unchanged(self) -> bool:
        """The mask removed none of this layer's FLOPs (nor its inputs'): the same computation in both models."""
        return self.flops_dense == self.flops_compacted > 0

    @property
    def spread(self) -> float:
        """Run-to-run spread of this layer in the dense profile (:func:`relative_spread`)."""
        return relative_spread(self.dense_runs_ms)

    @property
    def share(self) -> float:
        """This layer's share of the dense run's summed operator time (NaN: not known)."""
        return self.dense_ms / self.dense_total_ms if self.dense_total_ms > 0 else math.nan

    @property
    def band(self) -> tuple[float, float]:
        """The speedup this layer may measure if unchanged (:func:`unchanged_band`)."""
        return unchanged_band(self.shorter_ms, self.spread, self.tick_ms)

    @property
    def tiny(self) -> bool:
        """Under :data:`TINY_SHARE` of the dense run or under :data:`TINY_TICKS` ticks: shown, not judged."""
        return self.share < TINY_SHARE or self.shorter_ms < TINY_TICKS * self.tick_ms

    @property
    def out_of_band(self) -> bool:
        """An unchanged, measured layer whose speedup lies outside its :attr:`band` (tiny or not)."""
        if not (self.unchanged and self.measured):
            return False
        lo, hi = self.band
        return not lo <= self.speedup <= hi

    @property
    def suspect(self) -> bool:
        """Out of its band and large enough to judge: the two profiles were not taken alike."""
        return self.out_of_band and not self.tiny

    @property
    def cause(self) -> str | None:
        """What explains an out-of-band reading where we know it: the first layer measuring slower in the dense
        model is the cold cache its larger last layers left (benchmarks/bench_layers.py --cold-check)."""
        if self.out_of_band and self.first and self.speedup > 1:
            return "first layer: cold cache"
        return None

    def tiny_text(self) -> str:
        """Why this layer counts as tiny: its share of the run, else its time in ticks."""
        if self.share < TINY_SHARE:
            return f"{100 * self.share:.1f} % of the run"
        return f"under {TINY_TICKS} ticks of {self.tick_ms * 1e3:g} µs"

    def band_text(self) -> str:
        """``conv1 1.37× outside 0.76-1.31×``, with the cause where known."""
        lo, hi = self.band
        why = f" ({self.cause})" if self.cause else ""
        return f"{self.layer} {self.speedup:.2f}× outside {lo:.2f}-{hi:.2f}×{why}"


def suspect_reason(rows: Sequence[LayerRow]) -> str | None:
    """Why a dense-vs-compacted comparison cannot be trusted (a large unchanged layer outside its band), or
    None."""
    bad = [r for r in rows if r.suspect]
    if not bad:
        return None
    return (f"unchanged layers measure outside their bands ({', '.join(r.band_text() for r in bad)}): the dense "
            "and compacted profiles were not taken alike (threads, load, clocks); kept out of the summary")


def unjudged_note(rows: Sequence[LayerRow]) -> str | None:
    """The tiny unchanged layers outside their bands, shown and not judged (:attr:`LayerRow.tiny`), or None."""
    tiny = [r for r in rows if r.out_of_band and r.tiny]
    if not tiny:
        return None
    named = ", ".join(f"{r.band_text()}, {r.tiny_text()}" for r in tiny)
    return f"tiny unchanged layers outside their bands, not judged: {named}"


def layer_table(layers: Sequence[Mapping], dense_ms: Mapping[str, float], compacted_ms: Mapping[str, float],
                dense_runs_ms: Mapping[str, Sequence[float]] | None = None, dense_total_ms: float = math.nan,
                tick_ms: float = DEFAULT_TICK_MS) -> list[LayerRow]:
    """Rows for the compacted artifact's manifest ``layers`` (with FLOPs), in its order (the first is the model's
    first layer); times looked up by the same module path in the dense and the compacted profile (NaN where a
    profile has no such layer); ``dense_runs_ms`` (per layer, its time in each dense run) and ``dense_total_ms``
    (the dense run's summed operator time) for the unchanged-layer check."""
    runs = dense_runs_ms or {}
    return [LayerRow(lay["name"], lay["kept"], lay["total"], int(lay.get("flops_dense", 0)),
                     int(lay.get("flops_compacted", 0)), dense_ms.get(lay["name"], math.nan),
                     compacted_ms.get(lay["name"], math.nan), tuple(runs.get(lay["name"], ())), dense_total_ms,
                     tick_ms, i == 0) for i, lay in enumerate(layers)]


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

    @property
    def suspect(self) -> str | None:
        """Why this comparison is suspect (:func:`suspect_reason`), or None."""
        return suspect_reason(self.rows)

    @property
    def unjudged(self) -> str | None:
        """The tiny unchanged layers outside their bands, shown and not judged (:func:`unjudged_note`), or None."""
        return unjudged_note(self.rows)


_SETTING = ["format", "variant", "device", "threads"]


def _runs(ops: pd.DataFrame, runs: pd.DataFrame) -> list[dict]:
    """The store's rows of one setting back into the runner's shape: [{"end_to_end_ms", "ops": [...]}, ...]."""
    by_run: dict[tuple, list] = {}  # one pass over plain lists: a pandas group per run cost ~1 ms each
    for job, run, name, op_type, us in zip(*(ops[c].tolist() for c in ("job_id", "run", "name", "op_type", "us"))):
        by_run.setdefault((job, run), []).append([name, op_type, us])
    return [{"end_to_end_ms": r.end_to_end_ms, "ops": by_run.get((r.job_id, r.run), [])}
            for r in runs.itertuples()]


def by_setting(df: pd.DataFrame) -> dict[tuple, pd.DataFrame]:
    """The store's per-job rows (profiles, profiled runs, operator samples) split once by artifact and setting
    ``(artifact, format, variant, device, threads)``: one pass over the table instead of one filter per artifact,
    which made the report quadratic in the clients measured."""
    if df.empty:
        return {}
    return {(a, f, v, d, int(t)): g for (a, f, v, d, t), g in df.groupby(["artifact", *_SETTING], sort=False)}


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
    prof_of, runs_of, ops_of = by_setting(profiles), by_setting(runs), by_setting(ops)
    empty_runs, empty_ops = runs.iloc[:0], ops.iloc[:0]
    timed: dict[tuple, tuple] = {}  # (artifact and setting, file) -> its per-layer medians and totals
    for (art, *setting), prof in profiles.groupby(["artifact", *_SETTING], sort=True):
        man = manifests.get(art)
        if man is None or man.get("kind") != "compacted":
            continue
        fmt, variant, device, threads = setting
        if fmt in TRAINING_FORMATS:  # a training step's per-layer times feed its own model (train_predict)
            continue
        where = f"{device}, {fmt}/{variant}, {threads} thread(s)"
        dense_art = f"{man['run_id']}/dense"
        dense_prof = prof_of.get((dense_art, fmt, variant, device, int(threads)), profiles.iloc[:0])
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
        index = {tag: layer_index(m["layers"], fmt, files[tag])
                 for tag, m in (("dense", dense_man), ("compacted", man))}
        if not all(index.values()) or any("flops_dense" not in lay for lay in man["layers"]):
            notes[f"{art} ({fmt}/{variant}): its manifest has no per-layer graph names or FLOPs for this file; "
                  f"re-export it with this edgemask"] = None
            continue
        per: dict[str, Any] = {}
        for tag, a in (("dense", dense_art), ("compacted", art)):
            key = (a, fmt, variant, device, int(threads))
            if (key, files[tag]) not in timed:  # the dense baseline's, once per setting, not once per client
                rs = _runs(ops_of.get(key, empty_ops), runs_of.get(key, empty_runs))
                by_layer = layer_runs_ms(rs, index[tag])
                timed[key, files[tag]] = ({k: statistics.median(xs) for k, xs in by_layer.items()},
                                          _median(sum(op[2] for op in r["ops"]) / 1e3 for r in rs),
                                          _median(r["end_to_end_ms"] for r in rs), by_layer)
            per[tag] = timed[key, files[tag]]
        tick = TIMER_TICK_MS.get(fmt, DEFAULT_TICK_MS)
        rows = tuple(layer_table(man["layers"], per["dense"][0], per["compacted"][0], per["dense"][3],
                                 per["dense"][1], tick))
        if fmt in ("onnx", "pte") and any(r.shorter_ms < TINY_TICKS * tick for r in rows):
            who = "onnxruntime's trace counts" if fmt == "onnx" else "XNNPACK's ETDump events count"
            notes[f"{who} whole microseconds: a layer under 1 µs is shown as < 1 µs, and an unchanged layer under "
                  f"{TINY_TICKS} µs (or {100 * TINY_SHARE:g} % of the run) is shown, not judged"] = None
        out.append(LayerBreakdown(art, device, fmt, variant, int(threads), rows,
                                  per["dense"][0].get(OTHER, 0.0), per["compacted"][0].get(OTHER, 0.0),
                                  per["dense"][1], per["dense"][2], per["compacted"][1], per["compacted"][2]))
    return out, list(notes)


# -- ExecuTorch: ETDump events to layers ------------------------------------------------------------------------
# Frames around operators, not operators. OPERATOR_CALL wraps each kernel call outside a delegate (the
# ``native_call_<op>`` event inside it) and is "the perf of the previous operator + framework tax of making said
# operator call" (the Inspector's EventBlock.to_dataframe): counting it too would count that operator twice.
ET_FRAME_EVENTS = frozenset({"DELEGATE_CALL", "OPERATOR_CALL", "Method::execute", "Method::init",
                             "Program::load_method"})
# aten op (an ETRecord node name's prefix) -> the XNNPACK operator kind (its event name's prefix) it becomes
ATEN_TO_XNN = (("aten_convolution", "Convolution"), ("aten_linear", "Fully Connected"),
               ("aten_addmm", "Fully Connected"), ("aten_mm", "Fully Connected"))
_XNN_KINDS = tuple(dict.fromkeys(k for _, k in ATEN_TO_XNN))


class EtdumpError(ValueError):
    """An ETDump that cannot be read for these runs (wrong digest, wrong number of executions)."""


def _deepest_layer(stack: Mapping | None, layer_set: set[str]) -> str | None:
    """The innermost module path of an nn_module_stack (``{key: (path, type)}``, outermost first) that is a
    layer."""
    hit = None
    for value in (stack or {}).values():
        path = value[0] if isinstance(value, (tuple, list)) else value
        if path in layer_set:
            hit = path
    return hit


def _xnn_kind(event_name: str) -> str | None:
    return next((k for k in _XNN_KINDS if event_name.startswith(k + " (")), None)


def map_delegate_events(event_names: Sequence[str], hierarchy: Mapping[str, Mapping],
                        layer_set: set[str]) -> tuple[list[str | None], list[str]]:
    """One delegate call's operator events (in order) -> the layer of each (None: no layer), by order per kind.

    ``hierarchy``: the DELEGATE_CALL event's module hierarchy from the ETRecord, ``{node name: nn_module_stack}``
    in graph order (node names ``aten_convolution_default_1_`` ...). Returns the layers and a note per kind whose
    event and op counts differ (left unmapped)."""
    ops: dict[str, list[str | None]] = {}
    for node, stack in hierarchy.items():
        kind = next((k for prefix, k in ATEN_TO_XNN if node.startswith(prefix)), None)
        if kind is not None:
            ops.setdefault(kind, []).append(_deepest_layer(stack, layer_set))
    kinds = [_xnn_kind(n) for n in event_names]
    notes = []
    for kind in _XNN_KINDS:
        n_ev, n_op = kinds.count(kind), len(ops.get(kind, []))
        if n_ev != n_op:
            notes.append(f"{n_ev} XNNPACK {kind} events for {n_op} such aten ops in the delegate: left unmapped")
            ops[kind] = [None] * n_ev
    seen: dict[str, int] = {}
    out: list[str | None] = []
    for kind in kinds:
        if kind is None:
            out.append(None)
            continue
        out.append(ops[kind][seen.get(kind, 0)])
        seen[kind] = seen.get(kind, 0) + 1
    return out, notes


def etdump_runs(etdump: str | Path, etrecord: str | Path | None, layers: Iterable[Mapping], warmup: int,
                end_to_end_ms: Sequence[float]) -> tuple[list[dict], list[str]]:
    """An ETDump of ``warmup`` + ``len(end_to_end_ms)`` executions -> the profiled runs in the runner's shape,
    ``[{"end_to_end_ms", "total_us", "ops": [[name, op type, us, provider], ...]}]`` (warm-up dropped), and notes.

    Leaf events only (XNNPACK's operators, operators run outside a delegate); the frames around them
    (DELEGATE_CALL, Method::execute: ``total_us``) are not operators. An event mapped to a layer is named after
    the layer (op type: the runtime's event name), others keep the runtime's name. Without an ETRecord no event
    can be mapped: every operator falls under :data:`OTHER`, and a note says so."""
    from executorch.devtools import Inspector

    layer_set = {lay["name"] for lay in layers}
    n_exec = warmup + len(end_to_end_ms)
    notes: list[str] = []
    if etrecord is None:
        notes.append("no ETRecord beside the .pte: ExecuTorch operator events cannot be mapped to layers; "
                     "re-export the artifact with this edgemask")
    with _quiet():
        ins = Inspector(etdump_path=str(etdump), etrecord=str(etrecord) if etrecord is not None else None)
    blocks = [b for b in ins.event_blocks if any(e.name == "Method::execute" for e in b.events)]
    if len(blocks) != 1:
        raise EtdumpError(f"{etdump}: {len(blocks)} blocks of executions, expected one (one method, one program)")
    ops: list[tuple[str, str, str, list[float]]] = []  # name, op type, provider, ms per execution
    pending: list = []
    total: list[float] = []
    for e in blocks[0].events:
        raw = list(e.perf_data.raw) if e.perf_data is not None else []
        if len(raw) != n_exec:
            raise EtdumpError(f"{etdump}: event {e.name!r} has {len(raw)} executions, {n_exec} were made "
                              f"({warmup} warm-up + {len(end_to_end_ms)} profiled)")
        if e.is_delegated_op:
            pending.append((e, raw))
        elif e.name == "DELEGATE_CALL":
            mapped, why = map_delegate_events([d.name for d, _ in pending], e.module_hierarchy or {}, layer_set)
            notes += [f"{e.delegate_backend_name or 'delegate'}: {w}" for w in why] if etrecord is not None else []
            backend = pending[0][0].delegate_backend_name if pending else None
            for (d, r), layer in zip(pending, mapped):
                ops.append((layer or d.name, d.name, backend or e.delegate_backend_name or "delegate", r))
            pending = []
        elif e.name == "Method::execute":
            total = raw
        elif e.name not in ET_FRAME_EVENTS:  # an operator run outside any delegate (portable kernels)
            layer = None
            for stack in (e.module_hierarchy or {}).values():
                layer = _deepest_layer(stack, layer_set) or layer
            ops.append((layer or e.name, e.name, "portable", raw))
    if pending:
        raise EtdumpError(f"{etdump}: {len(pending)} delegated events after the last DELEGATE_CALL")
    runs = []
    for i, ms in enumerate(end_to_end_ms):
        k = warmup + i
        runs.append({"end_to_end_ms": ms, "total_us": total[k] * 1e3 if total else None,
                     "ops": [[name, op_type, raw[k] * 1e3, provider] for name, op_type, provider, raw in ops]})
    return runs, list(dict.fromkeys(notes))


def _quiet():
    """The Inspector prints its warnings (a missing debug-handle map, ...) through logging: keep them quiet."""
    import contextlib
    import logging
    import warnings

    @contextlib.contextmanager
    def ctx():
        level = logging.root.level
        logging.root.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                yield
            finally:
                logging.root.setLevel(level)
    return ctx()


def attach_etdump(profile: dict, artifact_dir: str | Path, etrecord: str | None, layers: Iterable[Mapping],
                  keep_dir: str | Path | None = None) -> dict:
    """A runner's ExecuTorch profile (``etdump_b64`` and its ``etdump_sha256``) -> the same profile with its runs'
    operators filled from the ETDump (:func:`etdump_runs`) and the bytes gone from it (kept, when ``keep_dir``,
    as ``<keep_dir>/<sha256>.etdp``, named by its digest). Wrong digest or unreadable ETDump: the profile is
    marked not available with the reason; the timed result is untouched."""
    import base64
    import hashlib
    import tempfile

    from edgemask.fileio import write_bytes_atomic

    if not profile.get("etdump_b64"):
        return profile
    out = {k: v for k, v in profile.items() if k != "etdump_b64"}
    data = base64.b64decode(profile["etdump_b64"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != profile.get("etdump_sha256"):
        return {**out, "available": False, "reason": f"the ETDump brought back has sha256 {digest}, the board "
                f"sent {profile.get('etdump_sha256')}: damaged on the way; measure again"}
    rec = Path(artifact_dir) / etrecord if etrecord else None
    if rec is not None and not rec.is_file():
        rec = None
    with tempfile.TemporaryDirectory(prefix="edgemask-etdump-") as tmp:
        path = Path(tmp) / "model.etdp"
        path.write_bytes(data)
        try:
            runs, notes = etdump_runs(path, rec, layers, int(profile.get("warmup_runs") or 0),
                                      [r["end_to_end_ms"] for r in profile.get("runs") or []])
        except (EtdumpError, RuntimeError, ValueError) as e:
            return {**out, "available": False, "reason": f"the ETDump could not be read: {e}"}
    if keep_dir is not None:
        write_bytes_atomic(Path(keep_dir) / f"{digest}.etdp", data)
    return {**out, "runs": runs, "blocks": [*out.get("blocks", []), *notes]}
