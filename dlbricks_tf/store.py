"""SQLite store of timings: one file, safe to stop and resume.

Brick results are keyed by (signature, run settings key, fingerprint id)
and whole-model results by (model name, settings key, fingerprint id);
UNIQUE constraints rule out duplicates and each `put` commits at once, so a
run killed at any point resumes with `missing()` and re-times nothing that
was stored. Settings and fingerprints are kept as JSON rows; the schema
version is kept in a `meta` table and a newer one is refused. WAL mode and
a busy timeout let a reader (or a second writer) share the file.

Example:
    with Store("results.sqlite") as store:
        for signature in store.missing(signatures, settings, fp):
            store.put(signature, settings, fp, time_model(...))
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dlbricks_tf import errors
from dlbricks_tf.fingerprint import SystemFingerprint
from dlbricks_tf.settings import RunSettings
from dlbricks_tf.stats import Timing

SCHEMA_VERSION = 1
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
)
_STATS_DDL = """
    min_ms REAL NOT NULL, median_ms REAL NOT NULL,
    trimmed_mean_ms REAL NOT NULL, max_ms REAL NOT NULL,
    samples INTEGER NOT NULL, ci_low_ms REAL NOT NULL,
    ci_high_ms REAL NOT NULL, noisy INTEGER NOT NULL,
    calls_per_sample INTEGER NOT NULL, dispatch_ms REAL NOT NULL,
    loop_overhead_ms REAL NOT NULL,
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
"""
_TABLES = {
    "brick": ("brick_results", "signature"),
    "model": ("model_results", "model"),
}


class StoreError(errors.Error):
    """The store file cannot be used (newer schema, not a store, ...)."""


class Store:
    """A results database in one SQLite file (created if absent).

    Args:
        path: File path; ":memory:" for a throw-away store.
        timeout_s: How long to wait for another writer's lock.

    Raises:
        StoreError: If the file is not a store or has a newer schema.
    """

    def __init__(self, path: str | Path, timeout_s: float = 30.0) -> None:
        self.path = str(path)
        try:
            self._db = sqlite3.connect(self.path, timeout=timeout_s)
            self._db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1e3)}")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA foreign_keys = ON")
            self._init_schema()
        except sqlite3.DatabaseError as e:
            raise StoreError(f"Cannot open store {self.path!r}: {e}") from e

    def _init_schema(self) -> None:
        self._db.executescript(_SCHEMA)  # Idempotent.
        row = self._db.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'"
        ).fetchone()
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            self._db.close()
            raise StoreError(
                f"Store {self.path!r} has schema version {row[0]}, newer "
                f"than this dlbricks_tf's {SCHEMA_VERSION}; upgrade "
                "dlbricks_tf or use another file."
            )
        with self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                (str(SCHEMA_VERSION),),
            )

    @property
    def schema_version(self) -> int:
        """The schema version recorded in the file."""
        row = self._db.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'"
        ).fetchone()
        return int(row[0])

    def close(self) -> None:
        """Closes the connection."""
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _register(self, settings: RunSettings, fp: SystemFingerprint) -> None:
        self._db.execute(
            "INSERT OR IGNORE INTO settings VALUES (?, ?)",
            (settings.key(), settings.to_json()),
        )
        self._db.execute(
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
        with self._db:  # One transaction, committed on success.
            self._register(settings, fp)
            self._db.execute(
                f"INSERT INTO {table} ({column}, settings_key, fingerprint_id,"
                f" {', '.join(_STATS)}) VALUES ({', '.join('?' * len(row))})"
                f" ON CONFLICT ({column}, settings_key, fingerprint_id)"
                f" DO UPDATE SET {updates},"
                " created = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
                row,
            )

    def _get(
        self, kind: str, name: str, settings: RunSettings, fp: SystemFingerprint
    ) -> Timing | None:
        table, column = _TABLES[kind]
        row = self._db.execute(
            f"SELECT {', '.join(_STATS)} FROM {table} WHERE {column} = ? AND"
            " settings_key = ? AND fingerprint_id = ?",
            (name, settings.key(), fp.id),
        ).fetchone()
        return (
            None
            if row is None
            else Timing.from_dict(dict(zip(_STATS, row, strict=True)))
        )

    def put(
        self,
        signature: str,
        settings: RunSettings,
        fp: SystemFingerprint,
        timing: Timing,
    ) -> None:
        """Stores (or replaces) a brick's timing and commits it."""
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
        rows = self._db.execute(
            f"SELECT signature, {', '.join(_STATS)} FROM brick_results"
            " WHERE settings_key = ? AND fingerprint_id = ?",
            (settings.key(), fp.id),
        ).fetchall()
        timings = {
            r[0]: Timing.from_dict(dict(zip(_STATS, r[1:], strict=True)))
            for r in rows
        }
        return {s: t for s, t in timings.items() if accept_noisy or not t.noisy}

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
        cursor = self._db.execute(
            f"SELECT r.{column}, s.json, f.json, {', '.join(_STATS)},"
            f" r.created FROM {table} r JOIN settings s ON s.key ="
            " r.settings_key JOIN fingerprints f ON f.id = r.fingerprint_id"
            f" ORDER BY r.{column}, r.settings_key, r.fingerprint_id"
        )
        out = []
        for row in cursor:
            fp = json.loads(row[2])
            record = {column: row[0], "settings": json.loads(row[1])}
            record["fingerprint"] = fp
            record["fingerprint_id"] = SystemFingerprint.from_dict(fp).id
            record.update(zip(_STATS, row[3:-1], strict=True))
            record["noisy"] = bool(record["noisy"])
            record["created"] = row[-1]
            out.append(record)
        return out

    def export_json(self, path: str | Path) -> None:
        """Writes {"schema_version", "bricks": [...], "models": [...]}."""
        data = {
            "schema_version": SCHEMA_VERSION,
            "bricks": self.rows("brick"),
            "models": self.rows("model"),
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

        Returns:
            The number of results added.
        """
        before = self._count()
        with Store(other) as source:
            with self._db:
                for table in ("settings", "fingerprints"):
                    self._db.executemany(
                        f"INSERT OR IGNORE INTO {table} VALUES (?, ?)",
                        source._db.execute(f"SELECT * FROM {table}"),
                    )
                for table, column in _TABLES.values():
                    cols = f"{column}, settings_key, fingerprint_id, "
                    cols += ", ".join(_STATS) + ", created"
                    self._db.executemany(
                        f"INSERT OR IGNORE INTO {table} ({cols}) VALUES "
                        f"({', '.join('?' * (len(_STATS) + 4))})",
                        source._db.execute(f"SELECT {cols} FROM {table}"),
                    )
        return self._count() - before

    def _count(self) -> int:
        return sum(
            self._db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t, _ in _TABLES.values()
        )
