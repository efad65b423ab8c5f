"""A per-layer model of a client's local training step (issue #46): measure a sample of clients, predict the rest.

:mod:`edgemask.profiling.predict` does this for inference (a layer's time against its kept units). A training step
is another computation: the exported step (``export/training.py``) runs the client's *dense* masked network — every
client of a model has the same layer shapes — and what differs between clients is which tensors train. A trained
layer computes a weight gradient; a layer with a trained layer below it must pass the input gradient down through
itself; a layer with neither only runs forward (PerFedMask's FLOP count, ``trainer/algorithms/perfedmask.py``, counts
the same two backward terms). So per layer ``l`` its state is ``s_l = (w_l, g_l)``: ``w_l`` some tensor of the layer
trains, ``g_l`` some layer before it (in the step's forward order) trains.

The runner's profiled steps (``devices/remote/runner/training.py``: torch's profiler, per graph node its forward
and its backward events, named ``<node>[<tensors it reads>]``) are attributed to the manifest's layers here
(:func:`attribute`): a node reading tensors of exactly one layer is that layer's (a gated weight, a mask, the
regularizer's terms of that layer included); a node on the minibatch's path that reads no layer's tensor (an
activation, a pooling, a batch norm whose module is no manifest layer, the loss) belongs to the layer before it
(its *segment*); a backward event to its forward node. Nodes before the first layer, or reading several layers,
are :data:`OTHER`; zero_grad, AccumulateGrad and the optimizer's step are :data:`UPDATE`.

The model, per board (one fit per model, as the inference predictor's), from the measured clients:

* ``t(l, s)``: a layer's time (forward + backward, median over its profiled steps) in state ``s``, the median over
  the measured clients in which ``l`` was in state ``s`` (the step is dense: a layer's work in one state is the same
  for every client of the model, so no width term enters; kept units change nothing the step computes);
* a layer no gradient reaches (``s = (0, 0)``: frozen, nothing trained below it) runs its forward alone — autograd
  never visits it — so where that state was not measured its time is its forward time as measured while frozen;
* another state a layer was never measured in takes its *kind*'s ratio (``aten::linear``, ``aten::conv2d``, ...):
  ``t(l, s) = f_l · median over layers k of that kind measured in s of t(k, s) / f_k``, with ``f`` a layer's forward
  time (measured in every state) — where ``f_l`` lies within the range of those ``f_k`` (widened by
  :data:`RANGE_SLACK`); outside it, or with no layer of the kind measured in ``s``, the model refuses
  (:class:`CannotPredict`) rather than extrapolate;
* ``U(p) = u_0 + u_1 · p``: the update (zero_grad, AccumulateGrad, SGD with momentum over the ``p`` trained
  parameters), least squares over the measured clients; a ``p`` outside their range (± :data:`RANGE_SLACK`) refused;
* ``C``: the fixed cost, the median over measured clients of (timed step p50 − Σ_l t(l, s_l) − U(p)) — what no layer
  claims (the loss's first gradient, Python between ops) and the profiler's own inflation, as ``C`` in the inference
  predictor;
* a client's step ``Ŝ = C + Σ_l t(l, s_l) + U(p)`` and its local round ``R̂ = ρ · steps_per_round · Ŝ``, ``ρ`` the
  median over measured clients of measured round ÷ (steps × step p50) (a round's steps run back to back, warmer
  than the timed ones, or not).

Held-out error (:func:`leave_one_out`) is measured as the inference predictor's is, with the clients it refuses
counted apart.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from edgemask.errors import ConfigError, EdgemaskError

OTHER = "(other)"
UPDATE = "(update)"
# How far past the fitted range (of a kind's forward times, of the trained parameters) a prediction may reach: 10 %,
# about the run-to-run spread of a step on a shared machine; farther is an extrapolation, refused.
RANGE_SLACK = 0.10
_ENTRY = re.compile(r"^(?P<node>.*)\[(?P<keys>[^\[\]]*)\]$")
_KEY = re.compile(r"^(?P<kind>[tgf])(?P<i>\d+)$")


class CannotPredict(EdgemaskError):
    """The model cannot predict this client's step: a layer (or its kind) never measured in the state the client
    puts it in, a feature beyond the fitted range, another model, a trained tensor of no known layer."""


# -- attribution of one profiled step --------------------------------------------------------------------------
@dataclass(frozen=True)
class Structure:
    """What a profiled step's graph says of the model: its layers in forward order, each layer's kind (the op of
    its first node, e.g. ``aten::linear``) and which layer each tensor's module belongs to (a manifest layer's own
    module; a batch norm's, by the segment it runs in)."""

    order: tuple[str, ...]
    kinds: Mapping[str, str]
    modules: Mapping[str, str]

    def layer_of(self, tensor: str) -> str | None:
        return self.modules.get(_module(tensor))


@dataclass(frozen=True)
class StepTimes:
    """One profiled step attributed: per layer (forward ms, backward ms), the update, the rest, and the step's
    end-to-end ms under the profiler."""

    layers: Mapping[str, tuple[float, float]]
    update_ms: float
    other_ms: float
    end_to_end_ms: float

    @property
    def total_ms(self) -> float:
        """Every op entry of the step, summed: its layers, the update and the rest."""
        return sum(f + b for f, b in self.layers.values()) + self.update_ms + self.other_ms


def _module(tensor: str) -> str:
    return tensor.rsplit(".", 1)[0] if "." in tensor else tensor


def _tensor(key: str, trained: Sequence[str], frozen: Sequence[str]) -> str | None:
    """A program tensor's key (``t3``, ``g3``: trained[3]; ``f1``: frozen[1]) -> the task's tensor name; constants
    (``c<i>``) and buffers (``b<i>``) carry no name the manifest records: None."""
    m = _KEY.match(key)
    if m is None:
        return None
    names = frozen if m["kind"] == "f" else trained
    i = int(m["i"])
    return names[i] if i < len(names) else None


def _parse(name: str) -> tuple[str, list[str]]:
    m = _ENTRY.match(name)
    if m is None:
        return name, []
    return m["node"], [k for k in m["keys"].split(",") if k]


def structure_of(ops: Sequence[Sequence], layers: Sequence[str], trained: Sequence[str],
                 frozen: Sequence[str]) -> tuple[Structure, dict[str, str]]:
    """The :class:`Structure` a profiled step's op entries show, and each node's owner (a layer, or
    :data:`OTHER`). Forward entries in order: a node reading one layer's tensors is that layer's and starts its
    segment; one reading none is the segment's (and so are the modules of the tensors it reads, e.g. a batch norm's);
    one reading several layers', or before the first layer, is OTHER. Then the ``param`` nodes (the tensors alone):
    the one layer their tensors belong to, else OTHER."""
    names = set(layers)
    modules: dict[str, str] = {n: n for n in names}
    owner: dict[str, str] = {}
    order: list[str] = []
    kinds: dict[str, str] = {}
    segment = OTHER
    entries = [(str(o[0]), str(o[1]), str(o[3]) if len(o) > 3 else "") for o in ops]
    for name, op, phase in entries:
        if phase != "forward":
            continue
        node, keys = _parse(name)
        if node in owner:
            continue
        tensors = [t for t in (_tensor(k, trained, frozen) for k in keys) if t is not None]
        hit = {_module(t) for t in tensors if _module(t) in names}
        if len(hit) == 1:
            segment = hit.pop()
            if segment not in kinds:
                order.append(segment)
                kinds[segment] = op
            owner[node] = segment
        elif hit:
            owner[node] = OTHER
        else:
            owner[node] = segment
            if segment != OTHER:
                for t in tensors:
                    modules.setdefault(_module(t), segment)
    for name, op, phase in entries:
        if phase != "param":
            continue
        node, keys = _parse(name)
        if node in owner:
            continue
        hit = {modules.get(_module(t)) for t in (_tensor(k, trained, frozen) for k in keys) if t is not None}
        hit.discard(None)
        owner[node] = hit.pop() if len(hit) == 1 else OTHER
    return Structure(tuple(order), kinds, {m: l for m, l in modules.items() if l in kinds}), owner


def attribute(ops: Sequence[Sequence], end_to_end_ms: float, owner: Mapping[str, str]) -> StepTimes:
    """One profiled step's op entries ``[name, op, us, phase]`` summed per layer (forward, backward) by the owners
    :func:`structure_of` gave its nodes; update entries to the update, the rest to other."""
    fwd: dict[str, float] = {}
    bwd: dict[str, float] = {}
    update = other = 0.0
    for o in ops:
        name, us, phase = str(o[0]), float(o[2]), str(o[3]) if len(o) > 3 else ""
        if phase == "update":
            update += us
            continue
        layer = owner.get(_parse(name)[0], OTHER) if phase in ("forward", "param", "backward") else OTHER
        if layer == OTHER:
            other += us
        elif phase == "backward":
            bwd[layer] = bwd.get(layer, 0.0) + us
        else:
            fwd[layer] = fwd.get(layer, 0.0) + us
    layers = {l: (fwd.get(l, 0.0) / 1e3, bwd.get(l, 0.0) / 1e3) for l in {*fwd, *bwd}}
    return StepTimes(layers, update / 1e3, other / 1e3, float(end_to_end_ms))


# -- a client's step -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClientStep:
    """One client's local step on one setting: from its manifest, the tensors it trains and its round's steps;
    when measured, its attributed profiled steps, the structure they show, the timed step p50 and round."""

    artifact: str
    trained: tuple[str, ...]
    trained_params: int
    steps_per_round: int
    model: str = ""
    profiled: tuple[StepTimes, ...] = ()
    structure: Structure | None = None
    step_ms: float | None = None
    round_ms: float | None = None

    @property
    def measured(self) -> bool:
        return bool(self.profiled) and self.structure is not None and self.step_ms is not None \
            and math.isfinite(self.step_ms)

    def layer_ms(self) -> dict[str, tuple[float, float]]:
        """Per layer, the medians over the profiled steps of its forward and its backward ms."""
        names = sorted({l for s in self.profiled for l in s.layers})
        return {l: (statistics.median(s.layers.get(l, (0.0, 0.0))[0] for s in self.profiled),
                    statistics.median(s.layers.get(l, (0.0, 0.0))[1] for s in self.profiled)) for l in names}

    def update_ms(self) -> float:
        return statistics.median(s.update_ms for s in self.profiled)


def client_step(manifest: Mapping, profile: Mapping | None = None, step_ms: float | None = None,
                round_ms: float | None = None) -> ClientStep:
    """A :class:`ClientStep` from an artifact's manifest (its ``training`` object and ``layers``) and, when
    measured, the runner's profile document (``{"available", "runs": [{"end_to_end_ms", "ops"}]}``), the timed
    step p50 and the measured round. A profile that is not available leaves the client unmeasured."""
    from edgemask.profiling.predict import model_of

    t = manifest.get("training") or {}
    if not t:
        raise ConfigError(f"{manifest.get('run_id')}/{manifest.get('client_id')}: its manifest has no training step")
    art = f"{manifest['run_id']}/{manifest['client_id']}"
    base = ClientStep(art, tuple(t["trained"]), int(t["trained_params"]), int(t["steps_per_round"]),
                      model_of(manifest))
    runs = list((profile or {}).get("runs") or []) if (profile or {}).get("available") else []
    runs = [r for r in runs if r.get("ops")]
    if not runs:
        return base
    layers = [lay["name"] for lay in manifest.get("layers") or []]
    structure, owner = structure_of(runs[0]["ops"], layers, t["trained"], t.get("frozen") or [])
    steps = tuple(attribute(r["ops"], float(r.get("end_to_end_ms") or math.nan), owner) for r in runs)
    return ClientStep(base.artifact, base.trained, base.trained_params, base.steps_per_round, base.model, steps,
                      structure, None if step_ms is None else float(step_ms),
                      None if round_ms is None else float(round_ms))


def states(c: ClientStep, structure: Structure) -> dict[str, tuple[int, int]]:
    """Per layer of ``structure`` (forward order) its state ``(w, g)`` in ``c``'s step: ``w`` a tensor of it trains,
    ``g`` a layer before it trains (the input gradient flows through it). A trained tensor of no layer the
    structure knows is refused."""
    trained_layers = set()
    for t in c.trained:
        layer = structure.layer_of(t)
        if layer is None:
            raise CannotPredict(f"{c.artifact}: its trained tensor {t!r} belongs to no layer the fitted clients' "
                                f"profiles showed (layers: {', '.join(structure.order)}); measure a client that "
                                f"trains it")
        trained_layers.add(layer)
    out, below = {}, 0
    for l in structure.order:
        w = int(l in trained_layers)
        out[l] = (w, below)
        below = below or w
    return out


def state_text(s: tuple[int, int]) -> str:
    return {(0, 0): "frozen, no gradient through it", (1, 0): "trained, no gradient below it",
            (0, 1): "frozen, gradient through it", (1, 1): "trained, gradient through it"}[s]


# -- the model -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepPrediction:
    artifact: str
    step_ms: float
    round_ms: float
    layers: Mapping[str, float]  # per layer its predicted ms
    by_kind: tuple[str, ...] = ()  # layers whose state was taken from their kind's ratio
    forward_only: tuple[str, ...] = ()  # layers no gradient reaches, not measured so: their forward time


@dataclass(frozen=True)
class TrainCostModel:
    """The fitted per-layer model of one model's training step on one board (see the module docstring)."""

    structure: Structure
    cells: Mapping[tuple[str, int, int], float]  # (layer, w, g) -> ms
    forward_ms: Mapping[str, float]  # layer -> its forward ms (median over fitted clients)
    frozen_forward_ms: Mapping[str, float]  # layer -> its forward ms where it was frozen (median; absent: never)
    update: tuple[float, float]  # (u0 ms, u1 ms per trained parameter)
    update_range: tuple[int, int]  # trained parameters fitted on
    fixed_ms: float
    round_factor: float
    fitted_on: tuple[str, ...] = field(default=())
    model: str = ""

    def kind_ratio(self, layer: str, s: tuple[int, int]) -> tuple[float, tuple[float, float]] | None:
        """For a layer never measured in state ``s``: its kind's median ratio t(k, s) / f_k over the layers of that
        kind measured in ``s``, and the range of those f_k; None when there are none."""
        kind = self.structure.kinds.get(layer)
        pts = [(self.forward_ms[k], ms / self.forward_ms[k]) for (k, w, g), ms in self.cells.items()
               if (w, g) == s and self.structure.kinds.get(k) == kind and self.forward_ms.get(k, 0) > 0]
        if not pts:
            return None
        return statistics.median(r for _, r in pts), (min(f for f, _ in pts), max(f for f, _ in pts))

    def predict(self, c: ClientStep) -> StepPrediction:
        """``Ŝ = C + Σ_l t(l, s_l) + U(p)`` and the round; :class:`CannotPredict` naming the layer, state or
        feature where the fit cannot say."""
        if c.model and self.model and c.model != self.model:
            raise CannotPredict(f"cannot predict {c.artifact} ({c.model}) with a fit on "
                                f"{', '.join(self.fitted_on)} ({self.model}): another model; measure some of its "
                                f"own clients")
        per, by_kind, forward_only = {}, [], []
        for l, s in states(c, self.structure).items():
            if (l, *s) in self.cells:
                per[l] = self.cells[(l, *s)]
                continue
            if s == (0, 0):  # no gradient reaches it: its forward alone
                per[l] = self.frozen_forward_ms.get(l, self.forward_ms[l])
                forward_only.append(l)
                continue
            kind = self.structure.kinds.get(l, "?")
            found = self.kind_ratio(l, s)
            if found is None:
                raise CannotPredict(f"{c.artifact}: layer {l} ({kind}) is {state_text(s)} in its step, a state no "
                                    f"fitted client put it in, nor any layer of its kind; measure a client whose "
                                    f"step does")
            ratio, (lo, hi) = found
            f = self.forward_ms[l]
            if not lo * (1 - RANGE_SLACK) <= f <= hi * (1 + RANGE_SLACK):
                raise CannotPredict(f"{c.artifact}: layer {l} ({kind}) is {state_text(s)} in its step, a state no "
                                    f"fitted client put it in; its kind's layers measured so are {lo:.3g}-{hi:.3g} "
                                    f"ms forward and it is {f:.3g} ms: an extrapolation; measure a client whose "
                                    f"step trains it so")
            per[l] = f * ratio
            by_kind.append(l)
        lo, hi = self.update_range
        if not lo * (1 - RANGE_SLACK) <= c.trained_params <= hi * (1 + RANGE_SLACK):
            raise CannotPredict(f"{c.artifact}: it trains {c.trained_params:,} parameters, outside the fitted "
                                f"clients' {lo:,}-{hi:,} (±{RANGE_SLACK:.0%}): its update's cost would be an "
                                f"extrapolation; measure a client that trains about as many")
        step = self.fixed_ms + sum(per.values()) + self.update[0] + self.update[1] * c.trained_params
        return StepPrediction(c.artifact, step, self.round_factor * c.steps_per_round * step, per, tuple(by_kind),
                              tuple(forward_only))


def _update_fit(clients: Sequence[ClientStep]) -> tuple[float, float]:
    p = np.array([float(c.trained_params) for c in clients])
    u = np.array([c.update_ms() for c in clients])
    if len(np.unique(p)) < 2:
        return float(np.median(u)), 0.0
    slope, icpt = np.polyfit(p, u, 1)
    return float(icpt), float(slope)


def fit(clients: Sequence[ClientStep]) -> TrainCostModel:
    """Fit :class:`TrainCostModel` on the measured ``clients`` (one model's; their profiles must show one
    structure)."""
    measured = [c for c in clients if c.measured]
    if not measured:
        raise ConfigError("no measured client with profiled steps to fit a per-layer training model on (measure "
                          "the training format with [training_runner] profile_layers = true)")
    other = next((c for c in measured if c.model != measured[0].model), None)
    if other is not None:
        raise ConfigError(f"cannot fit one training model on clients of two models: {measured[0].artifact} "
                          f"({measured[0].model or 'model not stated'}) and {other.artifact} "
                          f"({other.model or 'model not stated'}); fit each model's clients apart")
    structure = _merged_structure(measured)
    per_state: dict[tuple[str, int, int], list[float]] = {}
    forward: dict[str, list[float]] = {}
    frozen: dict[str, list[float]] = {}
    for c in measured:
        ms = c.layer_ms()
        for l, s in states(c, structure).items():
            f, b = ms.get(l, (0.0, 0.0))
            per_state.setdefault((l, *s), []).append(f + b)
            forward.setdefault(l, []).append(f)
            if not s[0]:
                frozen.setdefault(l, []).append(f)
    cells = {k: statistics.median(v) for k, v in per_state.items()}
    fwd = {l: statistics.median(v) for l, v in forward.items()}
    u0, u1 = _update_fit(measured)
    fixed = statistics.median(
        c.step_ms - sum(cells[(l, *s)] for l, s in states(c, structure).items()) - u0 - u1 * c.trained_params
        for c in measured)
    ratios = [c.round_ms / (c.steps_per_round * c.step_ms) for c in measured
              if c.round_ms is not None and math.isfinite(c.round_ms) and c.step_ms > 0]
    params = [c.trained_params for c in measured]
    return TrainCostModel(structure, cells, fwd, {l: statistics.median(v) for l, v in frozen.items()}, (u0, u1), (min(params), max(params)), float(fixed),
                          statistics.median(ratios) if ratios else 1.0, tuple(c.artifact for c in measured),
                          measured[0].model)


def _merged_structure(measured: Sequence[ClientStep]) -> Structure:
    """One structure for the fit: the first client's order and kinds (every client of a model runs the same
    forward), the modules any client's profile placed."""
    first = measured[0].structure
    modules: dict[str, str] = {}
    kinds = dict(first.kinds)
    order = list(first.order)
    for c in measured:
        for l in c.structure.order:
            if l not in kinds:  # a layer the first client's profile did not show (none expected)
                order.append(l)
                kinds[l] = c.structure.kinds[l]
        for m, l in c.structure.modules.items():
            modules.setdefault(m, l)
    return Structure(tuple(order), kinds, modules)


# -- held-out error --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HeldOut:
    artifact: str
    measured_ms: float
    predicted_ms: float | None  # None: refused
    reason: str | None = None
    measured_round_ms: float | None = None
    predicted_round_ms: float | None = None

    @property
    def error(self) -> float:
        return math.nan if self.predicted_ms is None else self.predicted_ms / self.measured_ms - 1.0

    @property
    def round_error(self) -> float:
        if self.predicted_round_ms is None or not self.measured_round_ms:
            return math.nan
        return self.predicted_round_ms / self.measured_round_ms - 1.0


def held_out(train: Sequence[ClientStep], test: Sequence[ClientStep]) -> list[HeldOut]:
    """Fit on the measured ``train`` clients, predict the measured ``test`` clients (refusals kept, with why)."""
    model = fit(train)
    out = []
    for c in test:
        if not c.measured:
            continue
        try:
            p = model.predict(c)
        except CannotPredict as e:
            out.append(HeldOut(c.artifact, float(c.step_ms), None, str(e), c.round_ms))
            continue
        out.append(HeldOut(c.artifact, float(c.step_ms), p.step_ms, None, c.round_ms, p.round_ms))
    return out


def leave_one_out(clients: Sequence[ClientStep]) -> list[HeldOut]:
    """Each measured client predicted by a model fitted on the other measured clients (needs ≥ 2)."""
    measured = [c for c in clients if c.measured]
    if len(measured) < 2:
        return []
    return [h for c in measured for h in held_out([o for o in measured if o is not c], [c])]


def error_summary(held: Sequence[HeldOut]) -> dict[str, float]:
    """``n`` held out, ``refused`` of them, and over the predicted ones: the share within ±10 % (``within_10``),
    the worst |error| of the step (``worst``) and of the round (``worst_round``)."""
    errs = [abs(h.error) for h in held if h.predicted_ms is not None]
    rounds = [abs(h.round_error) for h in held if not math.isnan(h.round_error)]
    eps = 1e-12
    return {"n": len(held), "refused": sum(h.predicted_ms is None for h in held),
            "within_10": sum(e <= 0.10 + eps for e in errs) / len(errs) if errs else math.nan,
            "worst": max(errs) if errs else math.nan, "worst_round": max(rounds) if rounds else math.nan}


# -- from a campaign's store -----------------------------------------------------------------------------------
def store_clients(results_dir: str | Path, run_id: str, fmt: str = "torch-train", threads: int = 1,
                  allow_invalid: bool = False) -> dict[str, list[ClientStep]]:
    """Per device, every artifact of ``run_id`` the campaign at ``results_dir`` holds with a training step: the
    ones measured there in ``fmt`` at ``threads`` (VALID rows, or any with ``allow_invalid``) with their profiled
    steps (every repetition's), timed step p50 and round; the rest to predict."""
    from edgemask.profiling.store import ResultsStore
    from edgemask.profiling.training import training_costs

    path = Path(results_dir) / "results.sqlite"
    if not path.is_file():
        raise ConfigError(f"{path}: no results store; run `edgemask profile` first")
    with ResultsStore.open(path) as store:
        artifacts, profiles, runs, ops = (store.artifacts(), store.profiles(), store.profiled_runs(),
                                          store.operator_samples())
    manifests = {a: json.loads(m) for a, m in zip(artifacts["artifact"], artifacts["manifest"])}
    manifests = {a: m for a, m in manifests.items() if m.get("run_id") == run_id and m.get("training")}
    rows = training_costs(results_dir)
    rows = rows[(rows["run_id"] == run_id) & (rows["format"] == fmt) & (rows["threads"] == threads)]
    if not allow_invalid:
        rows = rows[rows["verdict"] == "VALID"]
    key = ["artifact", "format", "device", "threads"]
    avail = profiles[profiles["available"]] if not profiles.empty else profiles
    jobs = {tuple(k): set(g["job_id"]) for k, g in avail.groupby(key)} if not avail.empty else {}
    docs: dict[str, list[dict]] = {}
    for job, g in ops.groupby("job_id", sort=False) if not ops.empty else ():
        by_run: dict[int, list] = {}
        for run, name, op, us, phase in zip(*(g[c].tolist() for c in ("run", "name", "op_type", "us", "provider"))):
            by_run.setdefault(int(run), []).append([name, op, float(us), phase])
        e2e = runs[runs["job_id"] == job].set_index("run")["end_to_end_ms"].to_dict()
        docs[job] = [{"end_to_end_ms": e2e.get(r, math.nan), "ops": o} for r, o in sorted(by_run.items())]
    out: dict[str, list[ClientStep]] = {}
    for device, g in rows.groupby("device", sort=True):
        measured = {}
        for r in g.itertuples():
            js = jobs.get((r.artifact, fmt, device, int(threads)), set())
            prof = [run for j in sorted(js) for run in docs.get(j, [])]
            if r.artifact in manifests:
                measured[r.artifact] = client_step(manifests[r.artifact], {"available": bool(prof), "runs": prof},
                                                   float(r.step_p50_ms), float(r.local_round_ms))
        out[str(device)] = [measured.get(a) or client_step(m) for a, m in sorted(manifests.items())]
    return out


def held_out_lines(held: Sequence[HeldOut]) -> list[str]:
    """One line per held-out client: measured and predicted step (and round), the error, or why refused."""
    lines = []
    for h in held:
        if h.predicted_ms is None:
            lines.append(f"{h.artifact}: measured {h.measured_ms:.2f} ms; refused: {h.reason}")
            continue
        rnd = (f"; round {h.measured_round_ms:.0f} ms, predicted {h.predicted_round_ms:.0f} ms "
               f"({100 * h.round_error:+.1f} %)") if not math.isnan(h.round_error) else ""
        lines.append(f"{h.artifact}: measured {h.measured_ms:.2f} ms, predicted {h.predicted_ms:.2f} ms "
                     f"({100 * h.error:+.1f} %){rnd}")
    return lines


def predicted_table(model: TrainCostModel, clients: Iterable[ClientStep]) -> pd.DataFrame:
    """Per client: predicted step and round ms, the layers taken from their kind, or why refused."""
    rows = []
    for c in clients:
        try:
            p = model.predict(c)
            rows.append({"artifact": c.artifact, "measured": c.measured, "step_pred_ms": p.step_ms,
                         "round_pred_ms": p.round_ms, "by_kind": ",".join(p.by_kind), "refused": None})
        except CannotPredict as e:
            rows.append({"artifact": c.artifact, "measured": c.measured, "step_pred_ms": math.nan,
                         "round_pred_ms": math.nan, "by_kind": "", "refused": str(e)})
    return pd.DataFrame(rows)


# -- PerFedMask's budgets on the layer model -------------------------------------------------------------------
# At most this many rounds of "solve P^mask, predict each device's round on the layers it got, lower the budgets of
# the late ones": each round lowers every late device below the parameters of the layers it got, so a device is late
# at most once per layer group; past it, the late ones get 0.
MAX_BUDGET_ROUNDS = 50


def layer_budgets(steps: Mapping[str, int], boards: Mapping[str, str], models: Mapping[str, TrainCostModel],
                  groups: Mapping[str, Sequence[str]], sizes: Sequence[int], deadline_s: float, solve,
                  start: Mapping[str, float] | None = None) -> tuple[dict[str, dict], int]:
    """PerFedMask's ψ_n / d_w per device on the per-layer model: the budgets P^mask turns into layers (``solve``:
    budgets ψ_n -> the (N, J) masking vectors, ``trainer.algorithms.perfedmask.solve_pmask``'s, over the layer
    ``groups`` Λ of sizes |π_j|), each device's local round predicted on ITS layers by its board's model, and every
    device whose round misses ``deadline_s`` lowered just below the parameters of the layers it got, then P^mask
    solved again, until every round meets the deadline. Starts from ``start`` (default 1: the whole body). A device
    P^mask gives no layer trains nothing (round 0). Returns per device its record (board, fraction, steps, the
    layers it trains, the predicted round, whether it meets the deadline) and the rounds taken."""
    ids = list(steps)
    names = list(groups)
    d_w = float(sum(sizes))
    frac = {c: float((start or {}).get(c, 1.0)) for c in ids}
    smallest = min(s for s in sizes if s > 0)
    for rounds in range(1, MAX_BUDGET_ROUNDS + 1):
        m = solve([frac[c] * d_w for c in ids])
        out, late = {}, []
        for i, cid in enumerate(ids):
            chosen = [names[j] for j in range(len(names)) if m[i][j]]
            params = int(sum(sizes[j] for j in range(len(names)) if m[i][j]))
            round_ms = 0.0
            if chosen:
                model = models[boards[cid]]
                c = ClientStep(cid, tuple(t for g in chosen for t in groups[g]), params, int(steps[cid]), model.model)
                try:
                    round_ms = model.predict(c).round_ms
                except CannotPredict as e:
                    raise ConfigError(f"--cost-model layers: device {cid} on board {boards[cid]}, budget "
                                      f"{frac[cid]:.3f} of d_w, trains {', '.join(chosen)} (P^mask): {e}; or give "
                                      f"--cost-model line") from None
            out[cid] = {"board": boards[cid], "fraction": frac[cid], "steps_per_round": int(steps[cid]),
                        "layers": chosen, "predicted_round_s": round_ms / 1e3,
                        "meets_deadline": bool(round_ms <= deadline_s * 1e3)}
            if round_ms > deadline_s * 1e3:
                late.append(cid)
        if not late:
            return out, rounds
        for cid in late:  # below what its layers hold, by the smallest group: P^mask must leave one of them out.
            # Half a parameter above that whole count, so that f · d_w, read back from the written fraction in
            # floating point, still holds it (272 / 1584 · 1584 is 271.99999999999997)
            held = sum(sizes[names.index(g)] for g in out[cid]["layers"])
            frac[cid] = max(0.0, (held - smallest + 0.5) / d_w)
    for cid in late:  # still late after MAX_BUDGET_ROUNDS: it trains nothing
        out[cid] = {**out[cid], "fraction": 0.0, "layers": [], "predicted_round_s": 0.0, "meets_deadline": True}
    return out, MAX_BUDGET_ROUNDS


def model_record(model: TrainCostModel) -> dict:
    """A fitted model as plain data (TOML-able) for ``budget_source``: its cells by layer and state, the update's
    line, the fixed cost, the round factor and the clients it was fitted on."""
    return {"cells_ms": {f"{l} {state_text((w, g))}": float(ms) for (l, w, g), ms in sorted(model.cells.items())},
            "update_ms": [float(model.update[0]), float(model.update[1])], "fixed_ms": float(model.fixed_ms),
            "round_factor": float(model.round_factor), "fitted_on": list(model.fitted_on)}
