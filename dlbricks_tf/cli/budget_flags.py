"""Flags of a brick campaign within a time budget (run, bench --models).

`--budget=SECONDS` times the bricks that narrow the models' estimates most
per second and predicts the others (`dlbricks_tf.running.budget`);
`--probe_count` says how many probes are timed first when the store lacks
them (and how many `bench --probes` times). Both are for run and bench
only (`main` refuses them elsewhere); each combination a budget cannot
take is refused in one line when the flags are parsed.
"""

from __future__ import annotations

from absl import flags

# --backend is validated with --budget: defined first.
from dlbricks_tf.cli import shared_flags  # noqa: F401
from dlbricks_tf.models import probes

BUDGET = flags.DEFINE_float(
    "budget",
    None,
    "run, bench --models: time the bricks within this many seconds, those "
    "that narrow the models' estimates most per second first, and predict "
    "the others with a latency model of this machine's stored bricks "
    "(the probes are timed first if --db lacks them, their time counted "
    "apart). run still measures every model end to end. Default: time "
    "every brick.",
)
PROBE_COUNT = flags.DEFINE_integer(
    "probe_count",
    probes.COUNT,
    "bench --probes, and --budget when --db lacks the probes: time the "
    "first this many probes only.",
    lower_bound=1,
    upper_bound=probes.COUNT,
)

flags.register_validator(
    "budget",
    lambda value: value is None or value > 0,
    message="--budget must be more than 0 seconds (leave it out to time "
    "every brick)",
)
flags.register_multi_flags_validator(
    ["budget", "backend"],
    lambda f: f["budget"] is None or f["backend"] == "tf",
    message="--budget times bricks on TensorFlow only; drop it or "
    "--backend=onnxruntime",
)
