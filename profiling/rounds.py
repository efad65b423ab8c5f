"""A run's own rounds: what a run trained with ``[system]`` (rounds with deadlines, :mod:`edgemask.trainer.system`,
issue #46) recorded of each round as it trained, read back for ``edgemask report`` instead of derived again.

Such a run's ``history.parquet`` holds, per round on ``server``, ``round_time_s`` (the round's wall-clock in the
loop: the K-th finisher's time, the last one's, or the deadline), ``devices_selected``, ``devices_dropped`` (and
``devices_offline`` with an availability trace), and per selected device ``dropped`` (1: its update was not
aggregated); ``summary.json``'s ``system`` holds the section as trained and each device's board
(``device_boards``). :func:`read_rounds` reads both, checked against the run's ``digests.json``
(:func:`edgemask.profiling.provenance.read_checked`); a run without ``[system]`` gives None, so a report of it is
what it was.

The time to an accuracy is the sum of ``round_time_s`` through the first round whose ``mean_accuracy`` reaches it
(rounds of training only: accuracy after fine-tuning is recorded one round past the last, with no round time).
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from edgemask.errors import CorruptFileError
from edgemask.workspace import check_name
from edgemask.profiling.provenance import DIGESTS, finite_column, read_checked

SERVER_METRICS = ("round_time_s", "devices_selected", "devices_dropped", "devices_offline")
_RETRAIN = "re-train the run (`edgemask train`)"


@dataclass
class RunRounds:
    """One run's rounds as it trained them. ``rounds``: one row per training round (``round``, ``round_time_s``,
    ``cum_time_s``, ``selected``, ``dropped``, ``offline`` (NaN without an availability trace), ``accuracy``: the
    server's ``mean_accuracy``, NaN where not evaluated); ``boards``: one row per board (``board``, ``devices``,
    ``updates``: selections of its devices, ``dropped``, ``offline``)."""

    run_id: str
    algorithm: str
    system: dict[str, Any]  # summary.json's "system": the section as trained, K, each device's board
    rounds: pd.DataFrame
    boards: pd.DataFrame
    inputs: dict[str, str] = field(default_factory=dict)  # the run's files read -> sha256

    @property
    def total_s(self) -> float:
        return float(self.rounds["round_time_s"].sum())

    @property
    def availability(self) -> bool:
        """Whether devices came and went (an availability trace): offline counts are recorded."""
        return bool(self.rounds["offline"].notna().any())

    def to_target(self, target: float) -> dict[str, float]:
        """Rounds and in-loop seconds through the first evaluated round reaching ``target`` (NaN when none)."""
        hit = self.rounds[self.rounds["accuracy"] >= target - 1e-12]
        if hit.empty:
            return {"rounds": math.nan, "time_s": math.nan}
        r = hit.iloc[0]
        return {"rounds": int(r["round"]) + 1, "time_s": float(r["cum_time_s"])}

    def mix_text(self) -> str:
        """The device mix in words: the boards and their shares, or the FedScale trace by file and digest."""
        trace = self.system.get("trace")
        if isinstance(trace, dict):
            parts = [f"FedScale trace {Path(str(trace.get('capacity', '?'))).name} "
                     f"(sha256 {str(trace.get('capacity_sha256', ''))[:12]}…)"]
            if trace.get("availability"):
                parts.append(f"availability {Path(str(trace['availability'])).name} "
                             f"(sha256 {str(trace.get('availability_sha256', ''))[:12]}…)")
            return ", ".join(parts)
        boards = self.system.get("boards") or {}
        return ", ".join(f"{name} {100 * float(b.get('share', math.nan)):g} % ({float(b.get('step_ms', math.nan)):g} "
                         f"ms a step)" for name, b in boards.items()) or "?"


def read_rounds(workspace: str | Path, run_id: str) -> RunRounds | None:
    """Run ``run_id``'s own rounds (module docstring), or None where it was trained without ``[system]`` (or has
    no ``summary.json``). Its files are read checked against its ``digests.json``; a history without a finite
    ``round_time_s`` for every training round is refused in one line naming the file and the row."""
    run_dir = Path(workspace) / "runs" / check_name(run_id, "run id in the results")
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    raw = read_checked(run_dir, "summary.json") if (run_dir / DIGESTS).is_file() else path.read_bytes()
    try:
        summary = json.loads(raw)
    except ValueError as e:
        raise CorruptFileError(f"{path}: unreadable ({e}); {_RETRAIN}") from None
    system = summary.get("system") if isinstance(summary, dict) else None
    if system is None:
        return None
    where = run_dir / "history.parquet"
    if not isinstance(system, dict) or not isinstance(system.get("device_boards"), dict):
        raise CorruptFileError(f"{path}: field system is no table with device_boards; {_RETRAIN}")
    history_bytes = read_checked(run_dir, "history.parquet")
    history = pd.read_parquet(io.BytesIO(history_bytes))
    rounds = _rounds(history, where, int(summary.get("rounds", 0) or 0))
    boards = _boards(history, system["device_boards"], where)
    inputs = {"summary.json": hashlib.sha256(raw).hexdigest(),
              "history.parquet": hashlib.sha256(history_bytes).hexdigest()}
    return RunRounds(run_id, str(summary.get("algorithm") or "?"), system, rounds, boards, inputs)


def _rounds(history: pd.DataFrame, where: Path, trained: int) -> pd.DataFrame:
    server = history[history["client"] == "server"]
    timed = server[server["metric"].isin(SERVER_METRICS)]
    finite_column(timed, "value", str(where), lambda r: f"metric {r['metric']} of round {r['round']}",
                  missing_ok=False, nonnegative=True, fix=_RETRAIN)
    wide = timed.pivot_table(index="round", columns="metric", values="value", aggfunc="first")
    expected = set(range(trained)) if trained else set(wide.index)
    if "round_time_s" not in wide.columns or set(wide["round_time_s"].dropna().index) != expected:
        have = sorted(wide["round_time_s"].dropna().index) if "round_time_s" in wide.columns else []
        raise CorruptFileError(f"{where}: field round_time_s does not cover every training round ({len(have)} of "
                               f"{len(expected)}); {_RETRAIN}")
    acc = server[server["metric"] == "mean_accuracy"]
    out = pd.DataFrame({"round": sorted(expected)})
    col = lambda name: out["round"].map(wide[name]) if name in wide.columns else math.nan  # noqa: E731
    out["round_time_s"] = col("round_time_s").astype(float)
    out["cum_time_s"] = out["round_time_s"].cumsum()
    out["selected"], out["dropped"], out["offline"] = col("devices_selected"), col("devices_dropped"), \
        col("devices_offline")
    out["accuracy"] = out["round"].map(dict(zip(acc["round"].astype(int), acc["value"].astype(float))))
    return out


def _boards(history: pd.DataFrame, device_boards: dict[str, str], where: Path) -> pd.DataFrame:
    rows = history[(history["client"] != "server") & history["metric"].isin(["dropped", "offline"])]
    finite_column(rows, "value", str(where), lambda r: f"metric {r['metric']} of {r['client']} in round {r['round']}",
                  missing_ok=False, nonnegative=True, fix=_RETRAIN)
    unknown = sorted(set(rows["client"]) - set(device_boards))
    if unknown:
        raise CorruptFileError(f"{where}: device {unknown[0]} has dropped rows but no board in summary.json's "
                               f"system.device_boards; {_RETRAIN}")
    rows = rows.assign(board=rows["client"].map(device_boards))
    dropped = rows[rows["metric"] == "dropped"].groupby("board")["value"]
    offline = rows[rows["metric"] == "offline"].groupby("board")["value"].sum()
    devices = pd.Series(device_boards).value_counts()
    out = pd.DataFrame({"board": sorted(devices.index)})
    out["devices"] = out["board"].map(devices).astype(int)
    out["updates"] = out["board"].map(dropped.size()).fillna(0).astype(int)
    out["dropped"] = out["board"].map(dropped.sum()).fillna(0).astype(int)
    out["offline"] = out["board"].map(offline).fillna(0.0).astype(int) if len(offline) else math.nan
    return out
