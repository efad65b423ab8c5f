"""Measure a sample of clients, predict the rest: per-layer time against kept units, summed over layers.

At the papers' scale (FedMask: 400 devices) measuring every client × format × threads on every board takes hours.
The architecture is fixed and only the widths vary, so a campaign may set ``sample_clients = K``: K clients are
measured (:func:`choose_sample`: spread over the range of total kept units, the seed recorded in the campaign)
and the others are predicted from the measured clients' per-layer times, per device, format, variant and threads:

* per layer ``l`` (its type and shape are fixed by the architecture), a least-squares fit of its profiled time
  against its compacted width: ``t_l(x) = a_l + b_l · F_l(x) + c_l · k_l(x)`` — ``F_l`` the layer's compacted
  FLOPs (kept outputs × kept inputs × kernel: the work), ``k_l`` its kept output units (per-unit costs: bias,
  activation, the output written). Which terms enter is :data:`LAYER_FEATURES` (the named setting; a layer with
  fewer measured clients than terms keeps only the first ones);
* the model's fixed per-inference cost ``C``: the median over the measured clients of (timed p50 latency − the sum
  of its profiled layer times) — what no layer claims (input/output copies, the runtime's call, operators outside
  every layer) and the profiler's own per-operator overhead, both independent of the widths;
* a client's prediction: ``T̂ = C + Σ_l t_l(x)`` (the same form as nn-Meter's kernel-sum, Zhang et al., MobiSys
  2021: "the model latency is the sum of all kernels' latency"; LitePred, Feng et al., NSDI 2024, likewise).

The error is measured on measured clients held out of the fit (:func:`leave_one_out`): the share of them within
±10 % and ±5 % and the worst. A predicted row is never a measurement: it carries ``predicted = True``,
``verdict = "PREDICTED"``, ``valid = False`` and ``comparison_valid = False`` (:func:`predicted_rows`), so no
VALID count or comparison takes it in unseen.

The per-layer records this reads are the runtime-neutral ones of :mod:`edgemask.profiling.layers` (layer → profiled ms,
from whichever runtime gave per-operator events: onnxruntime's by graph name, ExecuTorch's ETDump events by the
layer ``attach_etdump`` gave them; :func:`edgemask.profiling.layers.layer_index`) and the manifest's per-layer
``kept`` / ``flops_compacted``. A setting that has clients left to predict but no measured client's per-layer times
is not silently empty: :func:`setting_inputs` says why (:class:`Unpredicted`) and the report prints it.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from edgemask.errors import ConfigError

# The terms of each layer's fit, in the order they are dropped when a layer has too few measured clients. The
# issue (#30) leaves the form open ("fit each layer's time against its kept units (and the layer's type and
# shape)"): FLOPs carry the shape (kept outputs × kept inputs × kernel), kept units the per-unit costs.
LAYER_FEATURES = ("flops", "kept")
PREDICTED = "PREDICTED"  # the verdict column of a predicted row: neither VALID nor INVALID
SETTING = ("device", "format", "variant", "threads")


@dataclass(frozen=True)
class ClientLayers:
    """One client's artifact on one setting: per layer its kept units and compacted FLOPs (from its manifest);
    when measured, per layer its profiled ms and the client's timed p50 latency."""

    artifact: str
    kept: Mapping[str, int]
    flops: Mapping[str, int]
    layer_ms: Mapping[str, float] | None = None
    latency_ms: float | None = None
    # the model it is a compaction of (:func:`model_of`: architecture, data set, dense parameters, each layer's
    # units); "" where not stated. One fit takes clients of one model only (issue #44)
    model: str = ""

    @property
    def measured(self) -> bool:
        return self.layer_ms is not None and self.latency_ms is not None and self.latency_ms == self.latency_ms

    @property
    def kept_total(self) -> int:
        return int(sum(self.kept.values()))


def _row(c: ClientLayers, layer: str, features: Sequence[str]) -> list[float]:
    values = {"flops": float(c.flops.get(layer, 0)), "kept": float(c.kept.get(layer, 0))}
    return [1.0, *(values[f] for f in features)]


@dataclass(frozen=True)
class LatencyModel:
    """Per layer, the fitted coefficients (intercept, then :data:`LAYER_FEATURES` terms) and the fixed cost."""

    layers: Mapping[str, tuple[tuple[str, ...], tuple[float, ...]]]
    fixed_ms: float
    fitted_on: tuple[str, ...] = field(default=())
    model: str = ""  # the model of every client it was fitted on (ClientLayers.model)

    def layer_ms(self, c: ClientLayers) -> dict[str, float]:
        return {l: float(np.dot(_row(c, l, feats), coef)) for l, (feats, coef) in self.layers.items()}

    def predict(self, c: ClientLayers) -> float:
        """``T̂ = C + Σ_l t_l(x)``; a client of another model than the fit's is refused (its layers' times are
        not these)."""
        if c.model and self.model and c.model != self.model:
            raise ConfigError(f"cannot predict {c.artifact} ({c.model}) with a fit on {', '.join(self.fitted_on)} "
                              f"({self.model}): another model; measure some of its own clients")
        return self.fixed_ms + sum(self.layer_ms(c).values())


def fit(clients: Sequence[ClientLayers], features: Sequence[str] = LAYER_FEATURES) -> LatencyModel:
    """Fit every layer's time (least squares; min-norm where clients do not vary a term) and the fixed cost on
    the measured ``clients``."""
    measured = [c for c in clients if c.measured]
    if not measured:
        raise ValueError("no measured client to fit on")
    other = next((c for c in measured if c.model != measured[0].model), None)
    if other is not None:  # per-layer times of two architectures are no one line
        raise ConfigError(f"cannot fit one latency model on clients of two models: {measured[0].artifact} "
                          f"({measured[0].model or 'model not stated'}) and {other.artifact} "
                          f"({other.model or 'model not stated'}); fit each model's clients apart")
    layers = sorted({l for c in measured for l in c.kept})
    out = {}
    for l in layers:
        feats = tuple(features[: max(0, min(len(features), len(measured) - 1))])
        x = np.array([_row(c, l, feats) for c in measured])
        y = np.array([float(c.layer_ms.get(l, 0.0)) for c in measured])
        scale = np.abs(x).max(axis=0)
        scale[scale == 0] = 1.0
        coef, *_ = np.linalg.lstsq(x / scale, y, rcond=None)
        out[l] = (feats, tuple(float(v) for v in coef / scale))
    fixed = statistics.median(c.latency_ms - sum(c.layer_ms.get(l, 0.0) for l in layers) for c in measured)
    return LatencyModel(out, float(fixed), tuple(c.artifact for c in measured), measured[0].model)


@dataclass(frozen=True)
class Unpredicted:
    """A setting measured without a single client's per-layer times: how many were measured, how many of the
    run's clients are left unpredicted, and why."""

    measured: int
    left: int
    reason: str


@dataclass(frozen=True)
class HeldOut:
    artifact: str
    measured_ms: float
    predicted_ms: float

    @property
    def error(self) -> float:
        """Relative error of the prediction, (predicted − measured) ÷ measured."""
        return self.predicted_ms / self.measured_ms - 1.0


def leave_one_out(clients: Sequence[ClientLayers], features: Sequence[str] = LAYER_FEATURES) -> list[HeldOut]:
    """Each measured client predicted by a model fitted on the other measured clients (needs ≥ 2)."""
    measured = [c for c in clients if c.measured]
    if len(measured) < 2:
        return []
    return [HeldOut(c.artifact, float(c.latency_ms), fit([o for o in measured if o is not c], features).predict(c))
            for c in measured]


def error_summary(held: Sequence[HeldOut]) -> dict[str, float]:
    """``n``, share within ±10 % and ±5 % (``within_10``, ``within_5``) and the worst ``|error|``."""
    errs = [abs(h.error) for h in held]
    if not errs:
        return {"n": 0, "within_10": math.nan, "within_5": math.nan, "worst": math.nan}
    eps = 1e-12  # a ratio like 9.5 / 10 − 1 lands a rounding error past −5 %: the bound itself counts as within
    return {"n": len(errs), "within_10": sum(e <= 0.10 + eps for e in errs) / len(errs),
            "within_5": sum(e <= 0.05 + eps for e in errs) / len(errs), "worst": max(errs)}


def choose_sample(kept_total: Mapping[str, int], k: int, seed: int) -> list[str]:
    """K clients spread over the range of total kept units: sorted by it, cut into K consecutive groups of
    (nearly) equal size, one drawn from each (``random.Random(seed)``); the first group gives its smallest client
    and the last its largest, so the fit spans the whole range instead of extrapolating. All when K ≥ their
    number. Returned in name order."""
    names = sorted(kept_total, key=lambda a: (kept_total[a], a))
    if k >= len(names):
        return sorted(names)
    rng = random.Random(seed)
    groups = [list(g) for g in np.array_split(np.array(names, dtype=object), k)]
    picked = []
    for i, g in enumerate(groups):
        picked.append(g[0] if i == 0 else g[-1] if i == len(groups) - 1 else rng.choice(g))
    return sorted(picked)


# -- from the campaign's store ----------------------------------------------------------------------------
def model_of(manifest: Mapping) -> str:
    """The model an artifact is a compaction of, as its manifest states it: architecture, data set, the dense
    model's parameters and each layer's total units (its shape), e.g. ``"cnn on digits, 1,000 parameters,
    layers conv1/16 fc/10"``. Two artifacts of one model state the same text."""
    layers = " ".join(f"{lay['name']}/{lay.get('total', '?')}" for lay in manifest.get("layers") or [])
    dense = (manifest.get("params") or {}).get("dense")
    return (f"{manifest.get('model')} on {manifest.get('dataset')}, "
            + (f"{int(dense):,} parameters" if dense is not None else "parameters not stated")
            + (f", layers {layers}" if layers else ""))


def _kept_flops(manifest: Mapping) -> tuple[dict[str, int], dict[str, int]]:
    layers = manifest.get("layers") or []
    return ({lay["name"]: int(lay["kept"]) for lay in layers},
            {lay["name"]: int(lay.get("flops_compacted", 0)) for lay in layers})


def _manifest_kept_total(manifest: Mapping) -> int:
    return int(sum(int(lay["kept"]) for lay in manifest.get("layers") or []))


def kept_totals(manifests: Mapping[str, Mapping]) -> dict[str, int]:
    """Artifact -> its total kept units (the quantity :func:`choose_sample` spreads the sample over)."""
    return {a: _manifest_kept_total(m) for a, m in manifests.items()}


def setting_inputs(summary: pd.DataFrame, artifacts: pd.DataFrame, profiles: pd.DataFrame, runs: pd.DataFrame,
                   ops: pd.DataFrame) -> tuple[dict[tuple, list[ClientLayers]], dict[tuple, Unpredicted]]:
    """Per setting (device, format, variant, threads) and run: every artifact of that run (measured or not) as
    a :class:`ClientLayers`; measured ones with their per-layer profiled ms (:func:`edgemask.profiling.layers.layer_ms`
    over :func:`edgemask.profiling.layers.layer_index`: ONNX graph names, or for ``.pte`` the layer names the ETDump's
    events were given) and timed p50. Key: ``(run_id, device, format, variant, threads)``.

    Second: per setting measured without a single client's per-layer times, an :class:`Unpredicted` saying why
    none of the run's other clients can be predicted there (no profiled runs, the runtime gave no per-operator
    events, a manifest without per-layer records for the file, no operator event mapped to a layer)."""
    from edgemask.profiling.layers import _runs, by_setting, layer_index, layer_ms
    from edgemask.targets import artifact_format

    manifests = {a: json.loads(m) for a, m in zip(artifacts["artifact"], artifacts["manifest"])}
    out: dict[tuple, list[ClientLayers]] = {}
    why: dict[tuple, str] = {}
    if summary.empty:
        return out, why
    prof_of, runs_of, ops_of = by_setting(profiles), by_setting(runs), by_setting(ops)
    measured: dict[tuple, set[str]] = {}  # setting -> artifacts with a timed row (never to be predicted)
    seen: set[tuple] = set()  # a setting measured from two files: its first row, as before
    for art, fmt, variant, device, threads, p50 in zip(*(summary[c].tolist() for c in (
            "artifact", "format", "variant", "device", "threads", "p50_ms"))):
        key = (art, fmt, variant, device, int(threads))
        man = manifests.get(art)
        if key in seen or man is None:
            continue
        seen.add(key)
        setting = (man["run_id"], device, fmt, variant, int(threads))
        measured.setdefault(setting, set()).add(art)
        prof = prof_of.get(key)
        file = next((f["file"] for f in man["files"] if f["format"] == artifact_format(fmt)
                     and f["variant"] == variant), "")
        index = layer_index(man.get("layers") or [], fmt, file)
        if prof is None or prof.empty:
            why.setdefault(setting, "no profiled runs, so no per-layer times (set [runner] profile_layers = true)")
            continue
        if not prof["available"].all():
            reason = next((r for r in prof["reason"] if r), "no reason given")
            why.setdefault(setting, f"per-layer times not available: {reason}")
            continue
        if not index:
            why.setdefault(setting, f"{art}'s manifest has no per-layer records for {file or fmt}; re-export it "
                                    "with this edgemask")
            continue
        kept, flops = _kept_flops(man)
        per = layer_ms(_runs(ops_of.get(key, ops.iloc[:0]), runs_of.get(key, runs.iloc[:0])), index)
        if not any(l in per for l in kept):
            notes = [n for b in prof["blocks"] for n in json.loads(b or "[]")]
            why.setdefault(setting, "no profiled operator event was mapped to a layer"
                           + (f" ({notes[0]})" if notes else ""))
            continue
        out.setdefault(setting, []).append(
            ClientLayers(art, kept, flops, {l: per.get(l, 0.0) for l in kept}, float(p50), model_of(man)))
    for (run_id, *rest), clients in out.items():  # the run's other artifacts, to predict
        have = measured[(run_id, *rest)]
        for art, man in sorted(manifests.items()):
            if man.get("run_id") == run_id and art not in have and man.get("layers"):
                kept, flops = _kept_flops(man)
                clients.append(ClientLayers(art, kept, flops, model=model_of(man)))
    left = {s: sum(1 for a, m in manifests.items() if m.get("run_id") == s[0] and m.get("layers") and a not in have)
            for s, have in measured.items()}
    return out, {s: Unpredicted(len(measured[s]), left[s], w) for s, w in why.items() if s not in out}


def setting_clients(summary: pd.DataFrame, artifacts: pd.DataFrame, profiles: pd.DataFrame, runs: pd.DataFrame,
                    ops: pd.DataFrame) -> dict[tuple, list[ClientLayers]]:
    """The clients of :func:`setting_inputs` alone (settings without per-layer times give no entry)."""
    return setting_inputs(summary, artifacts, profiles, runs, ops)[0]


def predicted_rows(summary: pd.DataFrame, artifacts: pd.DataFrame, profiles: pd.DataFrame, runs: pd.DataFrame,
                   ops: pd.DataFrame, features: Sequence[str] = LAYER_FEATURES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(predicted rows, held-out error per setting). A predicted row: the artifact's identifying columns, the
    digest of the file it is about (from the store's manifest), ``p50_ms`` predicted, ``predicted = True``,
    ``verdict = "PREDICTED"``, ``valid = comparison_valid = False``, ``predicted_from`` (the measured artifacts
    fitted on) and its setting's leave-one-out error (``loo_n``, ``loo_within_10``, ``loo_within_5``,
    ``loo_worst``). The error table has a row per setting, ``reason`` saying why a setting with clients left to
    predict has none predicted (None where it has)."""
    from edgemask.targets import artifact_format

    manifests = {a: json.loads(m) for a, m in zip(artifacts["artifact"], artifacts["manifest"])}
    rows, errors = [], []
    by_setting, why = setting_inputs(summary, artifacts, profiles, runs, ops)
    for (run_id, device, fmt, variant, threads), u in sorted(why.items()):
        if not u.left:  # nothing left to predict there: nothing to explain
            continue
        errors.append({"run_id": run_id, "device": device, "format": fmt, "variant": variant, "threads": threads,
                       "measured": u.measured, "predicted": 0, "unpredicted": u.left,
                       **{f"loo_{k}": v for k, v in error_summary([]).items()}, "reason": u.reason})
    for (run_id, device, fmt, variant, threads), clients in sorted(by_setting.items()):
        todo = [c for c in clients if not c.measured]
        measured = [c for c in clients if c.measured]
        held = leave_one_out(measured, features)
        err = error_summary(held)
        errors.append({"run_id": run_id, "device": device, "format": fmt, "variant": variant, "threads": threads,
                       "measured": len(measured), "predicted": len(todo), "unpredicted": 0,
                       **{f"loo_{k}": v for k, v in err.items()}, "reason": None})
        if not todo:
            continue
        model = fit(measured, features)
        for c in todo:
            man = manifests[c.artifact]
            f = next((f for f in man["files"] if f["format"] == artifact_format(fmt) and f["variant"] == variant),
                     None)
            if f is None:
                continue
            rows.append({"run_id": run_id, "client_id": man["client_id"], "algorithm": man.get("algorithm"),
                         "kind": man.get("kind"), "model": man.get("model"), "dataset": man.get("dataset"),
                         "format": fmt, "variant": variant, "device": device, "threads": threads,
                         "artifact": c.artifact, "artifact_sha256": f["sha256"], "p50_ms": model.predict(c),
                         "params_dense": man["params"]["dense"], "params_compacted": man["params"]["compacted"],
                         "flops_dense": man["flops"]["dense"], "flops_compacted": man["flops"]["compacted"],
                         "predicted": True, "verdict": PREDICTED, "valid": False, "comparison_valid": False,
                         "predicted_from": ",".join(model.fitted_on),
                         **{f"loo_{k}": v for k, v in err.items()}})
    errors.sort(key=lambda e: tuple(e[k] for k in ("run_id", "device", "format", "variant", "threads")))
    return pd.DataFrame(rows), pd.DataFrame(errors)


def error_lines(errors: pd.DataFrame) -> list[str]:
    """One line per setting: how well held-out measured clients were predicted, or why none was predicted."""
    lines = []
    for r in errors.itertuples():
        where = f"{r.run_id} on {r.device}, {r.format}/{r.variant}, {r.threads} thread(s): {r.measured} measured"
        if isinstance(getattr(r, "reason", None), str):  # None in a column of strings reads back as NaN
            lines.append(f"{where}, {r.unpredicted} not predicted: {r.reason}")
            continue
        if not r.loo_n:
            lines.append(f"{where}, {r.predicted} predicted; no held-out error (it needs 2 measured clients)")
            continue
        lines.append(f"{where}, {r.predicted} predicted; held-out (leave-one-out) error: "
                     f"{100 * r.loo_within_10:.0f} % within ±10 %, {100 * r.loo_within_5:.0f} % within ±5 %, "
                     f"worst {100 * r.loo_worst:.1f} %")
    return lines


def held_out_table(clients: Iterable[ClientLayers], features: Sequence[str] = LAYER_FEATURES) -> pd.DataFrame:
    """Per measured client: measured and leave-one-out predicted ms and the error (benchmarks, the report)."""
    return pd.DataFrame([{"artifact": h.artifact, "measured_ms": h.measured_ms, "predicted_ms": h.predicted_ms,
                          "error": h.error} for h in leave_one_out(list(clients), features)])
