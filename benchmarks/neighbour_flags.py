"""--neighbour and --neighbour_seed: a seeded noisy neighbour beside a run.

The benchmarks that time (accuracy, suite_flow) start
`benchmarks.noisy_neighbour` beside their timing with these flags.
"""

from absl import flags

from benchmarks import noisy_neighbour

NEIGHBOUR = flags.DEFINE_enum(
    "neighbour",
    "none",
    list(noisy_neighbour.KINDS),
    "Run a seeded noisy neighbour beside the timing "
    "(benchmarks.noisy_neighbour): a CPU spinner or a memory-bandwidth "
    "streamer on one core, in random 0.3-3 s bursts; its summary goes "
    "into the results.",
)
NEIGHBOUR_SEED = flags.DEFINE_integer(
    "neighbour_seed", 0, "Seed of the neighbour's bursts."
)
