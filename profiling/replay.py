"""Time- and energy-to-accuracy: replay a run's history round by round under a device trace's measured costs.

FedScale's cost model (Lai et al., ICML 2022; ``fedscale/cloud/internal/client_metadata.py``,
``get_completion_time``), per sampled client c of round r:

    compute_c = augmentation × samples_c × computation_ms ÷ 1000          (s; FedScale: 3 × batch × local steps ×
                                                                           ms per sample, "backward-pass takes
                                                                           around 2x the latency")
    comm_c    = (bytes_up_c + bytes_down_c) × 8 ÷ 1000 ÷ bandwidth_kbps    (s; FedScale: (upload + download) ÷
                                                                           bandwidth, both in kbit)
    round_r   = max_c (compute_c + comm_c)                                  (a round ends with its slowest client)
    energy_r  = Σ_c augmentation × samples_c × train_energy_mj ÷ 1000       (J, the sampled devices' compute only)

Where the trace holds the client's **measured local round** (issue #39: ``local_round_ms``, the median whole round
of its local step timed on the board, over ``round_samples`` = num_train × epochs training samples) that replaces
FedScale's assumption, scaled to the round's samples (a round that processed the client's full data every epoch
costs exactly the measured round):

    compute_c = local_round_ms × samples_c ÷ round_samples ÷ 1000
    energy_c  = step_energy_mj × steps_per_round × samples_c ÷ round_samples ÷ 1000   (NaN without a power sensor)

and the output lists which clients used it (with its format and verdict) and which fell back to the 3× assumption
(``ReplaySettings.measured_rounds = False``, ``edgemask replay --assume-3x``: every client falls back).

``samples_c`` is what the client's local training processed in that round (the history's ``samples_seen``:
batch × local steps, every epoch counted, the last partial batch as it is). The time and energy to a target
accuracy are the sums through the first evaluated round whose ``mean_accuracy`` reaches it.

Assumptions (each stated in the output, :func:`assumptions`): clients train in parallel and the server waits for
all of them (no over-commitment, no stragglers dropped, no availability trace) — except in a run trained with
``[system]`` (deadlines, over-commitment: :mod:`edgemask.trainer.system`), whose history's ``round_time_s`` times
its rounds instead (:func:`replay_rounds`); aggregation and evaluation take no
time; a training sample costs ``augmentation`` × one batch-1 inference (FedScale's factor; batching would make it
cheaper per sample); communication costs no device energy (not measured); the bandwidth is the same for every
client and assumed.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgemask import values
from edgemask.errors import ConfigError, CorruptFileError
from edgemask.workspace import check_name
from edgemask.profiling.provenance import RunIdentity, check_same, finite_column, from_run_dir, read_checked
from edgemask.profiling.trace import read_trace

# FedScale's augmentation_factor: "backward-pass takes around 2x the latency, so we multiple it by 3x".
AUGMENTATION = 3.0


@dataclass(frozen=True)
class ReplaySettings:
    """``bandwidth_kbps``: None takes the trace's own (assumed when it was written); ``target``: None takes the
    highest mean accuracy every replayed run reaches."""

    bandwidth_kbps: float | None = None
    target: float | None = None
    augmentation: float = AUGMENTATION
    metric: str = "mean_accuracy"  # the server-side history metric the target applies to
    # use a client's measured local round where the trace has one (False: FedScale's 3× assumption for everyone)
    measured_rounds: bool = True


@dataclass
class RunReplay:
    run_id: str
    algorithm: str
    rounds: pd.DataFrame  # one row per round: round, clients, slowest, compute_s, comm_s, round_s, energy_j, ...
    train_artifacts: list[str] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)
    # clients whose compute cost is their measured local round: client -> (source, verdict), e.g.
    # ("torch-train measured", "VALID"); and the clients that fell back to the 3× assumption
    measured: dict[str, tuple[str, str]] = field(default_factory=dict)
    fallback: list[str] = field(default_factory=list)
    # clients whose trace row held another run's measured local round (dropped: they fell back), -> that artifact
    foreign: dict[str, str] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)  # the run's files read or checked -> sha256

    def to_target(self, target: float) -> dict[str, float]:
        """Rounds, seconds and joules through the first evaluated round reaching ``target`` (NaN when none)."""
        hit = self.rounds[self.rounds["accuracy"] >= target - 1e-12]
        if hit.empty:
            return {"rounds": math.nan, "time_s": math.nan, "energy_j": math.nan}
        r = hit.iloc[0]
        return {"rounds": int(r["round"]) + 1, "time_s": float(r["cum_time_s"]), "energy_j": float(r["cum_energy_j"])}


def measured_clients(costs: pd.DataFrame, measured_rounds: bool = True) -> pd.Series:
    """Per client of ``costs`` (index ``client_id``): whether its compute cost is its measured local round (a
    trace row with ``local_round_ms`` and ``round_samples`` > 0), else False: FedScale's 3× assumption."""
    cost = costs.set_index("client_id")
    if not measured_rounds or "local_round_ms" not in cost.columns or "round_samples" not in cost.columns:
        return pd.Series(False, index=cost.index)
    lr = pd.to_numeric(cost["local_round_ms"], errors="coerce")
    rs = pd.to_numeric(cost["round_samples"], errors="coerce")
    return lr.notna() & (rs > 0)


def replay_rounds(history: pd.DataFrame, costs: pd.DataFrame, bandwidth_kbps: float,
                  augmentation: float = AUGMENTATION, run_id: str = "?", metric: str = "mean_accuracy",
                  measured_rounds: bool = True) -> pd.DataFrame:
    """The cost of every round of ``history`` (long format) under ``costs`` (one row per client: ``client_id``,
    ``computation_ms``, ``train_energy_mj``; optionally its measured ``local_round_ms``, ``round_samples``,
    ``steps_per_round``, ``step_energy_mj``, used where present unless ``measured_rounds`` is False), with the
    cumulative time and energy and the round's accuracy: the server's ``metric`` row (``mean_accuracy``: the
    clients' mean personalized accuracy; NaN in rounds not evaluated). ``measured`` counts the round's clients
    that were costed by their measured round."""
    if not (bandwidth_kbps > 0 and math.isfinite(bandwidth_kbps)):
        raise ConfigError(f"bandwidth {bandwidth_kbps!r} kbit/s: expected a positive number")
    wide = history[history["client"] != "server"].pivot_table(
        index=["round", "client"], columns="metric", values="value", aggfunc="sum")
    if "samples_seen" not in wide.columns:
        raise CorruptFileError(f"run {run_id}: history.parquet has no samples_seen rows (recorded since "
                               f"issue 29): retrain the run to replay it")
    wide = wide[wide["samples_seen"].notna()].reset_index()
    cost = costs.set_index("client_id")
    has_round = measured_clients(costs, measured_rounds)
    costed = set(cost.index[cost["computation_ms"].notna()]) | set(has_round.index[has_round])
    missing = sorted(set(wide["client"]) - costed)
    if missing:
        raise ConfigError(f"run {run_id}: the trace has no measured training cost for client(s) "
                          f"{', '.join(missing[:5])}; profile the run's dense artifact on the trace's device")
    at = lambda col: (pd.to_numeric(cost.loc[wide["client"], col], errors="coerce").to_numpy(dtype=float)  # noqa: E731
                      if col in cost.columns else np.full(len(wide), np.nan))
    samples = wide["samples_seen"].to_numpy(dtype=float)
    use = has_round.loc[wide["client"]].to_numpy(dtype=bool)
    share = samples / np.where(use, at("round_samples"), 1.0)  # the part of the measured round this round ran
    assumed_s = augmentation * samples * at("computation_ms") / 1e3
    assumed_j = augmentation * samples * at("train_energy_mj") / 1e3
    wide["compute_s"] = np.where(use, at("local_round_ms") * share / 1e3, assumed_s)
    wide["comm_s"] = (wide["bytes_up"] + wide["bytes_down"]) * 8 / 1e3 / bandwidth_kbps
    wide["client_s"] = wide["compute_s"] + wide["comm_s"]
    wide["energy_j"] = np.where(use, at("step_energy_mj") * at("steps_per_round") * share / 1e3, assumed_j)
    wide["measured"] = use
    rows = []
    for rnd, g in wide.groupby("round", sort=True):
        slow = g.loc[g["client_s"].idxmax()]
        rows.append({"round": int(rnd), "clients": len(g), "measured": int(g["measured"].sum()),
                     "slowest": slow["client"], "compute_s": float(slow["compute_s"]),
                     "comm_s": float(slow["comm_s"]), "round_s": float(slow["client_s"]),
                     "energy_j": float(g["energy_j"].sum(min_count=len(g)))})
    out = pd.DataFrame(rows)
    server = history[history["client"] == "server"]
    in_loop = server[server["metric"] == "round_time_s"]  # a run trained with [system] (trainer/system.py)
    if not in_loop.empty:  # its own round times, deadlines and drops included, not derived again (issue #46)
        out["derived_round_s"] = out["round_s"]
        out["round_s"] = out["round"].map(dict(zip(in_loop["round"].astype(int), in_loop["value"].astype(float))))
        if out["round_s"].isna().any() or not np.isfinite(out["round_s"]).all():
            raise CorruptFileError(f"run {run_id}: history.parquet's round_time_s rows do not cover every round "
                                   f"with a finite time; retrain the run")
    out["cum_time_s"] = out["round_s"].cumsum()
    out["cum_energy_j"] = out["energy_j"].cumsum()
    acc = server[server["metric"] == metric]
    if acc.empty:
        raise ConfigError(f"run {run_id}: history.parquet has no server metric {metric!r}; it has "
                          f"{', '.join(sorted(server['metric'].unique())) or 'none'}")
    out["accuracy"] = out["round"].map(dict(zip(acc["round"].astype(int), acc["value"].astype(float))))
    return out


def replay_run(workspace: str | Path, run_id: str, trace: pd.DataFrame, bandwidth_kbps: float,
               augmentation: float = AUGMENTATION, metric: str = "mean_accuracy",
               measured_rounds: bool = True, meta: Mapping[str, Any] | None = None,
               trace_dir: str | Path = "trace") -> RunReplay:
    """Replay run ``run_id`` of the workspace under the ``trace`` rows of that run. Its ``history.parquet`` and
    ``summary.json`` are read checked against its ``digests.json``; with the trace's ``meta`` (``trace.json``),
    the run must be the one the trace's costs are of (issue #44: its ``runs`` record, :func:`check_run`)."""
    run_dir = Path(workspace) / "runs" / check_name(run_id, "--run")
    path = run_dir / "history.parquet"
    if not path.is_file():
        raise CorruptFileError(f"{path}: missing; train the run first (or name a run under {run_dir.parent})")
    costs = trace[trace["run_id"] == run_id]
    if costs.empty:
        raise ConfigError(f"run {run_id}: not in the trace (it has {', '.join(sorted(trace['run_id'].unique()))}); "
                          f"profile its artifacts on this device and rerun `edgemask report`")
    history_bytes = read_checked(run_dir, "history.parquet")
    history = pd.read_parquet(io.BytesIO(history_bytes))
    try:
        summary = json.loads(read_checked(run_dir, "summary.json"))
    except ValueError as e:
        raise CorruptFileError(f"{run_dir / 'summary.json'}: unreadable ({e}); re-train the run") from None
    identity = from_run_dir(run_dir, summary)
    if meta is not None:
        check_run(identity, meta, run_id, trace_dir)
    costs, foreign = own_rows(costs, run_id, Path(trace_dir) / "trace.parquet")
    algorithm = summary.get("algorithm") if isinstance(summary, dict) else None
    check_history(history, path, metric)
    rounds = replay_rounds(history, costs, bandwidth_kbps, augmentation, run_id, metric, measured_rounds)
    out = run_replay(run_id, algorithm or str(costs["algorithm"].iloc[0]), rounds, costs, history, measured_rounds)
    out.foreign = foreign
    out.inputs = {**(identity.sha256 if identity is not None else {}),
                  "history.parquet": hashlib.sha256(history_bytes).hexdigest()}
    return out


def check_run(run: RunIdentity | None, meta: Mapping[str, Any], run_id: str, trace_dir: str | Path) -> None:
    """The run a replay reads must be the one the trace's costs were measured for: ``trace.json``'s ``runs``
    record of it (the manifests' model, data set and parameters, and the run's digests as the campaign and the
    report found them) against the run directory now; one line naming both where they part."""
    where = f"{Path(trace_dir) / 'trace.json'}"
    record = (meta.get("runs") or {}).get(run_id) if isinstance(meta.get("runs"), dict) else None
    if record is None:
        raise ConfigError(f"{where}: records no provenance of run {run_id} (a trace written before issue #44), so "
                          f"it cannot say the costs are of this run's model; rerun `edgemask report` on its campaign")
    traced = RunIdentity.from_dict(record, where)
    if not traced.known:
        raise ConfigError(f"{where}: records neither the model nor the digests of run {run_id}, so it cannot say "
                          f"the costs are of this run's model; rerun `edgemask report` on its campaign")
    assert run is not None
    check_same(run, traced, f"replay a run under a trace of its own artifacts (export it, measure it, rerun "
                            f"`edgemask report`)")


def own_rows(costs: pd.DataFrame, run_id: str, where: Path) -> tuple[pd.DataFrame, dict[str, str]]:
    """``costs`` with every cost taken from an artifact of ``run_id`` only: a measured local round from another
    run's artifact is dropped (that client falls back to the 3× assumption, said in the output: the returned
    client -> artifact); an inference cost from another run's artifact is refused naming the file and field."""
    prefix = f"{run_id}/"
    foreign = {}
    if "train_round_artifact" in costs.columns:
        other = costs["train_round_artifact"].notna() & ~costs["train_round_artifact"].astype(str).str.startswith(
            prefix)
        if other.any():
            foreign = dict(zip(costs.loc[other, "client_id"], costs.loc[other, "train_round_artifact"]))
            costs = costs.copy()
            costs.loc[other, [c for c in ("local_round_ms", "round_samples", "step_energy_mj") if c in costs]] = \
                math.nan
            costs.loc[other, "local_round_source"] = None
    if "train_artifact" in costs.columns:
        bad = costs["train_artifact"].notna() & ~costs["train_artifact"].astype(str).str.startswith(prefix)
        if bad.any():
            r = costs[bad].iloc[0]
            raise CorruptFileError(f"{where}: field train_artifact is {r['train_artifact']!r} for client "
                                   f"{r['client_id']} of run {run_id}: another run's model; rerun `edgemask report`")
    return costs, foreign


def check_history(history: pd.DataFrame, path: Path, metric: str) -> None:
    """The history numbers a replay computes with (samples, bytes, the target's metric) must be finite."""
    used = history[history["metric"].isin(["samples_seen", "bytes_up", "bytes_down", metric])]
    finite_column(used, "value", str(path), lambda r: f"metric {r['metric']} of {r['client']} in round {r['round']}",
                  missing_ok=False, fix="re-train the run")


def run_replay(run_id: str, algorithm: str, rounds: pd.DataFrame, costs: pd.DataFrame, history: pd.DataFrame,
               measured_rounds: bool = True) -> RunReplay:
    """A :class:`RunReplay` of ``rounds`` (:func:`replay_rounds`), naming the artifacts and verdicts the costs rest
    on and, among the clients that trained in ``history``, those costed by their measured local round and those
    that fell back to the 3× assumption."""
    trained = set(history.loc[(history["client"] != "server") & (history["metric"] == "samples_seen"), "client"])
    use = measured_clients(costs, measured_rounds)
    cost = costs.set_index("client_id")
    col = lambda c, name, default: str(cost.at[c, name]) if name in cost.columns else default  # noqa: E731
    measured = {c: (col(c, "local_round_source", "measured"), col(c, "train_round_verdict", "?"))
                for c in sorted(trained) if c in use.index and use[c]}
    fallback = sorted(c for c in trained if c not in measured)
    fell = costs[costs["client_id"].isin(fallback)]
    artifacts = dict(zip(fell["train_artifact"], fell["train_verdict"]))
    if measured and {"train_round_artifact", "train_round_verdict"} <= set(costs.columns):
        got = costs[costs["client_id"].isin(list(measured))]
        artifacts.update(zip(got["train_round_artifact"], got["train_round_verdict"]))
    artifacts = {a: v for a, v in artifacts.items() if isinstance(a, str)}
    return RunReplay(run_id, algorithm, rounds, sorted(artifacts), [artifacts[a] for a in sorted(artifacts)],
                     measured, fallback)


def replay(workspace: str | Path, run_ids: list[str], trace_dir: str | Path,
           settings: ReplaySettings = ReplaySettings()) -> tuple[list[RunReplay], float, dict, float]:
    """Replay each run under the trace; return the replays, the target, the trace's metadata and the bandwidth."""
    if settings.target is not None:  # before any file is read: 95 for 95 % is a mistake, not a target
        values.fraction("--target", settings.target)
    trace, meta = read_trace(trace_dir)
    bandwidth = settings.bandwidth_kbps if settings.bandwidth_kbps is not None else float(meta["bandwidth_kbps"])
    runs = [replay_run(workspace, r, trace, bandwidth, settings.augmentation, settings.metric,
                       settings.measured_rounds, meta, trace_dir) for r in run_ids]
    target = settings.target
    if target is None:
        target = min(float(r.rounds["accuracy"].max()) for r in runs)
    return runs, target, meta, bandwidth


def pct(fraction: float) -> str:
    """``fraction`` as a percentage with the digits it needs (0.8 -> "80.0", 0.9999 -> "99.99"), never rounded up
    to a target it is not (0.9999 is not "100.0")."""
    x = 100 * fraction
    for digits in range(1, 5):
        text = f"{x:.{digits}f}"
        if abs(float(text) - x) < 1e-9:
            return text
    return f"{x:.4f}"


def unreached_lines(runs: list[RunReplay], target: float, metric: str = "mean_accuracy") -> list[str]:
    """One sentence where a run never reaches ``target`` (its time and energy to it are then "—"): the target and
    each such run's best ``metric`` and the round it came in."""
    missed = [r for r in runs if math.isnan(r.to_target(target)["rounds"])]
    if not missed:
        return []

    def best(r: RunReplay) -> str:
        acc = r.rounds["accuracy"]
        if acc.notna().sum() == 0:
            return f"{r.run_id} never evaluated"
        i = acc.idxmax()
        return f"{r.run_id} {pct(float(acc[i]))} % (round {int(r.rounds.at[i, 'round']) + 1})"

    if len(missed) == len(runs):
        head = f"no run reached {pct(target)} % {metric}: every time and energy to it is —"
    else:
        head = (f"{', '.join(r.run_id for r in missed)} did not reach {pct(target)} % {metric}: "
                f"{'its' if len(missed) == 1 else 'their'} time and energy to it are —")
    return [f"{head}; best {metric} reached: {'; '.join(best(r) for r in missed)}"]


def assumptions(meta: dict, bandwidth_kbps: float, bandwidth_given: bool, augmentation: float,
                runs: list[RunReplay]) -> list[str]:
    """Every assumption the replay's numbers rest on, one line each."""
    invalid = sorted({a for r in runs for a, v in zip(r.train_artifacts, r.verdicts) if v != "VALID"})
    lines = [
        (f"device {meta['device']}, {meta['format']}/{meta['variant']}, {meta['threads']} thread(s): every client "
         f"is this device"),
        *measured_lines(runs, augmentation),
        ("computation where no local round was measured (the 3× assumption): " if any(r.measured for r in runs)
         else "computation: ")
        + f"the measured p50 of one batch-1 inference of the model trained ({meta['train_model']}: "
        + ("the run's dense artifact, since masks are trained over the whole network" if meta["train_model"] == "dense"
           else "the client's compacted model, a trainer that removed dead units") + ")"
        + f", × {augmentation:g} per training sample (FedScale: backward ≈ 2 × forward)",
        f"communication: bytes up + down ÷ {bandwidth_kbps:,.0f} kbit/s per client ("
        + ("given" if bandwidth_given else "the trace's") + ", assumed, not measured); it costs no device energy",
        "a round ends with its slowest client; clients train in parallel; aggregation and evaluation take no time",
        "energy: the sampled devices' whole-board energy per inference × the training samples"
        + (" (measured rounds: energy per step × the round's steps)" if any(r.measured for r in runs) else "") + "; "
        + ("missing (no power sensor measured it)" if all(r.rounds["energy_j"].isna().all() for r in runs) else
           "the sum over a round's clients"),
    ]
    if invalid:
        lines.append(f"the training cost rests on INVALID settings ({', '.join(invalid)}): not numbers to quote")
    lines.append(inputs_line(meta, runs))
    return lines


def inputs_line(meta: Mapping[str, Any], runs: list[RunReplay]) -> str:
    """What the numbers were computed from, by digest: the trace's file and each run's files, checked to be the
    run the trace's costs are of."""
    trace = (meta.get("files") or {}).get("trace.parquet", "")
    parts = [f"trace.parquet {trace[:12]}…"]
    for r in runs:
        files = ", ".join(f"{k} {v[:12]}…" for k, v in sorted(r.inputs.items()))
        parts.append(f"run {r.run_id}: {files}")
    return ("inputs (sha256): " + "; ".join(parts)
            + " — each run checked against the trace's record of the run its costs were measured for")


LIST_AT_MOST = 40  # client names printed per line; the rest are counted


def _names(clients: list[str]) -> str:
    shown = ", ".join(clients[:LIST_AT_MOST])
    return shown + (f" and {len(clients) - LIST_AT_MOST} more" if len(clients) > LIST_AT_MOST else "")


def measured_lines(runs: list[RunReplay], augmentation: float = AUGMENTATION) -> list[str]:
    """Per run: which clients' compute is their measured local round (with its source and verdict) and which fell
    back to FedScale's 3× assumption; a run trained with deadlines ([system]) times its rounds by its own history."""
    lines = [f"run {r.run_id}: time is the run's own round_time_s ([system] in its config: its boards' steps, deadline "
             f"and drops; the trace's derived time would be {r.rounds['derived_round_s'].sum():.2f} s for the same "
             f"rounds); energy from the trace" for r in runs if "derived_round_s" in r.rounds.columns]
    for r in runs:
        if r.measured:
            by = {}
            for c, (source, verdict) in r.measured.items():
                by.setdefault((source, verdict), []).append(c)
            which = "; ".join(f"{_names(cs)} ({source}, {verdict})" for (source, verdict), cs in sorted(by.items()))
            lines.append(f"run {r.run_id}: measured local round for {len(r.measured)} client(s), scaled by the "
                         f"round's samples_seen ÷ the samples it measured (num_train × epochs): {which}")
        if r.foreign:
            lines.append(f"run {r.run_id}: the trace held a local round measured from another run's artifact for "
                         f"{_names(sorted(r.foreign))} ({', '.join(sorted(set(r.foreign.values()))[:3])}): not "
                         f"used, {'it falls' if len(r.foreign) == 1 else 'they fall'} back below")
        if r.fallback:
            lines.append(f"run {r.run_id}: {len(r.fallback)} client(s) fell back to the {augmentation:g}× "
                         f"assumption (no measured local round used on this device and threads): "
                         f"{_names(r.fallback)}")
        else:
            lines.append(f"run {r.run_id}: no client fell back to the {augmentation:g}× assumption")
    return lines


def _fmt(x: float, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def replay_table(runs: list[RunReplay], target: float) -> str:
    """Per run: rounds, seconds and joules to ``target``, and over all rounds, as plain text."""
    head = ("algorithm", "run", f"rounds to {pct(target)} %", "time to target (s)", "energy to target (J)",
            "final acc", "all rounds (s)", "all rounds (J)")
    rows = [head]
    for r in runs:
        t = r.to_target(target)
        final = r.rounds["accuracy"].dropna()
        rows.append((r.algorithm, r.run_id, _fmt(t["rounds"], ".0f"), _fmt(t["time_s"], ".2f"),
                     _fmt(t["energy_j"], ".2f"), _fmt(float(final.iloc[-1]) if len(final) else math.nan, ".4f"),
                     _fmt(float(r.rounds["cum_time_s"].iloc[-1]), ".2f"),
                     _fmt(float(r.rounds["cum_energy_j"].iloc[-1]), ".2f")))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(head))]
    text = ["  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
            for row in rows]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def replay_report(workspace: str | Path, run_ids: list[str], trace_dir: str | Path,
                  settings: ReplaySettings = ReplaySettings()) -> str:
    """The ``edgemask replay`` output: the table, then every assumption."""
    runs, target, meta, bandwidth = replay(workspace, run_ids, trace_dir, settings)
    lines = assumptions(meta, bandwidth, settings.bandwidth_kbps is not None, settings.augmentation, runs)
    why = "given" if settings.target is not None else f"the highest {settings.metric} every run reaches"
    measured = any(r.measured for r in runs)
    model = ("FedScale's cost model, computation from the measured local rounds (see the assumptions)" if measured
             else "FedScale's cost model")
    return "\n".join([(f"time and energy to {pct(target)} % {settings.metric} ({why}), {model}:"),
                      replay_table(runs, target), *unreached_lines(runs, target, settings.metric), "",
                      "assumptions:", *(f"  - {a}" for a in lines)])


def one_line(workspace: str | Path, run_ids: list[str], trace_dir: str | Path,
             settings: ReplaySettings = ReplaySettings()) -> str:
    """One sentence for a summary: each run's time (and energy, where measured) to the target."""
    runs, target, meta, bandwidth = replay(workspace, run_ids, trace_dir, settings)
    parts = []
    for r in runs:
        t = r.to_target(target)
        e = "" if math.isnan(t["energy_j"]) else f", {t['energy_j']:.2f} J"
        parts.append(f"{r.algorithm} {_fmt(t['time_s'], '.2f')} s ({_fmt(t['rounds'], '.0f')} rounds{e})")
    measured = sum(len(r.measured) for r in runs)
    fallback = sum(len(r.fallback) for r in runs)
    compute = (f"computation: {measured} client(s)' measured local rounds"
               + (f", {fallback} on FedScale's 3× assumption" if fallback else "")
               if measured else "computation: FedScale's 3× assumption")
    return (f"replayed on {meta['device']} ({meta['format']}, {meta['threads']} thread(s), {bandwidth / 1000:g} "
            f"Mbit/s assumed, {compute}; `edgemask replay` states every assumption): time to "
            f"{pct(target)} % mean accuracy: " + "; ".join(parts)
            + "".join(f"; {line}" for line in unreached_lines(runs, target)))
