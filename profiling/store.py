"""The results store of one campaign: ``results/<campaign>/results.sqlite``.

One row per finished job, written in one transaction together with nothing else, so a campaign killed at
any point leaves either the whole measurement or none of it. ``job_id`` is UNIQUE: a resumed campaign cannot
record a job twice. The raw latency and power samples are kept (the Measurement as JSON); statistics are
derived from them later (``profiling.stats``). WAL mode lets a report read while a campaign writes.

Tables:
  meta(key, value)                       schema version, campaign config (JSON)
  artifacts(artifact, ..., manifest)     key numbers of each artifact's manifest.json
  measurements(job_id UNIQUE, ..., measurement JSON)
  failures(job_id, reason, attempts, ...)  jobs that failed after their retries (history; re-run on resume)
  skipped(artifact, format, variant, device, reason)
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from devices.records import Measurement
from edgemask.errors import CorruptFileError, EdgemaskError
from edgemask.fileio import atomic_path

if TYPE_CHECKING:
    from profiling.campaign import ArtifactInfo, CampaignConfig, Job, SkippedJob

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS artifacts (
    artifact TEXT PRIMARY KEY, run_id TEXT NOT NULL, client_id TEXT NOT NULL, kind TEXT NOT NULL,
    algorithm TEXT, model TEXT, dataset TEXT,
    params_dense INTEGER, params_compacted INTEGER, flops_dense INTEGER, flops_compacted INTEGER,
    manifest TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS measurements (
    job_id TEXT NOT NULL UNIQUE, artifact TEXT NOT NULL, format TEXT NOT NULL, variant TEXT NOT NULL,
    device TEXT NOT NULL, threads INTEGER NOT NULL, repetition INTEGER NOT NULL,
    ok INTEGER NOT NULL, attempts INTEGER NOT NULL, recorded_at TEXT NOT NULL,
    measurement TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, artifact TEXT NOT NULL, format TEXT NOT NULL,
    variant TEXT NOT NULL, device TEXT NOT NULL, threads INTEGER NOT NULL, repetition INTEGER NOT NULL,
    reason TEXT NOT NULL, attempts INTEGER NOT NULL, recorded_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS skipped (
    artifact TEXT NOT NULL, format TEXT NOT NULL, variant TEXT NOT NULL, device TEXT NOT NULL,
    reason TEXT NOT NULL, UNIQUE (artifact, format, variant, device)
);
"""

_JOB_COLUMNS = ["job_id", "artifact", "format", "variant", "device", "threads", "repetition"]
_ARTIFACT_COLUMNS = ["run_id", "client_id", "kind", "algorithm", "model", "dataset",
                     "params_dense", "params_compacted", "flops_dense", "flops_compacted"]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class ResultsStore:
    """One campaign's SQLite store. Safe to share between the campaign's device threads."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self._db = conn
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: str | Path) -> "ResultsStore":
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30.0)
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            # FULL: a committed job survives a power cut too, not just a killed process.
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
            row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise CorruptFileError(f"{path}: not a results store ({exc}); move it away and rerun") from None
        if mode.lower() != "wal":
            raise EdgemaskError(f"{path}: SQLite refused WAL mode (got {mode!r}); put results on a local disk")
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) != SCHEMA_VERSION:
            raise CorruptFileError(f"{path}: store schema {row[0]}, this edgemask reads {SCHEMA_VERSION}")
        return cls(path, conn)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> int:
        """Run one statement over ``rows`` in one transaction; return the rows changed."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                cur.executemany(sql, rows)
                changed = cur.rowcount
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            return changed

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # -- campaign and artifacts -------------------------------------------------------------------
    def save_campaign(self, config: "CampaignConfig") -> None:
        """Keep the campaign's config. A resume with other runner settings would mix incomparable samples."""
        new = config.to_dict()
        old = self.campaign_config()
        if old is not None and old.get("runner") != new["runner"]:
            raise EdgemaskError(
                f"{self.path}: campaign {config.name!r} was started with runner settings {old.get('runner')}, "
                f"now {new['runner']}; give the campaign a new name or restore the settings")
        self._write("INSERT OR REPLACE INTO meta VALUES ('campaign', ?)", [(json.dumps(new),)])

    def campaign_config(self) -> dict[str, Any] | None:
        row = self._read("SELECT value FROM meta WHERE key='campaign'")
        return json.loads(row[0][0]) if row else None

    def save_artifacts(self, infos: Iterable["ArtifactInfo"]) -> None:
        rows = [(i.artifact, i.run_id, i.client_id, i.kind, i.algorithm, i.model, i.dataset,
                 i.params_dense, i.params_compacted, i.flops_dense, i.flops_compacted,
                 json.dumps(dict(i.manifest))) for i in infos]
        self._write("INSERT OR REPLACE INTO artifacts VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)

    def artifacts(self) -> pd.DataFrame:
        rows = self._read(f"SELECT artifact, {', '.join(_ARTIFACT_COLUMNS)}, manifest FROM artifacts")
        return pd.DataFrame(rows, columns=["artifact", *_ARTIFACT_COLUMNS, "manifest"])

    def save_skipped(self, skipped: Iterable["SkippedJob"]) -> None:
        rows = [(s.artifact, s.format, s.variant, s.device, s.reason) for s in skipped]
        self._write("INSERT OR REPLACE INTO skipped VALUES (?,?,?,?,?)", rows)

    def skipped(self) -> pd.DataFrame:
        cols = ["artifact", "format", "variant", "device", "reason"]
        return pd.DataFrame(self._read(f"SELECT {', '.join(cols)} FROM skipped ORDER BY 1,2,3,4"), columns=cols)

    # -- measurements -----------------------------------------------------------------------------
    def done_job_ids(self) -> set[str]:
        return {r[0] for r in self._read("SELECT job_id FROM measurements")}

    def record(self, job: "Job", measurement: Measurement, *, attempts: int = 1) -> bool:
        """Commit one finished job in its own transaction. False if the store already holds it."""
        row = (job.job_id, job.artifact, job.format, job.variant, job.device, job.threads, job.repetition,
               int(measurement.ok), attempts, _now(), json.dumps(measurement.to_dict()))
        return self._write(
            "INSERT INTO measurements VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(job_id) DO NOTHING", [row]) == 1

    def record_failure(self, job: "Job", reason: str, attempts: int) -> None:
        row = (job.job_id, job.artifact, job.format, job.variant, job.device, job.threads, job.repetition,
               reason, attempts, _now())
        self._write("INSERT INTO failures (job_id, artifact, format, variant, device, threads, repetition, "
                    "reason, attempts, recorded_at) VALUES (?,?,?,?,?,?,?,?,?,?)", [row])

    def failures(self, *, unresolved: bool = True) -> pd.DataFrame:
        """Failed attempts; by default only jobs that no later run measured."""
        cols = [*_JOB_COLUMNS, "reason", "attempts", "recorded_at"]
        where = "WHERE job_id NOT IN (SELECT job_id FROM measurements)" if unresolved else ""
        return pd.DataFrame(self._read(f"SELECT {', '.join(cols)} FROM failures {where} ORDER BY id"), columns=cols)

    def measurements(self) -> list[tuple["Job", Measurement]]:
        from profiling.campaign import Job

        rows = self._read(f"SELECT {', '.join(_JOB_COLUMNS[1:])}, measurement FROM measurements ORDER BY rowid")
        return [(Job(*r[:6]), Measurement.from_dict(json.loads(r[6]))) for r in rows]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per measurement: job keys, every Measurement field (samples as lists, device state as
        JSON text), the artifact's manifest numbers and the model file's size."""
        from profiling.stats import throttled

        rows = self._read(
            "SELECT m.job_id, m.artifact, m.format, m.variant, m.device, m.threads, m.repetition, m.attempts, "
            "m.recorded_at, m.measurement, a.run_id, a.client_id, a.kind, a.algorithm, a.model, a.dataset, "
            "a.params_dense, a.params_compacted, a.flops_dense, a.flops_compacted, a.manifest "
            "FROM measurements m LEFT JOIN artifacts a ON a.artifact = m.artifact ORDER BY m.rowid")
        records = []
        for r in rows:
            (job_id, artifact, fmt, variant, device, threads, rep, attempts, recorded_at, mjson,
             *art, manifest) = r
            m = json.loads(mjson)
            rec: dict[str, Any] = dict(zip(_JOB_COLUMNS, (job_id, artifact, fmt, variant, device, threads, rep)))
            rec.update(attempts=attempts, recorded_at=recorded_at)
            rec.update(dict(zip(_ARTIFACT_COLUMNS, art)))
            for f in dataclasses.fields(Measurement):
                if f.name in ("device", "artifact", "format", "variant", "threads"):
                    continue
                value = m.get(f.name, f.default if f.default is not dataclasses.MISSING else None)
                if f.name in ("state_before", "state_after"):
                    value = json.dumps(value or {}, sort_keys=True)
                elif f.name in ("latency_ms", "power_w"):
                    value = [float(x) for x in (value or [])]
                rec[f.name] = value
            rec["throttled"] = throttled(m.get("state_before") or {}) or throttled(m.get("state_after") or {})
            rec["model_bytes"] = _file_bytes(manifest, fmt, variant)
            records.append(rec)
        columns = [*_JOB_COLUMNS, "attempts", "recorded_at", *_ARTIFACT_COLUMNS,
                   *[f.name for f in dataclasses.fields(Measurement)
                     if f.name not in ("device", "artifact", "format", "variant", "threads")],
                   "throttled", "model_bytes"]
        df = pd.DataFrame.from_records(records, columns=columns)
        for col in ("params_dense", "params_compacted", "flops_dense", "flops_compacted", "model_bytes"):
            df[col] = df[col].astype("Int64")
        return df

    def export_parquet(self, path: str | Path) -> Path:
        path = Path(path)
        with atomic_path(path) as tmp:
            self.to_dataframe().to_parquet(tmp, index=False)
        return path

    def export_csv(self, path: str | Path) -> Path:
        """CSV has no lists: the raw samples go in as JSON arrays."""
        path = Path(path)
        df = self.to_dataframe()
        for col in ("latency_ms", "power_w"):
            df[col] = df[col].map(json.dumps)
        with atomic_path(path) as tmp:
            df.to_csv(tmp, index=False)
        return path


def _file_bytes(manifest: str | None, fmt: str, variant: str) -> int | None:
    if not manifest:
        return None
    for f in json.loads(manifest).get("files", []):
        if f.get("format") == fmt and f.get("variant", "fp32") == variant:
            return int(f["bytes"])
    return None


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """The measurements of ``results/<campaign>/`` as a DataFrame (see ``ResultsStore.to_dataframe``)."""
    path = Path(results_dir) / "results.sqlite"
    if not path.is_file():
        raise CorruptFileError(f"{path}: no results store; run `edgemask profile` first")
    with ResultsStore.open(path) as store:
        return store.to_dataframe()
