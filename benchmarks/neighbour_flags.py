"""--neighbour and --neighbour_seed: a seeded noisy neighbour beside a run.

The benchmarks that time (accuracy, suite_flow, budget_sweep) start
`benchmarks.noisy_neighbour` beside their timing with these flags;
`run_dlbricks` runs one dlbricks command beside it.
"""

import subprocess
import sys
import time

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


def run_dlbricks(*args: str, neighbour: bool = True) -> float:
    """Runs one dlbricks command in a process of its own, beside the
    --neighbour (unless `neighbour` is False); its seconds. A command
    that fails ends the benchmark with its stderr."""
    command = [sys.executable, "-m", "tools.dlbricks", *args]
    print("$ dlbricks " + " ".join(args), flush=True)
    start = time.perf_counter()
    kind = NEIGHBOUR.value if neighbour else "none"
    with noisy_neighbour.running(kind, NEIGHBOUR_SEED.value):
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(
            f"dlbricks {args[0]} failed ({done.returncode}):\n{done.stderr}"
        )
    return time.perf_counter() - start
