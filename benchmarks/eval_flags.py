"""Flags of the scripts that evaluate a stored run and time nothing.

`benchmarks.cover_eval` and `benchmarks.predict_eval` read the store that
`benchmarks.accuracy` wrote (--db, the command line's flag, by default
<out>/store.sqlite as for the commands; they read a copy of it) and, if
given, that run's report.json (--report); --json writes their rows too.
"""

import json
import os

from absl import app, flags

from dlbricks_tf.cli import shared_flags

REPORT = flags.DEFINE_string(
    "report",
    None,
    "report.json of the run that wrote --db (optional): cover_eval then "
    "compares each estimate with the model timed in the same pass as its "
    "bricks; predict_eval takes the setup cost per brick from it.",
)
JSON = flags.DEFINE_string("json", None, "Write the rows here too.")
flags.declare_key_flag("db")


def store_path() -> str:
    """--db (default: <out>/store.sqlite); app.UsageError if no file."""
    db = shared_flags.DB.value or os.path.join(
        shared_flags.OUT.value, "store.sqlite"
    )
    if not os.path.isfile(db):
        raise app.UsageError(
            f"No store at {db!r}: pass --db, e.g. the store.sqlite that "
            "benchmarks.accuracy wrote under its --out."
        )
    return db


def write_json(rows) -> None:
    """Writes the rows to --json as JSON, if --json is given."""
    if JSON.value:
        with open(JSON.value, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
