"""SQLite store of timings: one file, safe to stop, resume and share.

Brick results are keyed by (signature, run settings key, fingerprint id)
and whole-model results by (model name, settings key, fingerprint id);
UNIQUE constraints rule out duplicates and each `put` commits at once, so a
run killed at any point (even `kill -9`) resumes with `missing()` and
re-times nothing that was stored. Settings and fingerprints are kept as
JSON rows; the schema version is kept in a `meta` table.

Each timed brick may keep its description (what it computes, without
names or weights: `dlbricks_tf.cutting.description`), once per signature
whatever the settings, so that a predictor can learn from it with no
source model at hand.

A brick that could not be loaded, built or timed is recorded as failed,
with its reason, under the same key as a result (`put_failure`); it does
not count as stored, so a rerun tries it again, and a result stored later
replaces the failure. The reference state of each machine and settings
(`dlbricks_tf.measuring.reference`) has a table of its own, and fitted
predictors one more.

How the file is created, checked, migrated and shared between processes
is `dlbricks_tf.storing.database`'s; export to JSON or CSV and merging
stores is `dlbricks_tf.storing.merging`'s.

Example:
    with Store("results.sqlite") as store:
        for signature in store.missing(signatures, settings, fp):
            store.put(signature, settings, fp, time_model(...))
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.stats import Timing, timing_problem
from dlbricks_tf.storing import merging
from dlbricks_tf.storing.database import (
    _DESCRIPTIONS,
    _FAILURES,
    _PREDICTORS,
    _STATS,
    _TABLES,
    WORKLOAD_BEFORE_6,
    Database,
    StoreError,
)

# The keys of the ONNX Runtime layout changes stored beside the bricks
# (`dlbricks_tf.measuring.ort_layout`): `results` leaves them out.
LAYOUT_PREFIX = "nchwc:"
# The `meta` keys of the probe corpus's cuts (`put_probe_suite`).
_PROBE_SUITE = "probe_suite:"


class Store(Database):
    """A results database in one SQLite file (created if absent).

    Opened as a `Database` (the same arguments and errors); this class
    adds what is stored in it: timings, failures, predictors, reference
    states, and export and merge (`dlbricks_tf.storing.merging`).
    """

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
        description: str | None = None,
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
            if description is not None:
                db.execute(
                    f"INSERT OR IGNORE INTO {_DESCRIPTIONS} VALUES (?, ?)",
                    (name, description),
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
        description: str | None = None,
    ) -> None:
        """Stores (or replaces) a brick's timing and commits it.

        Args:
            signature: The brick's signature.
            settings: The run settings it was timed under.
            fp: This machine's fingerprint.
            timing: Its timing.
            description: What the brick computes (`Brick.describe`), kept
                once per signature in the same transaction; a description
                already kept stays.

        Raises:
            StoreError: If the file cannot be written (read-only, full, or
                locked by another process through every retry).
        """
        self._put("brick", signature, settings, fp, timing, description)

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
        resumed run tries it again; nor does one a sum of latencies cannot
        use (`stats.timing_problem`: a figure negative, infinite or not a
        number, no sample), so that timing the brick again replaces it.
        Duplicates in `signatures` are dropped.
        """
        stored = self.results(settings, fp, accept_noisy=accept_noisy)
        done = {
            s
            for s, t in stored.items()
            if timing_problem(t.to_dict(), ordered=False) is None
        }
        todo = dict.fromkeys(s for s in signatures if s not in done)
        return list(todo)

    def results(
        self,
        settings: RunSettings,
        fp: SystemFingerprint,
        *,
        accept_noisy: bool = True,
        layout: bool = False,
    ) -> dict[str, Timing]:
        """Returns {signature: timing} for one settings and fingerprint.

        With `layout`, the layout changes' rows (keys `LAYOUT_PREFIX`...)
        instead of the bricks'.
        """
        rows = self._read(
            f"SELECT signature, {', '.join(_STATS)} FROM brick_results"
            " WHERE settings_key = ? AND fingerprint_id = ?"
            f" AND (substr(signature, 1, {len(LAYOUT_PREFIX)}) = ?) = ?",
            (settings.key(), fp.id, LAYOUT_PREFIX, int(layout)),
        )
        timings = {
            r[0]: Timing.from_dict(dict(zip(_STATS, r[1:], strict=True)))
            for r in rows
        }
        return {s: t for s, t in timings.items() if accept_noisy or not t.noisy}

    def put_descriptions(self, descriptions: dict[str, str]) -> int:
        """Keeps the descriptions of bricks that have none yet.

        Args:
            descriptions: {signature: description} (`Brick.describe`).

        Returns:
            How many were added (one already kept stays).

        Raises:
            StoreError: If the file cannot be written.
        """

        def insert(db: sqlite3.Connection) -> int:
            before = db.total_changes
            db.executemany(
                f"INSERT OR IGNORE INTO {_DESCRIPTIONS} VALUES (?, ?)",
                sorted(descriptions.items()),
            )
            return db.total_changes - before

        return self._write(insert) if descriptions else 0

    def descriptions(
        self, settings: RunSettings, fp: SystemFingerprint
    ) -> dict[str, str]:
        """{signature: description} of the bricks timed under these settings
        on this machine that have one (see `dlbricks_tf.cutting.description`;
        read back with `description.parse`)."""
        rows = self._read(
            f"SELECT d.signature, d.json FROM {_DESCRIPTIONS} d JOIN"
            " brick_results r ON r.signature = d.signature WHERE"
            " r.settings_key = ? AND r.fingerprint_id = ? ORDER BY d.signature",
            (settings.key(), fp.id),
        )
        return dict(rows)

    def described(self) -> set[str]:
        """The signatures of every brick the store keeps a description of."""
        return {
            r[0] for r in self._read(f"SELECT signature FROM {_DESCRIPTIONS}")
        }

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
        reference are milliseconds at this state, a reading of the
        workload `reference_workload` names.
        """
        found = self._reference(settings, fp)
        return found[0] if found else None

    def reference_workload(
        self, settings: RunSettings, fp: SystemFingerprint
    ) -> str | None:
        """The workload this machine and settings' state is a reading of,
        or None without a state (a state stored before workloads were
        named: `WORKLOAD_BEFORE_6`)."""
        found = self._reference(settings, fp)
        return found[1] if found else None

    def _reference(
        self, settings: RunSettings, fp: SystemFingerprint
    ) -> tuple[float, str] | None:
        """(state ms, workload) of this machine and settings, or None."""
        rows = self._read(
            "SELECT state_ms, COALESCE(workload, ?) FROM reference_states"
            " WHERE settings_key = ? AND fingerprint_id = ?",
            (WORKLOAD_BEFORE_6, settings.key(), fp.id),
        )
        return (float(rows[0][0]), rows[0][1]) if rows else None

    def put_reference_state(
        self,
        settings: RunSettings,
        fp: SystemFingerprint,
        state_ms: float,
        workload: str,
    ) -> float:
        """Keeps the first reference state of this machine and settings.

        A state already stored is kept (every timing scaled to it must
        stay comparable); returns the one in force.

        Args:
            state_ms: The state, ms.
            workload: The reference workload it is a reading of.

        Raises:
            StoreError: If the state is not finite and positive, the state
                in force is a reading of another workload (stored by
                another process meanwhile), or the file cannot be written.
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
                " fingerprint_id, state_ms, workload) VALUES (?, ?, ?, ?)",
                (settings.key(), fp.id, float(state_ms), workload),
            )

        self._write(insert)
        state, kept = self._reference(settings, fp)
        if kept != workload:
            raise StoreError(
                f"Store {self.path!r} holds a reference state of the "
                f"{kept!r} workload for these settings, not of {workload!r}: "
                "another process stored it meanwhile; run the command again."
            )
        return state

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

    def put_probe_suite(self, key: str, signatures: Iterable[str]) -> None:
        """Remembers the signatures the probe corpus cuts into under `key`
        (`dlbricks_tf.models.probes.cut_key`), so that a later campaign
        can tell its probes are all stored without cutting them again.
        What a cut gives holds on any machine and settings: it is kept once
        per key, in the `meta` table, and not merged."""
        text = json.dumps(sorted(set(signatures)))

        def insert(db: sqlite3.Connection) -> None:
            db.execute(
                "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                (_PROBE_SUITE + key, text),
            )

        self._write(insert)

    def probe_suite(self, key: str) -> list[str] | None:
        """The signatures kept by `put_probe_suite` under `key`, or None
        (also for a value that does not read back as a list of strings)."""
        rows = self._read(
            "SELECT value FROM meta WHERE key = ?", (_PROBE_SUITE + key,)
        )
        if not rows:
            return None
        try:
            signatures = json.loads(rows[0][0])
        except ValueError:
            return None
        if not isinstance(signatures, list) or not all(
            isinstance(s, str) for s in signatures
        ):
            return None
        return signatures

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

    def export_json(self, path: str | Path) -> None:
        """Writes {"schema_version", "bricks", "models", "failed_bricks"}."""
        merging.write_json(
            path, self.rows("brick"), self.rows("model"), self.failure_rows()
        )

    def export_csv(self, path: str | Path, kind: str = "brick") -> None:
        """Writes one kind of result as CSV; settings flattened to columns."""
        key = _TABLES[kind][1] if kind in _TABLES else kind
        merging.write_csv(path, self.rows(kind), key)

    def merge_from(self, other: str | Path) -> int:
        """Copies results absent here from another store file; the number
        added (see `dlbricks_tf.storing.merging.merge`)."""
        return merging.merge(self, other)
