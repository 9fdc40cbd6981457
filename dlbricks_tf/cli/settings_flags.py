"""Flags of the run settings: batch size and thread pools.

`dlbricks_tf.machine.settings.RunSettings` takes them (`startup` puts the thread
pools in force). Apart from `shared_flags` so that the benchmark scripts
can take these without the command line's other flags.
"""

from __future__ import annotations

import os

from absl import flags

BATCH = flags.DEFINE_integer("batch_size", 1, "Batch size.", lower_bound=1)
INTRA = flags.DEFINE_integer(
    "intra_op_threads",
    None,
    "Threads one op may use (default: the physical cores).",
    lower_bound=1,
)
INTER = flags.DEFINE_integer(
    "inter_op_threads", 1, "Ops that may run at once.", lower_bound=1
)


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


for _name in ("intra_op_threads", "inter_op_threads"):
    flags.register_validator(
        _name,
        lambda v: v is None or v <= _usable_cpus(),
        message=f"--{_name} must be at most the {_usable_cpus()} CPUs this "
        "process may use",
    )
