"""--granularities: what the benchmarks that sweep G call --granularity.

The command line's --granularity (`dlbricks_tf.cli.model_flags`) takes one
G or a comma list; `benchmarks.accuracy` and `benchmarks.cover_eval` take
it under this name too (`--granularities=1,2,3`), and read it with
`model_flags.granularities()`.
"""

from absl import flags

from dlbricks_tf.cli import model_flags

GRANULARITIES = flags.DEFINE_alias("granularities", "granularity")
flags.declare_key_flag("granularity")


def set_default(values: list[str]) -> None:
    """Sets the default of --granularity (and of its alias, for --help)."""
    flags.FLAGS.set_default(model_flags.GRANULARITY.name, values)
    flags.FLAGS.set_default(GRANULARITIES.name, values)
