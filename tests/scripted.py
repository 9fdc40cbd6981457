"""A timer on given samples, for tests of the sampling protocol every
timer shares (`dlbricks_tf.measuring.sampling.AdaptiveSampling`)."""

from dlbricks_tf.measuring import sampling


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
