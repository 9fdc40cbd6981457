"""The store's SQLite file: created, inspected, migrated, shared safely.

An existing file is inspected, without writing, before anything is
written to it: a folder, a file that is not SQLite, an SQLite database of
another program, a corrupt database (`PRAGMA quick_check`) or a store of a
newer schema is refused with a `StoreError` and left byte for byte as it
was (only the -wal of a writer killed mid-run, if any, is folded back into
the file by SQLite, as any connection would).

A store of schema version 1 (before failures were recorded) gains the
table on first open, in one transaction, and keeps every result; one of a
schema before 4 gains the means' columns (`mean_ms`, `mean_half_ms`), NULL
in its rows: their estimates add medians, as they did when they were
written; one before 5 gains the empty `brick_descriptions` table (what each
timed brick computes, see `dlbricks_tf.cutting.description`): its bricks
have none until `dlbricks bench` meets them again.

Several processes may share one file (shards of a suite timed side by
side, a reader while a writer runs): WAL mode lets readers and one writer
work at once, writers wait for each other (the busy timeout), every write
takes the write lock up front (`BEGIN IMMEDIATE`), and a write that still
finds the database locked or busy is retried with a growing, jittered
back-off before giving up.

`Database` is that file and its connection; `dlbricks_tf.storing.store`'s
`Store` adds the results API on top of it.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self, TypeVar

from dlbricks_tf import errors

_T = TypeVar("_T")

# 1: results only. 2: adds `brick_failures`. 3: adds `predictors` and
# `reference_states`. 4: adds the means' columns. 5: adds
# `brick_descriptions`. 6: adds the reference states' `workload` (an older
# file is upgraded in place when opened, see `_init_schema`).
SCHEMA_VERSION = 6
# The reference workload of a state written before schema 6, which has no
# `workload` (NULL): the only one there was (`dlbricks_tf.measuring.
# reference.WORKLOADS`).
WORKLOAD_BEFORE_6 = "matmul-reduce"
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
    workload TEXT,
    UNIQUE (settings_key, fingerprint_id));
CREATE TABLE IF NOT EXISTS predictors (
    settings_key TEXT NOT NULL REFERENCES settings(key),
    fingerprint_id TEXT NOT NULL REFERENCES fingerprints(id),
    fit_key TEXT NOT NULL,
    json TEXT NOT NULL,
    created TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    UNIQUE (settings_key, fingerprint_id));
CREATE TABLE IF NOT EXISTS brick_descriptions (
    signature TEXT PRIMARY KEY, json TEXT NOT NULL);
"""
_FAILURES = "brick_failures"
_PREDICTORS = "predictors"
_REFERENCES = "reference_states"
_DESCRIPTIONS = "brick_descriptions"
_TABLES = {
    "brick": ("brick_results", "signature"),
    "model": ("model_results", "model"),
}
# Columns a schema added to a table (older rows hold NULL).
_ADDED_COLUMNS = {
    4: {
        table: ("mean_ms REAL", "mean_half_ms REAL")
        for table, _ in _TABLES.values()
    },
    6: {_REFERENCES: ("workload TEXT",)},
}


class StoreError(errors.Error):
    """The store file cannot be used (newer schema, not a store, ...)."""


def _is_busy(error: sqlite3.Error) -> bool:
    """Whether an error is another connection's lock (worth retrying)."""
    message = str(error).lower()
    return isinstance(error, sqlite3.OperationalError) and (
        "locked" in message or "busy" in message
    )


class Database:
    """A store's SQLite file (created if absent) and its connection.

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
            foreign -= {_FAILURES, _PREDICTORS, _REFERENCES, _DESCRIPTIONS}
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
            for version, tables in _ADDED_COLUMNS.items():
                if int(row[0]) >= version:
                    continue
                for table, columns in tables.items():
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _malformed(self, e: Exception) -> StoreError:
        """A row whose settings or fingerprint JSON another program broke."""
        reason = " ".join(str(e).split())[:200]
        return StoreError(
            f"Store {self.path!r} holds a malformed settings or fingerprint "
            f"row ({type(e).__name__}: {reason}); restore it from a copy."
        )
