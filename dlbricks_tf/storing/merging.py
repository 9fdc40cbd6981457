"""A store written out (JSON, CSV) and stores merged into one.

`write_json` and `write_csv` write the rows `Store.rows` reads; `merge`
copies another store file's results into a store in one transaction, so
that shards timed on several machines, or side by side, end up in one
file (`dlbricks merge`). `Store.export_json`, `Store.export_csv` and
`Store.merge_from` are the methods that call them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.storing.database import (
    _FAILURES,
    _STATS,
    _TABLES,
    SCHEMA_VERSION,
    Database,
)


def write_json(
    path: str | Path,
    bricks: list[dict[str, Any]],
    models: list[dict[str, Any]],
    failed_bricks: list[dict[str, Any]],
) -> None:
    """Writes {"schema_version", "bricks", "models", "failed_bricks"}."""
    data = {
        "schema_version": SCHEMA_VERSION,
        "bricks": bricks,
        "models": models,
        "failed_bricks": failed_bricks,
    }
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True))


def write_csv(
    path: str | Path, records: list[dict[str, Any]], key: str
) -> None:
    """Writes result rows as CSV, keyed by `key`; settings as columns."""
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


def merge(into: Database, other: str | Path) -> int:
    """Copies results absent from `into` from another store file.

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
    with Database(other) as source:
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
        before = _count(db)
        for table, rows in keys.items():
            db.executemany(f"INSERT OR IGNORE INTO {table} VALUES (?, ?)", rows)
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
        return _count(db) - before

    return into._write(copy)


def _count(db: sqlite3.Connection) -> int:
    return sum(
        db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
        for t, _ in _TABLES.values()
    )
