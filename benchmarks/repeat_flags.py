"""--repeats: how often a micro-benchmark repeats each measurement.

What one measurement is, and how its repeats are summed up, is each
script's own: `decompose_corpus` takes the minimum of rounds of
constructing and decomposing a model, `instance_spread` compares the
medians one timer measures again, `timing_overhead` takes the median of
single calls (15 of them unless --repeats says otherwise).
"""

from absl import flags

REPEATS = flags.DEFINE_integer(
    "repeats",
    3,
    "How many times each measurement is repeated (what one measurement "
    "is: the script's docstring).",
    lower_bound=1,
)
