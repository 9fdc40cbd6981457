"""`dlbricks merge`: copies the results of store files into --db.

Example: `dlbricks merge --db=all.sqlite a.sqlite b.sqlite`.
"""

from __future__ import annotations

import os

from absl import app

from dlbricks_tf.cli import exits, outputs


def merge(stores: list[str]) -> None:
    """Merges every store file of `stores` into --db, printing the counts."""
    _, db, _ = outputs.paths()
    if not stores:
        raise app.UsageError(
            "merge needs the store files to copy from: "
            "`dlbricks merge --db=all.sqlite a.sqlite b.sqlite`."
        )
    for path in stores:
        if not os.path.isfile(path):
            raise exits.Fail(
                f"Store {path!r} does not exist: check the path.", 1
            )
        if os.path.abspath(path) == os.path.abspath(db):
            raise app.UsageError(f"Cannot merge {path!r} into itself (--db).")
    with outputs.open_store(db) as store:
        for path in stores:
            added = store.merge_from(path)
            print(f"{path}: {added} result(s) added")
    print(f"Store: {db}")
