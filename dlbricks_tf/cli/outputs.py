"""Where a command writes: --out, --db, --logdir, and the store.

A folder that cannot be made, or a store that must exist and does not,
ends the command in one line naming the flag to change.
"""

from __future__ import annotations

import os

from dlbricks_tf.cli import exits, shared_flags
from dlbricks_tf.storing.store import Store


def paths() -> tuple[str, str, str]:
    """(--out, --db, --logdir), the last two defaulting under --out."""
    out = shared_flags.OUT.value
    db = shared_flags.DB.value or os.path.join(out, "store.sqlite")
    logdir = shared_flags.LOGDIR.value or os.path.join(out, "tensorboard")
    return out, db, logdir


def make_dirs(*paths: str) -> None:
    """Creates folders; one line (`exits.Fail`) if one cannot be."""
    for p in paths:
        if not p:
            continue
        reason = ""
        try:
            os.makedirs(p, exist_ok=True)
        except OSError as e:
            reason = e.strerror
            up = p
            while up and not os.path.exists(up):
                up = os.path.dirname(up.rstrip(os.sep))
            if up and not os.path.isdir(up):
                reason = f"{up!r} is a file, not a folder"
        if not reason and not os.access(p, os.W_OK | os.X_OK):
            reason = "it is not writable"
        if reason:
            raise exits.Fail(
                f"Cannot create folder {p!r}: {reason}; choose another "
                "--out, --db or --logdir.",
                1,
            )


def open_store(db: str, must_exist: bool = False):
    """Opens the store at `db` (its folder made), or fails in one line."""

    if must_exist and not os.path.isfile(db):
        raise exits.Fail(
            f"Store {db!r} does not exist: run `dlbricks bench` (or `run`) "
            "first, or pass --db.",
            1,
        )
    make_dirs(os.path.dirname(db))
    return Store(db)
