"""SQLite store of timings: one file, safe to stop, resume and share.

Brick results are keyed by (signature, run settings key, fingerprint id)
and whole-model results by (model name, settings key, fingerprint id);
UNIQUE constraints rule out duplicates and each `put` commits at once, so a
run killed at any point (even `kill -9`) resumes with `missing()` and
re-times nothing that was stored. Settings and fingerprints are kept as
JSON rows; the schema version is kept in a `meta` table.

A brick that could not be loaded, built or timed is recorded as failed,
with its reason, under the same key as a result (`put_failure`); it does
not count as stored, so a rerun tries it again, and a result stored later
replaces the failure. A store of schema version 1 (before failures were
recorded) gains the table on first open, in one transaction, and keeps
every result; one of a schema before 4 gains the means' columns
(`mean_ms`, `mean_half_ms`), NULL in its rows: their estimates add medians,
as they did when they were written. The reference state of each machine
and settings (`dlbricks_tf.measuring.reference`) has a table of its own.

An existing file is inspected, without writing, before anything is
written to it: a folder, a file that is not SQLite, an SQLite database of
another program, a corrupt database (`PRAGMA quick_check`) or a store of a
newer schema is refused with a `StoreError` and left byte for byte as it
was (only the -wal of a writer killed mid-run, if any, is folded back into
the file by SQLite, as any connection would).

Several processes may share one file (shards of a suite timed side by
side, a reader while a writer runs): WAL mode lets readers and one writer
work at once, writers wait for each other (the busy timeout), every write
takes the write lock up front (`BEGIN IMMEDIATE`), and a write that still
finds the database locked or busy is retried with a growing, jittered
back-off before giving up.

Example:
    with Store("results.sqlite") as store:
        for signature in store.missing(signatures, settings, fp):
            store.put(signature, settings, fp, time_model(...))
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from dlbricks_tf import errors
from dlbricks_tf.fingerprint import SystemFingerprint
from dlbricks_tf.settings import RunSettings
from dlbricks_tf.stats import Timing

_T = TypeVar("_T")

# 1: results only. 2: adds `brick_failures`. 3: adds `predictors` (an
# older file is upgraded in place when opened, see `_init_schema`).
SCHEMA_VERSION = 4
# Columns a schema added to both results tables (older rows hold NULL).
_ADDED_COLUMNS = {4: ("mean_ms REAL", "mean_half_ms REAL")}
# Back-off between attempts of a write that found the database locked: the
# busy timeout already waited, so these cover what it does not (a lock
# taken while a snapshot was upgraded, a journal-mode switch).
RETRIES = 8
_FIRST_DELAY_S = 0.05
_MAX_DELAY_S = 2.0

_STATS = (
    "min_ms",
    "median_ms",
    "trimmed_mean_ms",
    "max_ms",
    "samples",
    "ci_low_ms",
    "ci_high_ms",
    "noisy",
    "calls_per_sample",
    "dispatch_ms",
    "loop_overhead_ms",
    "mean_ms",
    "mean_half_ms",
)
_STATS_DDL = """
    min_ms REAL NOT NULL, median_ms REAL NOT NULL,
    trimmed_mean_ms REAL NOT NULL, max_ms REAL NOT NULL,
    samples INTEGER NOT NULL, ci_low_ms REAL NOT NULL,
    ci_high_ms REAL NOT NULL, noisy INTEGER NOT NULL,
    calls_per_sample INTEGER NOT NULL, dispatch_ms REAL NOT NULL,
    loop_overhead_ms REAL NOT NULL,
    mean_ms REAL, mean_half_ms REAL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
"""
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS fingerprints (
    id TEXT PRIMARY KEY, json TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS brick_results (
    signature TEXT NOT NULL,
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    {_STATS_DDL},
    UNIQUE (signature, settings_key, fingerprint_id));
CREATE TABLE IF NOT EXISTS model_results (
    model TEXT NOT NULL,
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    {_STATS_DDL},
    UNIQUE (model, settings_key, fingerprint_id));
CREATE TABLE IF NOT EXISTS brick_failures (
    signature TEXT NOT NULL,
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    reason TEXT NOT NULL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (signature, settings_key, fingerprint_id));
CREATE TABLE IF NOT EXISTS reference_states (
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    state_ms REAL NOT NULL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (settings_key, fingerprint_id));
CREATE TABLE IF NOT EXISTS predictors (
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    fit_key TEXT NOT NULL,
    json TEXT NOT NULL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (settings_key, fingerprint_id));
"""
_FAILURES = "brick_failures"
_PREDICTORS = "predictors"
_TABLES = {
    "brick": ("brick_results", "signature"),
    "model": ("model_results", "model"),
}


class StoreError(errors.Error):
    """The store file cannot be used (newer schema, not a store, ...)."""


def _is_busy(error: sqlite3.Error) -> bool:
    """Whether an error is another connection's lock (worth retrying)."""
    message = str(error).lower()
    return isinstance(error, sqlite3.OperationalError) and (
        "locked" in message or "busy" in message
    )


class Store:
    """A results database in one SQLite file (created if absent).

    Args:
        path: File path; ":memory:" for a throw-away store.
        timeout_s: How long one attempt waits for another writer's lock.
        retries: Further attempts of a read or write that still found the
            database locked or busy, after a jittered back-off that doubles
            from 50 ms to 2 s.

    Raises:
        StoreError: If the path is a folder or cannot be opened, or the file
            is not SQLite, not a store, corrupt or of a newer schema; the
            file is then not modified.
    """

    def __init__(
        self,
        path: str | Path,
        timeout_s: float = 30.0,
        retries: int = RETRIES,
    ) -> None:
        self.path = str(path)
        self._timeout_s = timeout_s
        self._retries = retries
        if self.path != ":memory:":
            self._inspect()
        self._db = self._guard("open", self._connect)
        try:
            self._write(self._init_schema)
        except BaseException:
            self._db.close()
            raise

    def _inspect(self) -> None:
        """Refuses an existing file that is not a usable store; only reads."""
        if os.path.isdir(self.path):
            raise StoreError(
                f"Store {self.path!r} is a folder: give the path of a store "
                "file (e.g. --db=results.sqlite)."
            )
        if not os.path.isfile(self.path) or os.path.getsize(self.path) == 0:
            return  # A new store.
        self._inspect_database()

    def _inspect_database(self) -> None:
        # A plain connection that only reads, not a read-only one: that
        # would leave -wal and -shm files behind, while this one, last to
        # close, removes them as SQLite always does. (Nor may the file be
        # opened outside SQLite: closing it would drop the POSIX locks of
        # this process's other connections to it.)
        try:
            db = sqlite3.connect(self.path, timeout=self._timeout_s)
        except sqlite3.Error as e:
            raise StoreError(f"Cannot open store {self.path!r}: {e}.") from e
        try:
            tables = {
                r[0]
                for r in self._retry(
                    lambda: db.execute(
                        "SELECT name FROM sqlite_master WHERE type = 'table'"
                    ).fetchall()
                )
            }
            version = None
            if "meta" in tables:
                row = db.execute(
                    "SELECT value FROM meta WHERE key = 'schema_version'"
                ).fetchone()
                version = None if row is None else str(row[0])
            # Tables of a store whose creation was cut short are ours too.
            foreign = tables - {"meta", "settings", "fingerprints"}
            foreign -= {table for table, _ in _TABLES.values()}
            foreign -= {_FAILURES, _PREDICTORS, "reference_states"}
            if (foreign and version is None) or (
                version is not None and not version.isdigit()
            ):
                raise StoreError(
                    f"{self.path!r} is an SQLite database but not a "
                    "dlbricks_tf store (no schema version); it was not "
                    "modified. Give another file to write results to."
                )
            if version is not None:
                self._check_version(int(version))
            (check,) = self._retry(
                lambda: db.execute("PRAGMA quick_check(1)").fetchone()
            )
            if check != "ok":
                # E.g. "*** in database main ***\nTree 8 page 12 cell 27: ..."
                lines = [ln for ln in check.splitlines() if "***" not in ln]
                problem = (lines or [check])[0]
                raise StoreError(
                    f"Store {self.path!r} is corrupt ({problem}); it was not "
                    "modified. Restore it from a copy (sqlite3's `.recover` "
                    "salvages rows) or give another file."
                )
        except sqlite3.DatabaseError as e:
            if "not a database" in str(e):
                raise StoreError(
                    f"Store {self.path!r} is not an SQLite file (not a "
                    "store, or its header is corrupt); it was not modified. "
                    "Give another file, or restore this one from a copy."
                ) from e
            reason = " ".join(str(e).split())  # SQLite quotes schema lines.
            raise StoreError(
                f"Store {self.path!r} cannot be read ({reason}): it is "
                "corrupt or not a store, and was not modified. Restore it "
                "from a copy or give another file."
            ) from e
        finally:
            db.close()

    def _check_version(self, version: int) -> None:
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"Store {self.path!r} has schema version {version}, newer "
                f"than this dlbricks_tf's {SCHEMA_VERSION}; it was not "
                "modified. Upgrade dlbricks_tf or use another file."
            )

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are explicit (see `_write`).
        db = sqlite3.connect(
            self.path, timeout=self._timeout_s, isolation_level=None
        )
        try:
            db.execute(f"PRAGMA busy_timeout = {int(self._timeout_s * 1e3)}")
            self._retry(lambda: db.execute("PRAGMA journal_mode = WAL"))
            db.execute("PRAGMA foreign_keys = ON")
        except BaseException:
            db.close()
            raise
        return db

    def _init_schema(self, db: sqlite3.Connection) -> None:
        for statement in _SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)  # Idempotent.
        row = db.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'"
        ).fetchone()
        if row is None:
            db.execute(
                "INSERT INTO meta VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )
            return
        self._check_version(int(row[0]))  # Again: a writer may be newer.
        if int(row[0]) < SCHEMA_VERSION:
            for version, columns in _ADDED_COLUMNS.items():
                if int(row[0]) >= version:
                    continue
                for table, _ in _TABLES.values():
                    have = {
                        r[1] for r in db.execute(f"PRAGMA table_info({table})")
                    }
                    for column in columns:
                        if column.split()[0] not in have:
                            db.execute(
                                f"ALTER TABLE {table} ADD COLUMN {column}"
                            )
            # It has just gained the tables it lacked (CREATE ... IF NOT
            # EXISTS above, same transaction): it is now of this version.
            # A store already of this version is not written to at all.
            db.execute(
                "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                (str(SCHEMA_VERSION),),
            )

    def _retry(self, work: Callable[[], _T]) -> _T:
        """Runs `work`, again after a back-off while the file is locked."""
        delay = _FIRST_DELAY_S
        for attempt in range(self._retries + 1):
            try:
                return work()
            except sqlite3.OperationalError as e:
                if not _is_busy(e) or attempt == self._retries:
                    raise
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(2 * delay, _MAX_DELAY_S)
        raise AssertionError("unreachable")

    def _guard(self, action: str, work: Callable[[], _T]) -> _T:
        """Runs `work` with retries; SQLite errors become `StoreError`."""
        try:
            return self._retry(work)
        except sqlite3.Error as e:
            if _is_busy(e):
                raise StoreError(
                    f"Cannot {action} store {self.path!r}: it stayed locked "
                    f"by another process ({e}) through {self._retries + 1} "
                    f"attempts of {self._timeout_s:g} s; try again later."
                ) from e
            raise StoreError(
                f"Cannot {action} store {self.path!r}: {e}."
            ) from e

    def _write(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Runs `work(db)` in one write transaction, committed on success.

        The write lock is taken at the start (`BEGIN IMMEDIATE`), so that a
        transaction never has to upgrade a read snapshot that another
        writer made stale; a locked attempt is rolled back and retried.
        """

        def attempt() -> _T:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = work(self._db)
                self._db.execute("COMMIT")
                return out
            except BaseException:
                if self._db.in_transaction:
                    self._db.rollback()
                raise

        return self._guard("write to", attempt)

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        params = tuple(params)
        return self._guard(
            "read", lambda: self._db.execute(sql, params).fetchall()
        )

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        rows = self._read("SELECT value FROM meta WHERE key = 'schema_version'")
        return int(rows[0][0])

    def close(self) -> None:
        """Closes the connection."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @staticmethod
    def _register(
        db: sqlite3.Connection, settings: RunSettings, fp: SystemFingerprint
    ) -> None:
        db.execute(
            "INSERT OR IGNORE INTO settings VALUES (?, ?)",
            (settings.key(), settings.to_json()),
        )
        db.execute(
            "INSERT OR IGNORE INTO fingerprints VALUES (?, ?)",
            (fp.id, fp.to_json()),
        )

    def _put(
        self,
        kind: str,
        name: str,
        settings: RunSettings,
        fp: SystemFingerprint,
        timing: Timing,
    ) -> None:
        table, column = _TABLES[kind]
        values = timing.to_dict()
        row = [name, settings.key(), fp.id]
        row += [int(values[k]) if k == "noisy" else values[k] for k in _STATS]
        updates = ", ".join(f"{k} = excluded.{k}" for k in _STATS)

        def insert(db: sqlite3.Connection) -> None:
            self._register(db, settings, fp)
            if kind == "brick":  # A result replaces an earlier failure.
                db.execute(
                    f"DELETE FROM {_FAILURES} WHERE signature = ? AND "
                    "settings_key = ? AND fingerprint_id = ?",
                    row[:3],
                )
            db.execute(
                f"INSERT INTO {table} ({column}, settings_key, fingerprint_id,"
                f" {', '.join(_STATS)}) VALUES ({', '.join('?' * len(row))})"
                f" ON CONFLICT ({column}, settings_key, fingerprint_id)"
                f" DO UPDATE SET {updates},"
                " created = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                row,
            )

        self._write(insert)  # One transaction, committed on success.

    def _get(
        self, kind: str, name: str, settings: RunSettings, fp: SystemFingerprint
    ) -> Timing | None:
        table, column = _TABLES[kind]
        rows = self._read(
            f"SELECT {', '.join(_STATS)} FROM {table} WHERE {column} = ? AND"
            " settings_key = ? AND fingerprint_id = ?",
            (name, settings.key(), fp.id),
        )
        return (
            Timing.from_dict(dict(zip(_STATS, rows[0], strict=True)))
            if rows
            else None
        )

    def put(
        self,
        signature: str,
        settings: RunSettings,
        fp: SystemFingerprint,
        timing: Timing,
    ) -> None:
        """Stores (or replaces) a brick's timing and commits it.

        Raises:
            StoreError: If the file cannot be written (read-only, full, or
                locked by another process through every retry).
        """
        self._put("brick", signature, settings, fp, timing)

    def get(
        self, signature: str, settings: RunSettings, fp: SystemFingerprint
    ) -> Timing | None:
        """Returns a brick's stored timing, or None."""
        return self._get("brick", signature, settings, fp)

    def has(
        self,
        signature: str,
        settings: RunSettings,
        fp: SystemFingerprint,
        *,
        accept_noisy: bool = False,
    ) -> bool:
        """Whether a brick has a stored timing (noisy ones count if asked)."""
        timing = self.get(signature, settings, fp)
        return timing is not None and (accept_noisy or not timing.noisy)

    def missing(
        self,
        signatures: Iterable[str],
        settings: RunSettings,
        fp: SystemFingerprint,
        *,
        accept_noisy: bool = False,
    ) -> list[str]:
        """Returns the signatures still to time, in the given order.

        A noisy result does not count as stored unless `accept_noisy`, so a
        resumed run tries it again. Duplicates in `signatures` are dropped.
        """
        done = set(self.results(settings, fp, accept_noisy=accept_noisy))
        todo = dict.fromkeys(s for s in signatures if s not in done)
        return list(todo)

    def results(
        self,
        settings: RunSettings,
        fp: SystemFingerprint,
        *,
        accept_noisy: bool = True,
    ) -> dict[str, Timing]:
        """Returns {signature: timing} for one settings and fingerprint."""
        rows = self._read(
            f"SELECT signature, {', '.join(_STATS)} FROM brick_results"
            " WHERE settings_key = ? AND fingerprint_id = ?",
            (settings.key(), fp.id),
        )
        timings = {
            r[0]: Timing.from_dict(dict(zip(_STATS, r[1:], strict=True)))
            for r in rows
        }
        return {s: t for s, t in timings.items() if accept_noisy or not t.noisy}

    def put_failure(
        self,
        signature: str,
        settings: RunSettings,
        fp: SystemFingerprint,
        reason: str,
    ) -> None:
        """Records that a brick could not be loaded, built or timed.

        The failure is kept (replacing an earlier one) until a timing of the
        brick is stored under the same key; it never hides a stored timing.

        Args:
            signature: The brick's signature.
            settings: The run settings it failed under.
            fp: This machine's fingerprint.
            reason: One line: what went wrong (and what to do, if known).

        Raises:
            StoreError: If the file cannot be written.
        """
        reason = " ".join(str(reason).split()) or "unknown reason"

        def insert(db: sqlite3.Connection) -> None:
            self._register(db, settings, fp)
            db.execute(
                f"INSERT INTO {_FAILURES} (signature, settings_key,"
                " fingerprint_id, reason) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (signature, settings_key, fingerprint_id)"
                " DO UPDATE SET reason = excluded.reason,"
                " created = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (signature, settings.key(), fp.id, reason),
            )

        self._write(insert)

    def reference_state(
        self, settings: RunSettings, fp: SystemFingerprint
    ) -> float | None:
        """The reference state of this machine and settings, ms, or None.

        See `dlbricks_tf.measuring.reference`: timings scaled by the
        reference are milliseconds at this state.
        """
        rows = self._read(
            "SELECT state_ms FROM reference_states"
            " WHERE settings_key = ? AND fingerprint_id = ?",
            (settings.key(), fp.id),
        )
        return float(rows[0][0]) if rows else None

    def put_reference_state(
        self, settings: RunSettings, fp: SystemFingerprint, state_ms: float
    ) -> float:
        """Keeps the first reference state of this machine and settings.

        A state already stored is kept (every timing scaled to it must
        stay comparable); returns the one in force.

        Raises:
            StoreError: If the state is not finite and positive, or the
                file cannot be written.
        """
        if not (math.isfinite(state_ms) and state_ms > 0):
            raise StoreError(
                f"A reference state must be finite and positive. Received: "
                f"state_ms={state_ms!r}"
            )

        def insert(db: sqlite3.Connection) -> None:
            self._register(db, settings, fp)
            db.execute(
                "INSERT OR IGNORE INTO reference_states (settings_key,"
                " fingerprint_id, state_ms) VALUES (?, ?, ?)",
                (settings.key(), fp.id, float(state_ms)),
            )

        self._write(insert)
        return self.reference_state(settings, fp)

    def failures(
        self, settings: RunSettings, fp: SystemFingerprint
    ) -> dict[str, str]:
        """Returns {signature: reason} of the bricks recorded as failed."""
        rows = self._read(
            f"SELECT signature, reason FROM {_FAILURES} WHERE settings_key = ?"
            " AND fingerprint_id = ? ORDER BY signature",
            (settings.key(), fp.id),
        )
        return dict(rows)

    def failure_rows(self) -> list[dict[str, Any]]:
        """Returns every recorded failure: signature, settings, reason, ..."""
        rows = self._read(
            f"SELECT r.signature, s.json, r.fingerprint_id, r.reason,"
            f" r.created FROM {_FAILURES} r JOIN settings s ON s.key ="
            " r.settings_key ORDER BY r.signature, r.settings_key,"
            " r.fingerprint_id"
        )
        try:
            return [
                {
                    "signature": r[0],
                    "settings": json.loads(r[1]),
                    "fingerprint_id": r[2],
                    "reason": r[3],
                    "created": r[4],
                }
                for r in rows
            ]
        except (ValueError, TypeError) as e:
            raise self._malformed(e) from e

    def put_predictor(
        self,
        settings: RunSettings,
        fp: SystemFingerprint,
        fit_key: str,
        text: str,
    ) -> None:
        """Keeps the fitted predictor of these settings and this machine.

        One per pair: a later fit replaces it. `text` is data only
        (`dlbricks_tf.estimating.saved_predictor.to_json`); `fit_key` says
        what it was fitted from.
        """

        def insert(db: sqlite3.Connection) -> None:
            self._register(db, settings, fp)
            db.execute(
                f"INSERT INTO {_PREDICTORS} (settings_key, fingerprint_id,"
                " fit_key, json) VALUES (?, ?, ?, ?) ON CONFLICT"
                " (settings_key, fingerprint_id) DO UPDATE SET"
                " fit_key = excluded.fit_key, json = excluded.json,"
                " created = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                (settings.key(), fp.id, fit_key, text),
            )

        self._write(insert)

    def get_predictor(
        self, settings: RunSettings, fp: SystemFingerprint, fit_key: str
    ) -> str | None:
        """The kept predictor's text if it was fitted from `fit_key`."""
        rows = self._read(
            f"SELECT json FROM {_PREDICTORS} WHERE settings_key = ? AND"
            " fingerprint_id = ? AND fit_key = ?",
            (settings.key(), fp.id, fit_key),
        )
        return rows[0][0] if rows else None

    def put_model(
        self,
        model: str,
        settings: RunSettings,
        fp: SystemFingerprint,
        timing: Timing,
    ) -> None:
        """Stores (or replaces) a whole model's end-to-end timing."""
        self._put("model", model, settings, fp, timing)

    def get_model(
        self, model: str, settings: RunSettings, fp: SystemFingerprint
    ) -> Timing | None:
        """Returns a whole model's stored end-to-end timing, or None."""
        return self._get("model", model, settings, fp)

    def rows(self, kind: str = "brick") -> list[dict[str, Any]]:
        """Returns every result of a kind ("brick" or "model") as dicts.

        Each row holds the key (signature or model), the settings and
        fingerprint as nested dicts, the statistics and the creation time.
        """
        if kind not in _TABLES:
            raise ValueError(
                f"kind must be 'brick' or 'model'. Received: kind={kind!r}"
            )
        table, column = _TABLES[kind]
        rows = self._read(
            f"SELECT r.{column}, s.json, f.json, {', '.join(_STATS)},"
            f" r.created FROM {table} r JOIN settings s ON s.key ="
            " r.settings_key JOIN fingerprints f ON f.id = r.fingerprint_id"
            f" ORDER BY r.{column}, r.settings_key, r.fingerprint_id"
        )
        out = []
        for row in rows:
            try:
                fp = json.loads(row[2])
                record = {column: row[0], "settings": json.loads(row[1])}
                record["fingerprint"] = fp
                record["fingerprint_id"] = SystemFingerprint.from_dict(fp).id
            except (ValueError, TypeError, KeyError, AttributeError) as e:
                raise self._malformed(e) from e
            record.update(zip(_STATS, row[3:-1], strict=True))
            record["noisy"] = bool(record["noisy"])
            record["created"] = row[-1]
            out.append(record)
        return out

    def fingerprint_counts(self) -> list[tuple[SystemFingerprint, int]]:
        """Each fingerprint the store holds, with how many results it keys.

        Results are brick and model timings (failures and predictors do not
        count); fingerprints are read back under the id they were stored
        with, in the order of their ids.
        """
        rows = self._read(
            "SELECT f.json, (SELECT COUNT(*) FROM brick_results r WHERE"
            " r.fingerprint_id = f.id) + (SELECT COUNT(*) FROM model_results"
            " m WHERE m.fingerprint_id = f.id) FROM fingerprints f"
            " ORDER BY f.id"
        )
        try:
            return [
                (SystemFingerprint.from_dict(json.loads(fp)), count)
                for fp, count in rows
            ]
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise self._malformed(e) from e

    def _malformed(self, e: Exception) -> StoreError:
        """A row whose settings or fingerprint JSON another program broke."""
        reason = " ".join(str(e).split())[:200]
        return StoreError(
            f"Store {self.path!r} holds a malformed settings or fingerprint "
            f"row ({type(e).__name__}: {reason}); restore it from a copy."
        )

    def export_json(self, path: str | Path) -> None:
        """Writes {"schema_version", "bricks", "models", "failed_bricks"}."""
        data = {
            "schema_version": SCHEMA_VERSION,
            "bricks": self.rows("brick"),
            "models": self.rows("model"),
            "failed_bricks": self.failure_rows(),
        }
        Path(path).write_text(json.dumps(data, indent=1, sort_keys=True))

    def export_csv(self, path: str | Path, kind: str = "brick") -> None:
        """Writes one kind of result as CSV; settings flattened to columns."""
        records = self.rows(kind)
        key = _TABLES[kind][1] if kind in _TABLES else kind
        names = [f.name for f in dataclasses.fields(RunSettings)]
        header = [key, *names, "fingerprint_id", *_STATS, "created"]
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(header)
            for r in records:
                writer.writerow(
                    [
                        r[key],
                        *(r["settings"][n] for n in names),
                        r["fingerprint_id"],
                        *(r[s] for s in _STATS),
                        r["created"],
                    ]
                )

    def merge_from(self, other: str | Path) -> int:
        """Copies results absent here from another store file.

        The other file is read in full first, then everything is written in
        one transaction: a merge stopped half way adds nothing. Failures are
        copied too, except for bricks that either file holds a timing of.

        Returns:
            The number of results added (failures not counted).

        Raises:
            StoreError: If either file cannot be used.
        """
        cols = {
            table: f"{column}, settings_key, fingerprint_id, "
            + ", ".join(_STATS)
            + ", created"
            for table, column in _TABLES.values()
        }
        with Store(other) as source:
            keys = {
                t: source._read(f"SELECT * FROM {t}")
                for t in ("settings", "fingerprints")
            }
            results = {
                t: source._read(f"SELECT {c} FROM {t}") for t, c in cols.items()
            }
            failed = source._read(
                "SELECT signature, settings_key, fingerprint_id, reason,"
                f" created FROM {_FAILURES}"
            )

        def copy(db: sqlite3.Connection) -> int:
            before = self._count(db)
            for table, rows in keys.items():
                db.executemany(
                    f"INSERT OR IGNORE INTO {table} VALUES (?, ?)", rows
                )
            for table, rows in results.items():
                db.executemany(
                    f"INSERT OR IGNORE INTO {table} ({cols[table]}) VALUES "
                    f"({', '.join('?' * (len(_STATS) + 4))})",
                    rows,
                )
            db.executemany(
                f"INSERT OR IGNORE INTO {_FAILURES} (signature, settings_key,"
                " fingerprint_id, reason, created) VALUES (?, ?, ?, ?, ?)",
                failed,
            )
            db.execute(
                f"DELETE FROM {_FAILURES} WHERE EXISTS (SELECT 1 FROM"
                f" brick_results r WHERE r.signature = {_FAILURES}.signature"
                f" AND r.settings_key = {_FAILURES}.settings_key AND"
                f" r.fingerprint_id = {_FAILURES}.fingerprint_id)"
            )
            return self._count(db) - before

        return self._write(copy)

    @staticmethod
    def _count(db: sqlite3.Connection) -> int:
        return sum(
            db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t, _ in _TABLES.values()
        )
