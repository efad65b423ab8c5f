"""Provenance of derived numbers (issue #44): what a budget, a replay, a report and a prediction rest on, recorded
by digest, and the check that those inputs belong together before anything is computed.

A :class:`RunIdentity` names one trained model as one place states it: the run id, the architecture and data set,
the dense model's parameter count, and where known the sha256 of the run's files (``digests.json`` itself, which
vouches for every file of the run, and the ``config.toml`` and ``model.safetensors`` it lists). Places that state
one:

- a run directory ``runs/<id>/`` (:func:`from_run_dir`): ``digests.json``, and ``summary.json``'s ``model``,
  ``dataset`` and ``params_dense``;
- a campaign's store (:func:`from_store`): the manifests of the run's artifacts (``run_id``, ``model``,
  ``dataset``, ``params.dense``; all of one run must agree) and the run's digests as the campaign found them
  beside the artifacts it measured (the store's ``runs`` record, :func:`campaign_records`);
- a derived file: ``trace.json``'s ``runs``, ``budget_source``'s ``measured_run``.

Two statements of one run must agree on every field both know (:func:`check_same`); a mismatch is one
``ConfigError`` line naming both sides and the field they part on. The rule, per consumer, is in
docs/contracts.md ("Provenance of derived numbers").
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from edgemask.errors import ConfigError, CorruptFileError, EdgemaskError
from edgemask.fileio import sha256_file
from edgemask.workspace import check_name

DIGESTS = "digests.json"  # trainer.run_dir.DIGESTS (not imported: that module loads torch)
# the run's files whose digests an identity carries: the two a model is built from, and digests.json (all of
# the run's bytes), in the order a mismatch is named
RUN_FILES = ("model.safetensors", "config.toml", DIGESTS)
_RETRAIN = "re-train the run (`edgemask train`)"


def short(digest: str) -> str:
    return f"{digest[:12]}…"


@dataclass(frozen=True)
class RunIdentity:
    """One run's model as ``where`` states it; None / absent: not stated there."""

    run_id: str
    where: str  # what stated it, for a message: "runs/demo", "results/c (its manifests)", "trace.json"
    model: str | None = None
    dataset: str | None = None
    params: int | None = None  # the dense model's parameters (summary.json params_dense, manifest params.dense)
    sha256: Mapping[str, str] = field(default_factory=dict)  # RUN_FILES entry -> digest

    def describe(self) -> str:
        parts = [f"run {self.run_id}"]
        if self.model:
            parts.append(f"model {self.model}" + (f" on {self.dataset}" if self.dataset else ""))
        if self.params is not None:
            parts.append(f"{self.params:,} parameters")
        for name in ("model.safetensors", DIGESTS):
            if name in self.sha256:
                parts.append(f"{name} {short(self.sha256[name])}")
                break
        return ", ".join(parts)

    @property
    def known(self) -> bool:
        """Whether it states anything to check against besides the run id."""
        return bool(self.model or self.params is not None or self.sha256)

    def to_dict(self) -> dict[str, Any]:
        """Plain data without nulls (TOML has none): what a derived file records."""
        out: dict[str, Any] = {"run_id": self.run_id}
        for k in ("model", "dataset", "params"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.sha256:
            out["sha256"] = dict(self.sha256)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str) -> "RunIdentity":
        try:
            params = d.get("params")
            return cls(str(d["run_id"]), where, d.get("model"), d.get("dataset"),
                       None if params is None else int(params), {str(k): str(v) for k, v in
                                                                  (d.get("sha256") or {}).items()})
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise CorruptFileError(f"{where}: its run record is unreadable ({e})") from None

    def merged(self, other: "RunIdentity") -> "RunIdentity":
        """This identity with what only ``other`` states added (after :func:`check_same` found no conflict)."""
        return RunIdentity(self.run_id, self.where, self.model or other.model, self.dataset or other.dataset,
                           self.params if self.params is not None else other.params,
                           {**other.sha256, **self.sha256})


def check_same(a: RunIdentity, b: RunIdentity, fix: str) -> None:
    """Refuse, in one line naming both sides and what they part on, two statements of a run that disagree on a
    field both state (run id, model, data set, parameters, a file's digest). ``fix``: what to do."""
    differ = None
    if a.run_id != b.run_id:
        differ = "run id"
    elif a.model and b.model and a.model != b.model:
        differ = "model"
    elif a.dataset and b.dataset and a.dataset != b.dataset:
        differ = "data set"
    elif a.params is not None and b.params is not None and a.params != b.params:
        differ = "parameter count"
    else:
        for name in RUN_FILES:
            if name in a.sha256 and name in b.sha256 and a.sha256[name] != b.sha256[name]:
                differ = (f"{name} sha256 {short(a.sha256[name])} against {short(b.sha256[name])}")
                break
    if differ is not None:
        raise ConfigError(f"{a.where}: {a.describe()}; but {b.where}: {b.describe()} — not the same run "
                          f"({differ}); {fix}")


# -- a run directory ------------------------------------------------------------------------------------------
def _run_digests(run_dir: Path) -> dict[str, str] | None:
    """``digests.json``'s map (None when the run has none)."""
    path = run_dir / DIGESTS
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text())
        out = d["sha256"]
        if not isinstance(out, dict):
            raise TypeError("'sha256' is not an object")
        return {str(k): str(v) for k, v in out.items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorruptFileError(f"{path}: unreadable ({e}); {_RETRAIN}") from None


def read_checked(run_dir: Path, rel: str) -> bytes:
    """The bytes of ``run_dir/rel``, checked against the run's ``digests.json`` (as ``trainer.run_dir.Run.read``
    checks them, without loading torch): a run without ``digests.json``, a file it does not list or a changed
    file is refused in one line."""
    digests = _run_digests(run_dir)
    path = run_dir / rel
    if digests is None:
        raise CorruptFileError(f"{run_dir / DIGESTS}: missing, so the run's files cannot be checked (not written "
                               f"by `edgemask train`, or by one before digests were kept); {_RETRAIN}")
    if rel not in digests:
        raise CorruptFileError(f"{path}: not listed in {DIGESTS}; {_RETRAIN}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise CorruptFileError(f"{path}: missing, though {DIGESTS} lists it; {_RETRAIN}") from None
    import hashlib

    got = hashlib.sha256(data).hexdigest()
    if got != digests[rel]:
        raise CorruptFileError(f"{path}: sha256 {short(got)} is not the {short(digests[rel])} {DIGESTS} records; "
                               f"the file changed after training: {_RETRAIN}")
    return data


def from_run_dir(run_dir: Path, summary: Mapping[str, Any] | None = None) -> RunIdentity | None:
    """The identity ``runs/<id>/`` states: its digests (``digests.json``, and the config and shared weights it
    lists) and ``summary.json``'s model, data set and ``params_dense`` (``summary``: already read and checked).
    None where the directory does not exist."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return None
    digests = _run_digests(run_dir)
    sha = {}
    if digests is not None:
        sha = {DIGESTS: sha256_file(run_dir / DIGESTS),
               **{k: digests[k] for k in ("model.safetensors", "config.toml") if k in digests}}
    if summary is None and (run_dir / "summary.json").is_file():
        data = (read_checked(run_dir, "summary.json") if digests is not None and "summary.json" in digests
                else (run_dir / "summary.json").read_bytes())
        try:
            summary = json.loads(data)
        except ValueError as e:
            raise CorruptFileError(f"{run_dir / 'summary.json'}: unreadable ({e}); {_RETRAIN}") from None
    s = summary if isinstance(summary, Mapping) else {}
    params = s.get("params_dense")
    return RunIdentity(run_dir.name, str(run_dir), _text(s.get("model")), _text(s.get("dataset")),
                       int(params) if isinstance(params, (int, float)) and math.isfinite(params) else None, sha)


def _text(x: Any) -> str | None:
    return str(x) if isinstance(x, str) and x else None


def run_record(workspace: Path, run_id: str) -> dict[str, str] | None:
    """What a campaign records of a run it measures the artifacts of: the digests of ``runs/<id>/`` as found then
    (``digests.json``'s own, and the config and shared weights it lists); None where the workspace has no such
    run, or one without ``digests.json``."""
    run_dir = Path(workspace) / "runs" / check_name(run_id, "run id of an artifact")
    digests = _run_digests(run_dir) if run_dir.is_dir() else None
    if digests is None:
        return None
    return {DIGESTS: sha256_file(run_dir / DIGESTS),
            **{k: digests[k] for k in ("model.safetensors", "config.toml") if k in digests}}


def campaign_records(recorded: Mapping[str, Mapping[str, str]], run_ids: list[str], workspace: Path,
                     changing: set[str], store: Path) -> dict[str, dict[str, str]]:
    """The store's ``runs`` record after a campaign's start: each run's digests as found now (:func:`run_record`),
    kept as first recorded where the run is unchanged. A run whose files changed since the campaign recorded it
    (re-trained under the same id) is refused when ``changing`` (runs with jobs still to measure) holds it: the
    campaign would pool artifacts of two runs; otherwise its first record stays."""
    out = {k: dict(v) for k, v in recorded.items()}
    for run_id in sorted(set(run_ids)):
        now = run_record(workspace, run_id)
        if now is None:
            continue
        old = out.get(run_id)
        if old is None:
            out[run_id] = now
        elif old.get(DIGESTS) != now.get(DIGESTS) and run_id in changing:
            check_same(RunIdentity(run_id, f"{store} (recorded when the campaign started)", sha256=old),
                       RunIdentity(run_id, str(Path(workspace) / "runs" / run_id), sha256=now),
                       "the run changed since this campaign measured its artifacts: re-export it and give the "
                       "campaign a new name, or restore the run")
    return out


# -- a campaign's store -------------------------------------------------------------------------------------
def from_store(artifacts: pd.DataFrame, runs: Mapping[str, Mapping[str, str]], run_id: str,
               where: str) -> RunIdentity | None:
    """The identity a store states of ``run_id``: its artifacts' manifests (all of one run must name one model,
    data set and dense parameter count, else refused naming two that differ) and the digests the campaign
    recorded (``runs``). None where the store holds no artifact of the run."""
    rows = artifacts[artifacts["run_id"] == run_id] if not artifacts.empty else artifacts
    if rows.empty:
        return None
    first = None
    for r in rows.sort_values("artifact").itertuples():
        this = RunIdentity(run_id, f"{where}: artifact {r.artifact}'s manifest", _text(r.model), _text(r.dataset),
                           None if pd.isna(r.params_dense) else int(r.params_dense))
        if first is None:
            first = this
        else:
            check_same(first, this, "one run id holds artifacts of two models: re-export the run and measure it "
                                    "under a new campaign name")
    assert first is not None
    return RunIdentity(run_id, f"{where} (its manifests)", first.model, first.dataset, first.params,
                       dict(runs.get(run_id) or {}))


# -- numbers read from files -----------------------------------------------------------------------------------
def finite_column(df: pd.DataFrame, column: str, where: str, label: Callable[[pd.Series], str], *,
                  positive: bool = False, nonnegative: bool = False, missing_ok: bool = True,
                  fix: str = "rerun the stage that wrote it") -> None:
    """Refuse, in one line naming ``where`` (the file), the field and the row (``label(row)``), a value of
    ``df[column]`` that is no finite number: ±inf or text always, NaN unless ``missing_ok`` (missing there means
    not measured), and with ``positive`` one ≤ 0, with ``nonnegative`` one < 0."""
    if column not in df.columns or df.empty:
        return
    x = pd.to_numeric(df[column], errors="coerce").astype(float)
    bad = x.isin([math.inf, -math.inf]) | (x.isna() & df[column].notna())  # inf, or text that is no number
    if not missing_ok:
        bad |= x.isna()
    if positive:
        bad |= x <= 0
    if nonnegative:
        bad |= x < 0
    if bad.any():
        i = bad[bad].index[0]
        want = "positive " if positive else "non-negative " if nonnegative else ""
        v = df.at[i, column]
        v = v.item() if hasattr(v, "item") else v  # numpy's scalar: its plain value (inf, not np.float64(inf))
        raise CorruptFileError(f"{where}: field {column} is {v!r} for {label(df.loc[i])}; "
                               f"expected a finite {want}number: {fix}")


def checked_runs(artifacts: pd.DataFrame, recorded: Mapping[str, Mapping[str, str]], workspace: Path,
                 where: str) -> dict[str, RunIdentity]:
    """Every run of a store (``artifacts``: its manifests; ``recorded``: the campaign's run digests) as
    :func:`from_store` states it, checked against ``runs/<id>/`` where ``workspace`` has it (:func:`check_same`,
    refused in one line) and completed with what the run directory states."""
    out = {}
    if artifacts.empty:
        return out
    for run_id in sorted(set(artifacts["run_id"])):
        stored = from_store(artifacts, recorded, run_id, where)
        assert stored is not None
        run_dir = Path(workspace) / "runs" / check_name(run_id, "run id in the results")
        found = from_run_dir(run_dir)
        if found is not None:
            check_same(found, stored, "the run was re-trained (or replaced) since its artifacts were measured: "
                                      "export and measure it again under a new campaign name, or restore the run")
            stored = stored.merged(found)
        out[run_id] = stored
    return out


def changed_artifacts(workspace: Path, artifacts: pd.DataFrame) -> list[str]:
    """One line per measured artifact whose directory's ``manifest.json`` now names other files (sha256) than the
    ones the store measured: exported again since. The store's numbers stay those of the measured bytes."""
    from edgemask.manifest import MANIFEST, load_manifest

    notes = []
    for art, text in zip(artifacts.get("artifact", []), artifacts.get("manifest", [])):
        path = Path(workspace) / "artifacts" / art / MANIFEST
        if not path.is_file():
            continue
        try:
            now = {(f.format, f.variant): f.sha256 for f in load_manifest(path.parent).files}
        except EdgemaskError as e:  # a manifest damaged since: say so; the report stands on the store
            notes.append(f"{path}: unreadable now ({' '.join(str(e).split())[:120]}); the report shows what was "
                         f"measured from the files the campaign checked")
            continue
        was = {(f["format"], f.get("variant", "fp32")): f["sha256"] for f in json.loads(text).get("files", [])}
        moved = sorted(k for k in was if k in now and now[k] != was[k])
        if moved:
            fmt, variant = moved[0]
            notes.append(f"artifacts/{art}: its {fmt}/{variant} file is now sha256 {short(now[(fmt, variant)])}, "
                         f"not the {short(was[(fmt, variant)])} the campaign measured (exported again since"
                         + (f"; {len(moved) - 1} more file(s) too" if len(moved) > 1 else "")
                         + "): every number here is of the measured file; measure the new one under a new campaign "
                         "name")
    return notes


def finite_samples(df: pd.DataFrame, where: str) -> None:
    """Refuse a stored measurement whose raw samples are no finite numbers (``latency_ms`` must be finite and
    ≥ 0, ``power_w`` finite, a training job's ``round_ms`` finite and ≥ 0): no runner writes one, and one would
    pass into a percentile or a mean unseen. One line naming the store, the job and the field."""
    if df.empty:
        return
    fields = [c for c in ("latency_ms", "power_w") if c in df.columns]
    for i, job in enumerate(df["job_id"]):
        row = df.iloc[i]
        samples = {c: row[c] for c in fields}
        training = row.get("training") if "training" in df.columns else None
        if isinstance(training, dict):
            samples["training.round_ms"] = training.get("round_ms") or []
        for name, values in samples.items():
            for k, v in enumerate(values if isinstance(values, (list, tuple)) else []):
                x = v if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
                if not math.isfinite(x) or (x < 0 and name != "power_w"):
                    raise CorruptFileError(f"{where}: job {job}: field {name} holds {v!r} (sample {k}); expected "
                                           f"finite {'numbers' if name == 'power_w' else 'times ≥ 0'}: measure "
                                           f"it again under a new campaign name")
