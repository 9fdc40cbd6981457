"""A made-up machine and settings for tests that fill a store by hand, and
the rows a store file holds per table (what a refused merge must not move).
"""

import contextlib
import sqlite3

from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings

SETTINGS = RunSettings(batch_size=1, intra_op_threads=1, inter_op_threads=1)
FP = SystemFingerprint(
    cpu_model="Test CPU",
    physical_cores=1,
    logical_cpus=1,
    os="Linux",
    machine="x86_64",
    python="3.11",
    tensorflow="2.21",
    keras="3.15",
    onnxruntime="",
    onednn=True,
)


def table_counts(path) -> dict[str, int]:
    """Rows per table of the SQLite file at `path`."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        tables = [t for (t,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")]  # fmt: skip
        return {
            t: db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in tables
        }
