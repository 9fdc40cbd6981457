"""A store written out (JSON, CSV) and stores merged into one.

`write_json` and `write_csv` write the rows `Store.rows` reads; `merge`
copies another store file's results into a store in one transaction, so
that shards timed on several machines, or side by side, end up in one
file (`dlbricks merge`). The other file is checked as any file from
someone else is (`check`): one impossible row refuses the whole file.
`Store.export_json`, `Store.export_csv` and `Store.merge_from` are the
methods that call them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf.cutting import description
from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.stats import SAMPLE_MS, timing_problem
from dlbricks_tf.storing.database import (
    _DESCRIPTIONS,
    _FAILURES,
    _REFERENCES,
    _STATS,
    _TABLES,
    SCHEMA_VERSION,
    WORKLOAD_BEFORE_6,
    Database,
    StoreError,
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


# A file's reference states as `merge` reads them, from either side: a
# state written before schema 6 is of `WORKLOAD_BEFORE_6`.
_REFERENCE_ROWS = (
    "SELECT settings_key, fingerprint_id, state_ms, created,"
    f" COALESCE(workload, ?) FROM {_REFERENCES}"
)


def merge(into: Database, other: str | Path) -> int:
    """Copies results absent from `into` from another store file.

    The other file is read in full and checked first (`check`), then
    everything is written in one transaction: a file with an impossible row
    adds nothing, nor does a merge stopped half way. Failures are copied
    too, except for bricks that either file holds a timing of; reference
    states and brick descriptions are copied where `into` has none (the
    first state of a machine and settings stays, as `put_reference_state`
    keeps it).

    A timing scaled to the reference (`dlbricks_tf.measuring.reference`)
    is in milliseconds at its store's reference state. Where both files
    hold a state for a machine and settings (shards that each calibrated
    one, minutes or days apart), the other file's timings of them are
    converted to this file's state (`rescaled`), so that one store holds
    one scale; two states that are readings of different workloads cannot
    be converted, and such a file is refused (`unlike`).

    Returns:
        The number of results added (failures, reference states and
        descriptions not counted).

    Raises:
        StoreError: If either file cannot be used, or the other holds a row
            `check` refuses (one line naming the file and the row).
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
        references = source._read(_REFERENCE_ROWS, (WORKLOAD_BEFORE_6,))
        described = source._read(f"SELECT signature, json FROM {_DESCRIPTIONS}")
    check(str(other), keys, results, failed, references, described)

    def copy(db: sqlite3.Connection) -> int:
        before = _count(db)
        # Our states as this transaction sees them: one another writer
        # calibrated since the file was read counts too.
        ours = db.execute(_REFERENCE_ROWS, (WORKLOAD_BEFORE_6,)).fetchall()
        unlike(str(other), references, ours)
        for table, rows in keys.items():
            db.executemany(f"INSERT OR IGNORE INTO {table} VALUES (?, ?)", rows)
        for table, rows in results.items():
            rows = rescaled(rows, references, ours)
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
        db.executemany(
            f"INSERT OR IGNORE INTO {_REFERENCES} (settings_key,"
            " fingerprint_id, state_ms, created, workload)"
            " VALUES (?, ?, ?, ?, ?)",
            references,
        )
        db.executemany(
            f"INSERT OR IGNORE INTO {_DESCRIPTIONS} VALUES (?, ?)", described
        )
        return _count(db) - before

    return into._write(copy)


# The columns of a timing that are milliseconds of its samples (scaled by
# the reference when it was timed); dispatch and loop overheads are not.
SCALED = SAMPLE_MS


def unlike(path: str, theirs: Sequence[tuple], ours: Sequence[tuple]):
    """Refuses a file whose reference state of a machine and settings is
    a reading of another workload than ours (`theirs` and `ours` are
    (settings_key, fingerprint_id, state_ms, created, workload) rows).

    Raises:
        StoreError: One line naming the file and the settings.
    """
    mine = {(r[0], r[1]): r[4] for r in ours}
    for row in theirs:
        kept = mine.get((row[0], row[1]))
        if kept is not None and kept != row[4]:
            raise StoreError(
                f"Store {path!r} was not merged: its reference state for "
                f"settings {row[0]!r} is a reading of the {row[4]!r} "
                f"workload and this store's of {kept!r}, so their timings "
                "cannot be put on one scale; merge it into a fresh store, "
                "or time its bricks again into this one."
            )


def rescaled(
    rows: Sequence[tuple],
    theirs: Sequence[tuple],
    ours: Sequence[tuple],
) -> list[tuple]:
    """Result rows (key, settings_key, fingerprint_id, *_STATS, created)
    converted from their store's reference states to ours.

    `theirs` and `ours` are (settings_key, fingerprint_id, state_ms, ...)
    rows. A timing at their state s_theirs is `ours / theirs` times as
    many milliseconds at our state; rows of a machine and settings that
    either store has no state for are left as they are.
    """
    mine = {(r[0], r[1]): r[2] for r in ours}
    factors = {
        (r[0], r[1]): mine[r[0], r[1]] / r[2]
        for r in theirs
        if (r[0], r[1]) in mine and mine[r[0], r[1]] != r[2]
    }
    if not factors:
        return list(rows)
    at = [3 + _STATS.index(name) for name in SCALED]
    out = []
    for row in rows:
        factor = factors.get((row[1], row[2]))
        if factor is not None:
            row = list(row)
            for i in at:
                if row[i] is not None:
                    row[i] *= factor
            row = tuple(row)
        out.append(row)
    return out


_AGAIN = (
    "nothing of it was added. Remove or repair that row (or time its brick "
    "or model again into a fresh store), then merge again."
)


def check(
    path: str,
    keys: Mapping[str, Sequence[tuple]],
    results: Mapping[str, Sequence[tuple]],
    failed: Sequence[tuple],
    references: Sequence[tuple],
    described: Sequence[tuple],
) -> None:
    """Refuses a store file to merge that holds an impossible row.

    Refused, in one line that names the file, the table and the row: a
    settings row whose key is not the key of its settings, or a fingerprint
    row whose id is not its fingerprint's; a result, failure or reference
    state whose settings or fingerprint the file does not hold; a result
    whose figures are impossible (`stats.timing_problem`: not finite, below
    0, out of order, no sample; a brick timed in chains may have its mean
    outside [min, max]); a reference state that is not finite and
    positive; a brick description that does not parse, is over the limits
    on files read (`dlbricks_tf.limits`), or describes another brick.

    Args:
        path: The file, for messages.
        keys: {"settings": rows, "fingerprints": rows} of (key, json).
        results: {table: rows} of `merge`'s result columns.
        failed: (signature, settings_key, fingerprint_id, ...) rows.
        references: (settings_key, fingerprint_id, state_ms, created,
            workload) rows.
        described: (signature, json) rows.

    Raises:
        StoreError: The first impossible row.
    """

    def refuse(where: str, problem: str) -> StoreError:
        return StoreError(
            f"Store {path!r} was not merged: its {where} {problem}; {_AGAIN}"
        )

    def parsed(table: str, row: Sequence[Any], parse, key_of, holds: str):
        """A settings or fingerprint row's object, its key checked."""
        key, text = row
        try:
            value = parse(json.loads(text))
        except (ValueError, TypeError, AttributeError) as e:
            raise refuse(
                f"{table} row {key!r}", f"is malformed ({_reason(e)})"
            ) from e
        if key_of(value) != key:
            raise refuse(
                f"{table} row {key!r}", f"holds {holds} {key_of(value)!r}"
            )
        return value

    protocols: dict[str, str | None] = {}
    for row in keys["settings"]:
        settings = parsed(
            "settings",
            row,
            RunSettings.from_dict,
            RunSettings.key,
            "settings whose key is",
        )
        protocols[row[0]] = settings.protocol
    fingerprints = set()
    for row in keys["fingerprints"]:
        parsed(
            "fingerprints",
            row,
            SystemFingerprint.from_dict,
            lambda fp: fp.id,
            "a fingerprint whose id is",
        )
        fingerprints.add(row[0])

    def where(table: str, column: str, row: Sequence[Any]) -> str:
        """The row by its key; a row of `column` "" has no name first."""
        name, settings_key, fp_id = ((None, *row) if not column else row)[:3]
        named = f"{column} {name!r}, " if column else ""
        return (
            f"{table} row ({named}settings {settings_key!r}, fingerprint "
            f"{fp_id!r})"
        )

    def check_keys(table: str, column: str, row: Sequence[Any]) -> None:
        settings_key, fp_id = row[1:3] if column else row[:2]
        if settings_key not in protocols:
            raise refuse(where(table, column, row), "names settings it lacks")
        if fp_id not in fingerprints:
            raise refuse(
                where(table, column, row), "names a fingerprint it lacks"
            )

    for table, column in _TABLES.values():
        for row in results[table]:
            check_keys(table, column, row)
            values = dict(zip(_STATS, row[3:], strict=False))
            in_chains = table == "brick_results" and protocols[row[1]] == (
                "chain"
            )
            problem = timing_problem(values, mean_in_range=not in_chains)
            if problem is not None:
                raise refuse(where(table, column, row), f"has {problem}")
    for row in failed:
        check_keys(_FAILURES, "signature", row)
    for row in references:
        check_keys(_REFERENCES, "", row)
        state = row[2]
        if not (
            isinstance(state, int | float)
            and math.isfinite(state)
            and state > 0
        ):
            raise refuse(
                where(_REFERENCES, "", row),
                f"has state_ms={state!r}, not a finite positive time",
            )
        workload = row[4]
        if not (isinstance(workload, str) and 0 < len(workload) <= 64):
            raise refuse(
                where(_REFERENCES, "", row),
                f"has workload={workload!r}, not a workload's name",
            )
    for signature, text in described:
        try:
            if not isinstance(text, str | bytes):
                raise description.DescriptionError(f"it is {text!r}")
            description.parse(text, signature)
        except description.DescriptionError as e:
            raise refuse(
                f"{_DESCRIPTIONS} row (signature {signature!r})",
                f"is refused ({_reason(e)})",
            ) from e


def _reason(e: BaseException) -> str:
    text = " ".join(str(e).split()).rstrip(".")
    return (text or type(e).__name__)[:300]


def _count(db: sqlite3.Connection) -> int:
    return sum(
        db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
        for t, _ in _TABLES.values()
    )
