"""Timers whose samples a test decides: a timer on given samples, for
tests of the sampling protocol every timer shares
(`dlbricks_tf.measuring.sampling.AdaptiveSampling`), and a real chain
with one pass changed (`chain_with_pass`)."""

import dlbricks_tf
from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.measuring import chain, sampling
from tests import models


class ScriptedTimer(sampling.AdaptiveSampling):
    """The shared protocol on given samples: one per `sample()`.

    `during` (if given) is called with the number of samples so far
    inside each batch, where the timer's readings around the batch see
    what it does.
    """

    def __init__(self, values, options, during=None):
        self.options = options
        self._values = iter(values)
        self._during = during
        self._samples, self._factors, self._crowded = [], [], []
        self._sampling_s = self._prepare_s = 0.0
        self._copies, self._n, self._s = 1, 1, 1

    def _take(self, count):
        if self._during is not None:
            self._during(len(self._samples))
        return [next(self._values) for _ in range(count)]

    dispatch_ms = overhead_per_call_ms = 0.0
    _what = "a scripted timer"


def chain_with_pass(call_at, change, scale=None):
    """The tests' small chain model's G=1 bricks in one `ChainTimer`,
    prepared and sampled once, whose `call_at`-th call from here is
    changed: `change(call)` returns what stands for it (a function of
    the call's own arguments, calling `call` or not).

    Returns:
        (bricks, timer).
    """
    settings, checked = models.settings()
    d = dlbricks_tf.decompose(models.chain()[0], granularity=1)
    suite = suite_lib.build_suite({"m": d})
    bricks = [(e.signature, e.brick.build(1)) for e in suite.entries]
    timer = chain.ChainTimer(
        bricks, settings, check_settings=checked, scale=scale
    )
    timer.sample()  # Prepared, and a first pass taken.
    real_call, calls = timer._call, 0

    def call(n, read=False):
        nonlocal calls
        calls += 1
        if calls == call_at:
            return change(real_call)(n, read)
        return real_call(n, read)

    timer._call = call
    return bricks, timer
