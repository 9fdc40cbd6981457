"""Samples taken while a neighbour held the machine: told apart and left out.

On a shared VM a neighbour takes a core, or the memory bus, for a second
or two at a time, then lets go. Every op that runs meanwhile is slowed
alike: beside a seeded neighbour spinning one core in bursts of 0.3-3 s,
a chain's pass ran 1.55x its usual time in median and the whole model
sampled at the same moments 1.45x (2026-12-06, 13 models; 540 pairs of a
model's sample and a pass within 0.15 s of it, correlation 0.84). The
reference workload read beside every sample does not follow such bursts
(beside that neighbour one reading moved by 17% from the next and
followed the call before it with a correlation of 0.33), so its
window's median follows only what lasts longer. A timer that averages
its samples through bursts then needs many more of them (a chain's mean
over a mix of 1x and 1.6x passes converges slowly): beside that
neighbour the chains sampled 3-5x as long as on a quiet machine, and
past their whole models' own timing.

So a timing is of the machine undisturbed, and a sample whose own timer
saw it run much slower than its usual is left out: `kept` keeps a
sample (a chain's pass, by the time of all its links together; a whole
model's sample) at most `RATIO` times the lower quartile of its timer's
samples so far. The rule reads each timer's own samples, so it needs no
other clock and is the same for bricks and models; a neighbour busy all
the time leaves the lower quartile where it puts it, and nothing is left
out. A quiet machine's passes seldom reach 1.4x their lower quartile
(3.7% of the 13 models' chain passes, 2026-12-06): those are left out
of the bricks and of the models alike. Leaving out what is slower than
1.25x left out more of a quiet run; 1.5x kept more of a neighbour's
bursts. A sample longer than the bursts holds a piece of one every
time, so its time cannot tell it: a sample during which other work took
the CPUs (`dlbricks_tf.measuring.crowding`, from /proc/stat) is left
out as well, unless every sample was. What neither rule tells apart: a
brick whose own time has two modes (`docs/measuring.md`).

Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

# A sample more than RATIO times its timer's lower quartile is disturbed.
RATIO = 1.4
# With fewer samples than this, every sample is kept: a lower quartile of
# two or three samples says nothing of what the timer usually reads.
MIN_SAMPLES = 4


def kept(
    raw_ms: Sequence[float],
    ratio: float = RATIO,
    *,
    crowded: Sequence[bool] | None = None,
) -> list[int]:
    """Indices of the samples not taken as disturbed, in order.

    Args:
        raw_ms: A timer's samples so far, unscaled (as they ran: the
            reference factors would blur a burst into its neighbours).
        ratio: Samples above `ratio` times the lower quartile are left
            out.
        crowded: Per sample, whether other work took the CPUs while it
            ran (`dlbricks_tf.measuring.crowding`); None for none.

    Returns:
        Those at most `ratio` times the lower quartile (every index if
        there are fewer than `MIN_SAMPLES` samples or the lower quartile
        is not positive), less the crowded ones. If that leaves none,
        the crowded ones are kept: a neighbour busy all the time left no
        other sample, and the lower quartile follows it.
    """
    n = len(raw_ms)
    if crowded is not None and len(crowded) != n:
        raise ValueError(f"{len(crowded)} crowded flags for {n} samples")
    indices = list(range(n))
    if n >= MIN_SAMPLES:
        quartile = sorted(raw_ms)[(n - 1) // 4]
        if quartile > 0:
            bound = ratio * quartile
            indices = [i for i in indices if raw_ms[i] <= bound]
    if crowded is not None:
        uncrowded = [i for i in indices if not crowded[i]]
        if uncrowded:
            return uncrowded
    return indices


@dataclasses.dataclass
class Tally:
    """Samples taken and left out as disturbed, summed over timers.

    A run reports the share of its chains' passes and of its whole
    models' samples that it left out: how disturbed the machine was.
    """

    taken: int = 0
    left_out: int = 0

    def add(self, taken: int, left_out: int) -> None:
        """Counts one timer's (or campaign's) samples."""
        self.taken += taken
        self.left_out += left_out

    @property
    def share(self) -> float | None:
        """Left out / taken; None if nothing was taken."""
        return self.left_out / self.taken if self.taken else None
