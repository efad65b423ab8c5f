"""The results store of one campaign: ``results/<campaign>/results.sqlite``.

One row per job that the runner answered, written in one transaction, so a campaign killed at any point
leaves either the whole measurement or none of it. ``job_id`` is UNIQUE and every row has a ``status``:

- ``measured``: the runner's result is good (``ok``); the job is done, and no later run records it again.
- ``failed``: the runner answered ``ok = false`` (a model it refused, an output check that failed). A resume
  re-runs the job; the new row replaces this one, which moves to ``superseded`` (every sample is kept).
- ``interrupted`` jobs (Ctrl-C, a stopped campaign) and jobs whose link failed after their retries never get a
  row here: they are in ``failures`` (with ``status`` interrupted or failed) and are re-run on resume.

A job is re-run while it has failed in at most ``retries`` earlier runs (``failed_runs``); interrupted runs do
not count. The raw latency and power samples are kept (the Measurement as JSON); statistics are derived from
them later (``profiling.stats``). WAL mode lets a report read while a campaign writes.

Tables:
  meta(key, value)                       schema version, campaign config (JSON), the measured runs' digests
                                         (``runs``: run id -> {file: sha256}, JSON)
  artifacts(artifact, ..., manifest)     key numbers of each artifact's manifest.json
  measurements(job_id UNIQUE, ..., status, measurement JSON, artifact_sha256)
  superseded(same columns)               failed rows a later run replaced (history)
  failures(job_id, reason, attempts, status, measurement, artifact_sha256, ...)  every failed or interrupted
                                         outcome (history)
  skipped(artifact, format, variant, device, reason)
  events(device, kind, detail JSON)      what a campaign did to a board: stray runners, governor set/restored
  profiles(job_id UNIQUE, available, profiler, reason, blocks JSON)   per-operator profiling of a job, or why not
  profiled_runs(job_id, run, end_to_end_ms, total_us)                  each profiled run (apart from the timed ones)
  operator_samples(job_id, run, seq, name, op_type, us, provider)      every operator event of every profiled run

``artifact_sha256`` is the sha256 of the model file a row measured: the digest ``devices.benchmark`` checked the
local file against and ``devices.deploy`` verified on the board (the blob's content address), so it names the bytes
the runner loaded. One setting (artifact, format, variant, device, threads) never holds measured rows of two digests:
``record`` refuses such a row (:class:`DigestChanged`), a resume whose artifact file changed since is refused
(``profiling.campaign``), and the statistics group by the digest too (``profiling.stats``). Rows written before
digests were kept (schema 1 and 2) have NULL there: an unknown file, never pooled with a known one.

A schema-1 store (no status) is migrated in place on open: its ``ok = 0`` rows become ``failed``; schema 2 gains
the ``artifact_sha256`` columns (NULL in its old rows).
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from edgemask.devices.records import Measurement, RunnerSettings
from edgemask.errors import CorruptFileError, EdgemaskError
from edgemask.profiling.records import (TRAINING_RUNNER, ArtifactInfo, CampaignConfig, Job, SkippedJob,
                                        is_training_format)

SCHEMA_VERSION = 3
MEASURED, FAILED, INTERRUPTED = "measured", "failed", "interrupted"
UNSTABLE = "unstable"  # a superseded attempt dropped for its CV (campaign remeasure_unstable)

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
    measurement TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'measured', artifact_sha256 TEXT
);
CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY, job_id TEXT NOT NULL, artifact TEXT NOT NULL, format TEXT NOT NULL,
    variant TEXT NOT NULL, device TEXT NOT NULL, threads INTEGER NOT NULL, repetition INTEGER NOT NULL,
    reason TEXT NOT NULL, attempts INTEGER NOT NULL, recorded_at TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'failed', measurement TEXT, artifact_sha256 TEXT
);
CREATE TABLE IF NOT EXISTS skipped (
    artifact TEXT NOT NULL, format TEXT NOT NULL, variant TEXT NOT NULL, device TEXT NOT NULL,
    reason TEXT NOT NULL, UNIQUE (artifact, format, variant, device)
);
CREATE TABLE IF NOT EXISTS superseded (
    job_id TEXT NOT NULL, artifact TEXT NOT NULL, format TEXT NOT NULL, variant TEXT NOT NULL,
    device TEXT NOT NULL, threads INTEGER NOT NULL, repetition INTEGER NOT NULL,
    ok INTEGER NOT NULL, attempts INTEGER NOT NULL, recorded_at TEXT NOT NULL,
    measurement TEXT NOT NULL, status TEXT NOT NULL, artifact_sha256 TEXT
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, device TEXT NOT NULL, kind TEXT NOT NULL, detail TEXT NOT NULL,
    recorded_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS profiles (
    job_id TEXT NOT NULL UNIQUE, available INTEGER NOT NULL, profiler TEXT, reason TEXT, blocks TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS profiled_runs (
    job_id TEXT NOT NULL, run INTEGER NOT NULL, end_to_end_ms REAL, total_us REAL, UNIQUE (job_id, run)
);
CREATE TABLE IF NOT EXISTS operator_samples (
    job_id TEXT NOT NULL, run INTEGER NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, op_type TEXT NOT NULL,
    us REAL NOT NULL, provider TEXT, UNIQUE (job_id, run, seq)
);
"""

# Schema 1 -> 2: a status per row (ok = 0 rows were failures that the old code took for done), the failures'
# status and samples, and the history of replaced rows. Run once, in one transaction, before _SCHEMA.
_MIGRATE_1_TO_2 = """
ALTER TABLE measurements ADD COLUMN status TEXT NOT NULL DEFAULT 'measured';
UPDATE measurements SET status = 'failed' WHERE ok = 0;
ALTER TABLE failures ADD COLUMN status TEXT NOT NULL DEFAULT 'failed';
ALTER TABLE failures ADD COLUMN measurement TEXT;
UPDATE meta SET value = '2' WHERE key = 'schema';
"""
# Schema 2 -> 3: the model file's sha256 per row (NULL in rows written before: an unknown file). A table that
# _SCHEMA created just now already has the column.
_DIGEST_TABLES = ("measurements", "superseded", "failures")

_MEASUREMENT_COLUMNS = ("job_id, artifact, format, variant, device, threads, repetition, ok, attempts, "
                        "recorded_at, measurement, status, artifact_sha256")
_MEASUREMENT_MARKS = ",".join("?" * len(_MEASUREMENT_COLUMNS.split(",")))

# Measurement fields that are no column of to_dataframe: the job keys (already there) and the profile (its own
# tables: profiles(), profiled_runs(), operator_samples())
_NOT_COLUMNS = ("device", "artifact", "format", "variant", "threads", "profile")
_JOB_COLUMNS = ["job_id", "artifact", "format", "variant", "device", "threads", "repetition"]
_ARTIFACT_COLUMNS = ["run_id", "client_id", "kind", "algorithm", "model", "dataset",
                     "params_dense", "params_compacted", "flops_dense", "flops_compacted"]


class DigestChanged(EdgemaskError):
    """A measured row whose model file differs (sha256) from the file its setting was measured from before."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Schema 1 -> 2 -> 3 in one transaction: a store left half-migrated by a kill cannot happen."""
    cur = conn.cursor()
    cur.execute("BEGIN IMMEDIATE")
    version = "?"
    try:
        version = cur.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0]
        if version == "1":  # not done meanwhile
            for stmt in filter(str.strip, _MIGRATE_1_TO_2.split(";")):
                cur.execute(stmt)
        if version in ("1", "2"):
            for table in _DIGEST_TABLES:
                have = {r[1] for r in cur.execute(f"PRAGMA table_info({table})")}
                if "artifact_sha256" not in have:
                    cur.execute(f"ALTER TABLE {table} ADD COLUMN artifact_sha256 TEXT")
            cur.execute("UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),))
        cur.execute("COMMIT")
    except sqlite3.Error as exc:
        cur.execute("ROLLBACK")
        conn.close()
        raise CorruptFileError(f"{path}: cannot upgrade this schema-{version} results store ({exc}); "
                               "move it away and rerun the campaign") from None


def _read_only(path: Path, exc: sqlite3.DatabaseError) -> bool:
    """Whether opening the store failed because it (its file, its WAL files or its directory) cannot be written,
    not because it is damaged: SQLite says "readonly", or the file system denies writing one of them."""
    import os

    if "readonly" in str(exc).lower():
        return True
    wal = [path.with_name(path.name + s) for s in ("-wal", "-shm")]
    return any(p.exists() and not os.access(p, os.W_OK) for p in (path, *wal)) or not os.access(path.parent, os.W_OK)


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
            if _read_only(path, exc):  # good data that this user may not write: never advise discarding it
                raise EdgemaskError(f"{path}: the results store is read-only here ({exc}); make it and its "
                                    f"directory writable (chmod u+w), or copy {path.parent} to a writable "
                                    "place and use that; nothing was changed") from None
            raise CorruptFileError(f"{path}: not a results store ({exc}); move it away and rerun") from None
        if mode.lower() != "wal":
            raise EdgemaskError(f"{path}: SQLite refused WAL mode (got {mode!r}); put results on a local disk")
        if row is None:
            conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif row[0] in ("1", "2"):
            _migrate(conn, path)
        elif row[0] != str(SCHEMA_VERSION):
            conn.close()
            raise CorruptFileError(f"{path}: store schema {row[0]}, this edgemask reads {SCHEMA_VERSION}; "
                                   "use the edgemask that wrote it, or give the campaign a new name")
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
        return self._transaction(lambda cur: (cur.executemany(sql, rows), cur.rowcount)[1])

    def _transaction(self, body: Callable[[sqlite3.Cursor], Any]) -> Any:
        """``body(cursor)`` inside BEGIN IMMEDIATE ... COMMIT; rolled back (if still open) when anything fails."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                out = body(cur)
                cur.execute("COMMIT")
            except BaseException:
                # A failed COMMIT (disk full) may have ended the transaction already: a ROLLBACK then would raise
                # and hide the real error.
                if self._db.in_transaction:
                    cur.execute("ROLLBACK")
                raise
            return out

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    # -- campaign and artifacts -------------------------------------------------------------------
    def save_campaign(self, config: "CampaignConfig") -> None:
        """Keep the campaign's config. A resume with other runner settings would mix incomparable samples."""
        new = config.to_dict()
        old = self.campaign_config()
        if old is not None:  # settings (and tables) added since the campaign started count with their defaults
            old = {**old, "runner": {**dataclasses.asdict(RunnerSettings()), **(old.get("runner") or {})},
                   "training_runner": {**dataclasses.asdict(TRAINING_RUNNER), **(old.get("training_runner") or {})}}
        for table in ("runner", "training_runner"):
            if old is not None and old.get(table) != new[table]:
                raise EdgemaskError(
                    f"{self.path}: campaign {config.name!r} was started with {table.replace('_', ' ')} settings "
                    f"{old.get(table)} ([{table}]), "
                    f"now {new[table]}; give the campaign a new name or restore the settings")
        self._write("INSERT OR REPLACE INTO meta VALUES ('campaign', ?)", [(json.dumps(new),)])

    def campaign_config(self) -> dict[str, Any] | None:
        row = self._read("SELECT value FROM meta WHERE key='campaign'")
        return json.loads(row[0][0]) if row else None

    def save_runs(self, runs: Mapping[str, Mapping[str, str]]) -> None:
        """Keep, per run id, the digests of the run the measured artifacts came from, as the campaign found it in
        the workspace (``profiling.provenance.campaign_records``): what derived numbers check a run against."""
        self._write("INSERT OR REPLACE INTO meta VALUES ('runs', ?)", [(json.dumps(dict(runs), sort_keys=True),)])

    def runs(self) -> dict[str, dict[str, str]]:
        """The runs' digests :meth:`save_runs` kept (``{}`` in a store written before issue #44)."""
        row = self._read("SELECT value FROM meta WHERE key='runs'")
        return json.loads(row[0][0]) if row else {}

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
        """Jobs measured for good; every other job of the plan is (re-)run."""
        return {r[0] for r in self._read("SELECT job_id FROM measurements WHERE status = ?", (MEASURED,))}

    def job_status(self) -> dict[str, str]:
        """job_id -> measured | failed | interrupted: its latest outcome (a measured job stays measured)."""
        out = {job: status for job, status in self._read("SELECT job_id, status FROM failures ORDER BY id")}
        out.update(self._read("SELECT job_id, status FROM measurements WHERE status = ?", (MEASURED,)))
        return out

    def failed_runs(self) -> dict[str, int]:
        """job_id -> how many runs of the campaign ended it failed (interrupted runs are not counted)."""
        return dict(self._read("SELECT job_id, COUNT(*) FROM failures WHERE status = ? GROUP BY job_id", (FAILED,)))

    def record(self, job: "Job", measurement: Measurement, *, attempts: int = 1) -> bool:
        """Commit one runner result in its own transaction: ``measured`` if ok, else ``failed`` (also noted in
        ``failures``). A failed row is replaced by the new one and kept in ``superseded``. False, and nothing
        written, if the store already holds a good measurement of the job."""
        status = MEASURED if measurement.ok else FAILED
        mjson = _measurement_json(measurement)
        row = _measurement_row(job, measurement, attempts, mjson, status)

        def write(cur: sqlite3.Cursor) -> bool:
            old = cur.execute("SELECT status FROM measurements WHERE job_id = ?", (job.job_id,)).fetchone()
            if old is not None and old[0] == MEASURED:
                return False
            if status == MEASURED and measurement.artifact_sha256:
                other = _other_digests(cur, job, measurement.artifact_sha256)
                if other:
                    raise DigestChanged(f"{self.path}: {_setting_text(job)} was measured from model file sha256 "
                                        f"{other[0][:12]}… ({other[1]} repetition(s)), this repetition from "
                                        f"{measurement.artifact_sha256[:12]}…: the artifact changed during the "
                                        "campaign; not pooled, not recorded as measured")
            if old is not None:
                cur.execute(f"INSERT INTO superseded SELECT {_MEASUREMENT_COLUMNS} FROM measurements "
                            "WHERE job_id = ?", (job.job_id,))
                cur.execute("DELETE FROM measurements WHERE job_id = ?", (job.job_id,))
            cur.execute(f"INSERT INTO measurements ({_MEASUREMENT_COLUMNS}) VALUES ({_MEASUREMENT_MARKS})", row)
            _insert_profile(cur, job.job_id, measurement.profile)
            if status == FAILED:
                self._insert_failure(cur, job, measurement.error or "the runner failed without a reason",
                                     attempts, FAILED, mjson)
            return True

        return self._transaction(write)

    def setting_digests(self) -> dict[tuple[str, str, str, str, int], dict[str, int]]:
        """(artifact, format, variant, device, threads) -> {artifact_sha256: measured repetitions}, for the
        measured rows whose digest is known (rows from before digests were kept are left out)."""
        out: dict[tuple[str, str, str, str, int], dict[str, int]] = {}
        for art, fmt, var, dev, thr, digest, n in self._read(
                "SELECT artifact, format, variant, device, threads, artifact_sha256, COUNT(*) FROM measurements "
                "WHERE status = ? AND artifact_sha256 IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6", (MEASURED,)):
            out.setdefault((art, fmt, var, dev, int(thr)), {})[digest] = n
        return out

    def record_unstable(self, job: "Job", measurement: Measurement, *, attempts: int = 1) -> None:
        """Keep an attempt that was measured again because its CV exceeded the verdict's threshold: a row of
        ``superseded`` with status ``unstable``, counted in ``to_dataframe()``'s ``unstable_attempts``."""
        row = _measurement_row(job, measurement, attempts, _measurement_json(measurement), UNSTABLE)
        self._write(f"INSERT INTO superseded ({_MEASUREMENT_COLUMNS}) VALUES ({_MEASUREMENT_MARKS})", [row])

    def record_failure(self, job: "Job", reason: str, attempts: int, *, status: str = FAILED,
                       measurement: Measurement | None = None) -> None:
        """Note a failed or interrupted outcome (history); the job stays to do. ``measurement``: what the runner
        answered, if anything (kept, never counted as a result)."""
        if status not in (FAILED, INTERRUPTED):
            raise ValueError(f"status must be {FAILED!r} or {INTERRUPTED!r}, not {status!r}")
        mjson = _measurement_json(measurement) if measurement is not None else None
        self._transaction(lambda cur: self._insert_failure(cur, job, reason, attempts, status, mjson))

    @staticmethod
    def _insert_failure(cur: sqlite3.Cursor, job: "Job", reason: str, attempts: int, status: str,
                        mjson: str | None) -> None:
        digest = json.loads(mjson).get("artifact_sha256") if mjson else None
        cur.execute("INSERT INTO failures (job_id, artifact, format, variant, device, threads, repetition, "
                    "reason, attempts, recorded_at, status, measurement, artifact_sha256) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (job.job_id, job.artifact, job.format, job.variant, job.device, job.threads, job.repetition,
                     reason, attempts, _now(), status, mjson, digest))

    def failures(self, *, unresolved: bool = True) -> pd.DataFrame:
        """Failed and interrupted outcomes; by default only of jobs with no row in ``measurements`` (neither
        measured since nor answered by the runner: those are in the tables, as ``ok = false``)."""
        cols = [*_JOB_COLUMNS, "reason", "attempts", "recorded_at", "status"]
        where = "WHERE job_id NOT IN (SELECT job_id FROM measurements)" if unresolved else ""
        return pd.DataFrame(self._read(f"SELECT {', '.join(cols)} FROM failures {where} ORDER BY id"), columns=cols)

    def superseded(self) -> list[tuple["Job", Measurement]]:
        """Rows that a later run replaced, oldest first: failed ones, and attempts measured again for their CV
        (status ``unstable``)."""
        return self._jobs_and_measurements("superseded")

    # -- what the campaign did to a board ---------------------------------------------------------
    def record_event(self, device: str, kind: str, detail: Mapping[str, Any]) -> None:
        self._write("INSERT INTO events (device, kind, detail, recorded_at) VALUES (?,?,?,?)",
                    [(device, kind, json.dumps(dict(detail), sort_keys=True), _now())])

    def events(self, device: str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        rows = self._read("SELECT device, kind, detail, recorded_at FROM events ORDER BY id")
        return [{"device": d, "kind": k, "detail": json.loads(v), "recorded_at": t} for d, k, v, t in rows
                if (device is None or d == device) and (kind is None or k == kind)]

    def profiles(self) -> pd.DataFrame:
        """Per profiled job: its keys, whether the runtime gave per-operator events, the profiler or why not,
        and the delegates reported as one block (a JSON list)."""
        cols = [*_JOB_COLUMNS, "available", "profiler", "reason", "blocks"]
        rows = self._read(f"SELECT {', '.join('m.' + c for c in _JOB_COLUMNS)}, p.available, p.profiler, p.reason, "
                          "p.blocks FROM profiles p JOIN measurements m ON m.job_id = p.job_id ORDER BY m.rowid")
        df = pd.DataFrame(rows, columns=cols)
        df["available"] = df["available"].astype(bool)
        return df

    def profiled_runs(self) -> pd.DataFrame:
        """One row per profiled run: job keys, run index, end-to-end ms, the runtime's own time for it (us)."""
        cols = [*_JOB_COLUMNS, "run", "end_to_end_ms", "total_us"]
        rows = self._read(f"SELECT {', '.join('m.' + c for c in _JOB_COLUMNS)}, r.run, r.end_to_end_ms, "
                          "r.total_us FROM profiled_runs r JOIN measurements m ON m.job_id = r.job_id "
                          "ORDER BY m.rowid, r.run")
        return pd.DataFrame(rows, columns=cols)

    def operator_samples(self) -> pd.DataFrame:
        """Every operator event of every profiled run: job keys, run, position in the run, name, op type,
        microseconds, provider."""
        cols = [*_JOB_COLUMNS, "run", "seq", "name", "op_type", "us", "provider"]
        rows = self._read(f"SELECT {', '.join('m.' + c for c in _JOB_COLUMNS)}, o.run, o.seq, o.name, o.op_type, "
                          "o.us, o.provider FROM operator_samples o JOIN measurements m ON m.job_id = o.job_id "
                          "ORDER BY m.rowid, o.run, o.seq")
        return pd.DataFrame(rows, columns=cols)

    def measurements(self) -> list[tuple["Job", Measurement]]:
        """Every job's current row (measured or failed), in the order they were written."""
        return self._jobs_and_measurements("measurements")

    def _jobs_and_measurements(self, table: str) -> list[tuple["Job", Measurement]]:
        rows = self._read(f"SELECT {', '.join(_JOB_COLUMNS[1:])}, measurement FROM {table} ORDER BY rowid")
        return [(Job(*r[:6]), Measurement.from_dict(json.loads(r[6]))) for r in rows]

    def to_dataframe(self) -> pd.DataFrame:
        """One row per measurement: job keys, every Measurement field (samples as lists, device state as
        JSON text), the artifact's manifest numbers and the model file's size."""
        from edgemask.profiling.stats import throttled

        rows = self._read(
            "SELECT m.job_id, m.artifact, m.format, m.variant, m.device, m.threads, m.repetition, m.attempts, "
            "m.recorded_at, m.measurement, m.artifact_sha256, a.run_id, a.client_id, a.kind, a.algorithm, a.model, a.dataset, "
            "a.params_dense, a.params_compacted, a.flops_dense, a.flops_compacted, a.manifest "
            "FROM measurements m LEFT JOIN artifacts a ON a.artifact = m.artifact ORDER BY m.rowid")
        unstable = dict(self._read(f"SELECT job_id, COUNT(*) FROM superseded WHERE status = '{UNSTABLE}' "
                                   "GROUP BY job_id"))
        records = []
        for r in rows:
            (job_id, artifact, fmt, variant, device, threads, rep, attempts, recorded_at, mjson, digest,
             *art, manifest) = r
            m = {**json.loads(mjson), "artifact_sha256": digest}  # the column is the record; NULL: unknown
            rec: dict[str, Any] = dict(zip(_JOB_COLUMNS, (job_id, artifact, fmt, variant, device, threads, rep)))
            rec.update(attempts=attempts, recorded_at=recorded_at)
            rec.update(dict(zip(_ARTIFACT_COLUMNS, art)))
            for f in dataclasses.fields(Measurement):
                if f.name in _NOT_COLUMNS:
                    continue
                value = m.get(f.name, f.default if f.default is not dataclasses.MISSING else None)
                if f.name in ("state_before", "state_after"):
                    value = json.dumps(value or {}, sort_keys=True)
                elif f.name in ("latency_ms", "power_w"):
                    value = [float(x) for x in (value or [])]
                rec[f.name] = value
            rec["throttled"] = throttled(m.get("state_before") or {}) or throttled(m.get("state_after") or {})
            rec["model_bytes"] = _file_bytes(manifest, fmt, variant)
            rec.update(_training_info(manifest, fmt))
            rec["unstable_attempts"] = int(unstable.get(job_id, 0))
            records.append(rec)
        columns = [*_JOB_COLUMNS, "attempts", "recorded_at", *_ARTIFACT_COLUMNS,
                   *[f.name for f in dataclasses.fields(Measurement)
                     if f.name not in _NOT_COLUMNS],
                   "throttled", "model_bytes", *TRAINING_MANIFEST, "unstable_attempts"]
        df = pd.DataFrame.from_records(records, columns=columns)
        for col in ("params_dense", "params_compacted", "flops_dense", "flops_compacted", "model_bytes",
                    *TRAINING_MANIFEST):
            df[col] = df[col].astype("Int64")
        return df


def _setting_text(job: Job) -> str:
    return f"{job.artifact} {job.format}/{job.variant} on {job.device} with {job.threads} thread(s)"


def _other_digests(cur: sqlite3.Cursor, job: Job, digest: str) -> tuple[str, int] | None:
    """A known digest other than ``digest`` among the measured rows of ``job``'s setting, and its row count."""
    return cur.execute(
        "SELECT artifact_sha256, COUNT(*) FROM measurements WHERE artifact = ? AND format = ? AND variant = ? "
        "AND device = ? AND threads = ? AND status = ? AND artifact_sha256 IS NOT NULL AND artifact_sha256 != ? "
        "GROUP BY 1 ORDER BY 2 DESC LIMIT 1",
        (job.artifact, job.format, job.variant, job.device, job.threads, MEASURED, digest)).fetchone()


def _measurement_row(job: Job, measurement: Measurement, attempts: int, mjson: str, status: str) -> tuple:
    """A row of ``measurements`` (or ``superseded``), in :data:`_MEASUREMENT_COLUMNS`' order."""
    return (job.job_id, job.artifact, job.format, job.variant, job.device, job.threads, job.repetition,
            int(measurement.ok), attempts, _now(), mjson, status, measurement.artifact_sha256)


def _measurement_json(measurement: Measurement) -> str:
    """The measurement as stored: its profile without the runs (they go to their own tables)."""
    d = measurement.to_dict()
    d["profile"] = {k: v for k, v in (d.get("profile") or {}).items() if k != "runs"}
    return json.dumps(d)


def _insert_profile(cur: sqlite3.Cursor, job_id: str, profile: Mapping[str, Any]) -> None:
    """The profile's status, runs and operator samples of a job, replacing what an earlier (failed) row left."""
    for table in ("profiles", "profiled_runs", "operator_samples"):
        cur.execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
    if not profile:
        return
    cur.execute("INSERT INTO profiles VALUES (?,?,?,?,?)",
                (job_id, int(bool(profile.get("available"))), profile.get("profiler"), profile.get("reason"),
                 json.dumps(list(profile.get("blocks") or []))))
    runs = list(profile.get("runs") or [])
    cur.executemany("INSERT INTO profiled_runs VALUES (?,?,?,?)",
                    [(job_id, i, r.get("end_to_end_ms"), r.get("total_us")) for i, r in enumerate(runs)])
    cur.executemany("INSERT INTO operator_samples VALUES (?,?,?,?,?,?,?)",
                    [(job_id, i, k, str(op[0]), str(op[1]), float(op[2]), op[3] if len(op) > 3 else None)
                     for i, r in enumerate(runs) for k, op in enumerate(r.get("ops") or [])])


# The manifest's ``training`` numbers a training job's row carries (None on inference rows): the round the measured
# steps belong to (``num_train`` samples × ``epochs``) and what trains
TRAINING_MANIFEST = ("trained_params", "num_train", "epochs")


def _training_info(manifest: str | None, fmt: str) -> dict[str, int | None]:
    info = (json.loads(manifest).get("training") or {}) if manifest and is_training_format(fmt) else {}
    return {k: (int(info[k]) if info.get(k) is not None else None) for k in TRAINING_MANIFEST}


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
