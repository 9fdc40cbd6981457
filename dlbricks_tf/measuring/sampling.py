"""The sampling protocol every timer shares, without TensorFlow.

A timer takes batches of samples (`sample()`) until the median's 95%
interval is within `TimingOptions.precision` of the median, or a cap on
samples or sampling time is reached (the result is then flagged noisy):
`AdaptiveSampling` is that rule, and the rest every timer shares (the
first batch prepares the timer, `restart` forgets the samples but not what
was prepared, `result` summarises). Both the rule and the summary read
only the samples not disturbed (`dlbricks_tf.measuring.disturbed`: none
much slower than the timer's lower quartile, a neighbour's burst, and
none whose batch other work crowded, `dlbricks_tf.measuring.crowding`).
`time_interleaved` samples several timers in rounds, so that
measurements that will be compared (bricks and their whole model) are
taken close together in time. `model_and_brick_options`
builds the options of whole models and of bricks the way every front end
does (the command line and the benchmarks).

The TF harness (`dlbricks_tf.measuring.timing.Timer`, which re-exports these
names) and the ONNX Runtime one (`dlbricks_tf.measuring.ort_timing.OrtTimer`)
both build on this module; it imports no TensorFlow, so neither does ORT timing
through it.

Example:
    options, brick_options = model_and_brick_options("chain", precision=0.02)
    timings = time_interleaved([model_timer, *brick_timers])
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from dlbricks_tf import errors, stats
from dlbricks_tf.measuring import crowding, disturbed

# Samples a brick takes (in a chain: passes over it) before its models'
# precision is judged: half the models' 10. A model's estimate sums tens
# to hundreds of bricks, whose errors partly cancel; with a floor of 10,
# 54-69% of the 40's bricks at G=1 stopped at it, their models already
# precise (docs/measuring.md).
BRICK_MIN_SAMPLES = 5


class MeasurementError(errors.Error):
    """A model cannot be timed under the requested settings."""


@dataclasses.dataclass(frozen=True)
class TimingOptions:
    """How hard to try for a precise timing.

    Attributes:
        precision: Stop once the median's CI half-width is within this
            fraction of the median.
        absolute_precision_ms: Or once the half-width is at most this many
            ms (tiny bricks need not be known to `precision`).
        min_samples: Never stop before this many samples.
        max_samples: Stop (noisy) after this many samples.
        max_seconds: Stop (noisy) after this much sampling time.
        target_sample_ms: Choose K so one sample lasts about this long.
        samples_per_call: Samples taken by one `tf.function` call (S), at
            most; fewer if they would last over `max_call_ms`.
        max_call_ms: Wanted upper bound of one call's duration, so that
            interleaved timers take turns often; at least one sample.
        max_calls_per_sample: Upper bound on K.
        warmup_calls: Untimed one-iteration samples after tracing.
        input_copies: Random input sets the loop rotates through.
        weight_copies: Copies of the model, each with its own fresh
            weights, the loop rotates through: more copies keep a small
            model's weights from staying hot in cache, as a whole model's
            do not. The model itself counts as one.
        subtract_loop_overhead: Subtract the per-iteration cost of the
            loop machinery, measured on an empty model.
        seed: Seed of the synthetic inputs.
        chain_links: Bricks in one chain, at most (chain protocol, see
            `dlbricks_tf.measuring.campaign`); there `precision` is that of each
            model's estimate and the caps are per chain.
        chain_order: "model" (the models' order) or "shuffled".
        keep_pace: Chains sampled beside a whole model keep sampling,
            to their caps, until the model's own timing is done, so that
            both cover the same rounds (`dlbricks_tf.measuring.campaign`;
            off by default: it costs campaign time for a gain within the
            noise, docs/measuring.md).
    """

    precision: float = 0.02
    absolute_precision_ms: float = 0.001
    min_samples: int = 10
    max_samples: int = 200
    max_seconds: float = 10.0
    target_sample_ms: float = 1.0
    samples_per_call: int = 20
    max_call_ms: float = 40.0
    max_calls_per_sample: int = 10_000
    warmup_calls: int = 2
    input_copies: int = 1
    weight_copies: int = 1
    subtract_loop_overhead: bool = True
    seed: int = 0
    chain_links: int = 128
    chain_order: str = "model"
    keep_pace: bool = False


def model_and_brick_options(
    protocol: str,
    *,
    input_copies: int = 1,
    weight_copies: int = 1,
    chain_links: int = 128,
    chain_order: str = "model",
    keep_pace: bool = False,
    brick_max_samples: int | None = None,
    brick_max_seconds: float | None = None,
    brick_min_samples: int | None = None,
    **model_options,
) -> tuple[TimingOptions, TimingOptions]:
    """The options of whole models and of bricks, from a front end's flags.

    Copies of inputs and weights are for bricks only: they give a brick
    what it sees inside a whole model (an input and weights not left in
    cache by its own previous call); a whole model needs none, and its
    trace would grow by the number of copies. Under `protocol="loop"`
    (each brick timed alone; ONNX Runtime always times so) the brick caps
    apply per brick, never above the models' caps; in a chain the caps are
    per chain, the models' own.

    Args:
        protocol: "chain" or "loop", how bricks are timed.
        input_copies, weight_copies, chain_links, chain_order, keep_pace:
            Those of the bricks (see `TimingOptions`).
        brick_max_samples, brick_max_seconds: Caps per brick under
            "loop" (None: the models' caps).
        brick_min_samples: Samples per brick (in a chain: passes) before
            its precision is judged, at most the bricks' `max_samples`
            (None: the models' `min_samples`).
        **model_options: Other `TimingOptions` fields, for both.

    Returns:
        (options of whole models, options of bricks).

    Example:
        >>> models, bricks = model_and_brick_options(
        ...     "loop", max_samples=100, brick_max_samples=60, input_copies=4
        ... )
        >>> models.input_copies, bricks.input_copies, bricks.max_samples
        (1, 4, 60)
    """
    options = TimingOptions(**model_options)
    bricks = dataclasses.replace(
        options,
        input_copies=input_copies,
        weight_copies=weight_copies,
        chain_links=chain_links,
        chain_order=chain_order,
        keep_pace=keep_pace,
    )
    if protocol == "loop":
        bricks = dataclasses.replace(
            bricks,
            max_samples=_within(brick_max_samples, options.max_samples),
            max_seconds=_within(brick_max_seconds, options.max_seconds),
        )
    if brick_min_samples is not None:
        bricks = dataclasses.replace(
            bricks, min_samples=min(brick_min_samples, bricks.max_samples)
        )
    return options, bricks


def _within(cap, most):
    """`cap`, at most `most` (`most` when there is no cap)."""
    return most if cap is None else min(cap, most)


class Sampler(Protocol):
    """What `time_interleaved` needs of a timer (`Timer`, `OrtTimer`)."""

    @property
    def done(self) -> bool:
        """Whether sampling should stop."""

    def sample(self) -> list[float]:
        """Takes one batch of samples; returns them, ms per call."""

    def result(self) -> stats.Timing:
        """Summarises the samples."""


class AdaptiveSampling:
    """What every timer shares (`Timer`, `ort_timing.OrtTimer`).

    The stopping rule: samples are taken in batches of at most S until the
    median's 95% interval is within the options' precision (`settled`) or
    a cap on samples or sampling time is reached (`capped`). The first
    `sample()` prepares the timer (`_prepare`: warm-up, overheads, K and
    S), timed as `prepare_seconds`; each one then takes a batch
    (`_take`), timed towards `max_seconds`. `restart` forgets the samples
    and keeps what was prepared.

    Subclasses set `options`, `_samples` (ms per call), `_factors` (each
    sample's reference factor, empty), `_crowded` (whether other work
    took the CPUs during each sample's batch, `crowding`; empty),
    `_sampling_s`, `_prepare_s`,
    `_copies` (model calls per loop iteration), `_n` (loop
    iterations per sample, 0 until prepared) and `_s` (samples per batch),
    and define `_prepare`, `_take`, `dispatch_ms`, `overhead_per_call_ms`
    and `_what`.
    """

    options: TimingOptions
    # Whether `settled` and `result` leave out the disturbed samples
    # (`disturbed`). ONNX Runtime's timers keep every sample: its chains
    # are split by ORT's profiler and keep all theirs, and a whole model
    # is compared with them.
    leaves_out_disturbed = True
    # A `reference.ReferenceScale`, or None: each batch is scaled to the
    # machine's reference state, read right before it.
    scale = None
    # The `reference.Reference` the subclass reads right after its calls
    # (`Timer`, when its scale reads after them): `_take` then leaves the
    # reading's ms in `_reading`, and the batch is scaled by it.
    _graph = None
    _reading = 0.0
    _samples: list[float]
    _factors: list[float]
    _crowded: list[bool]
    _sampling_s: float
    _prepare_s: float
    _copies: int
    _n: int
    _s: int

    @property
    def samples(self) -> tuple[float, ...]:
        """Samples so far, in ms per call."""
        return tuple(self._samples)

    @property
    def settled(self) -> bool:
        """Whether the median is known to the requested precision.

        Judged on the samples not disturbed, unscaled, times the median
        of their batches' factors (see `ChainTimer.precise_samples`): on
        the common scale, with the samples' own spread, not the
        reference's jitter.
        """
        samples, factors = self._samples, self._factors
        if factors and len(factors) == len(samples):
            keep = self._kept()
            factors = [factors[i] for i in keep]
            common = stats.median(factors)
            samples = [
                self._samples[i] / self._factors[i] * common for i in keep
            ]
        return stats.is_settled(
            samples,
            self.options.precision,
            self.options.min_samples,
            self.options.absolute_precision_ms,
        )

    def _kept(self) -> list[int]:
        """Indices of the samples not disturbed (`disturbed.kept`), read
        on the unscaled samples; every index if the timer keeps all."""
        if not self.leaves_out_disturbed:
            return list(range(len(self._samples)))
        return disturbed.kept(
            [v / f for v, f in zip(self._samples, self._factors, strict=True)],
            crowded=self._crowded,
        )

    @property
    def kept_samples(self) -> tuple[float, ...]:
        """The samples a result summarises: those not disturbed, ms."""
        if len(self._factors) != len(self._samples):
            return tuple(self._samples)
        return tuple(self._samples[i] for i in self._kept())

    @property
    def capped(self) -> bool:
        """Whether a sampling cap has been reached."""
        return (
            len(self._samples) >= self.options.max_samples
            or self._sampling_s >= self.options.max_seconds
        )

    @property
    def done(self) -> bool:
        """Whether sampling should stop (settled or capped)."""
        return self.settled or self.capped

    @property
    def calls_per_iteration(self) -> int:
        """Model calls per loop iteration (the number of copies)."""
        return self._copies

    @property
    def calls_per_sample(self) -> int:
        """K, the model calls per sample (0 before the first sample)."""
        return self._n * self._copies

    @property
    def samples_per_call(self) -> int:
        """S, the samples one `sample()` takes (0 before the first)."""
        return self._s

    @property
    def prepare_seconds(self) -> float:
        """Wall-clock seconds the first `sample()` spent before sampling.

        Warm-up, measuring the overheads and choosing K and S (and, for
        TensorFlow, tracing): a fixed cost per timer, whatever the
        sampling caps (0 before).
        """
        return self._prepare_s

    @property
    def sampling_seconds(self) -> float:
        """Wall-clock seconds spent taking samples (since `restart`)."""
        return self._sampling_s

    @property
    def dispatch_ms(self) -> float:
        """Cost of one call that no sample contains (0 before sampling)."""
        raise NotImplementedError

    @property
    def overhead_per_call_ms(self) -> float:
        """Machinery cost subtracted from each sample, per model call."""
        raise NotImplementedError

    def _choose_sizes(
        self,
        warm_ms: Sequence[float],
        durations_ms: Callable[[int, int], Sequence[float]],
        empty_ms: float = 0.0,
    ) -> None:
        """Sets `_n` (loop iterations per sample) and `_s` (samples per
        batch), the one rule of every timer.

        K is guessed from the fastest warm-up iteration, then corrected
        once from the median of two samples at the guessed length (which
        also warms the loop up at its final length), so that a sample
        lasts `target_sample_ms`. A long sample (a whole model) is taken a
        few at a time, so that interleaved timers sample it at many
        moments, not in one burst.

        Args:
            warm_ms: Durations of single warm-up iterations, ms.
            durations_ms: (iterations, count) -> the durations of `count`
                samples of that many iterations, ms.
            empty_ms: What a sample of no iteration lasts (XLA's loop).
        """
        opts = self.options
        target_ms = opts.target_sample_ms
        most = max(1, opts.max_calls_per_sample // self._copies)

        def iterations_for(sample_ms: float, n: int) -> int:
            per_iteration = max((sample_ms - empty_ms) / n, 1e-4)
            return int(min(max(math.ceil(target_ms / per_iteration), 1), most))

        n = iterations_for(min(warm_ms), 1)
        if n > 1:
            n = iterations_for(stats.median(durations_ms(n, 2)), n)
        self._n = n
        sample_ms = max(target_ms, min(warm_ms) * n)
        by_time = int(opts.max_call_ms // sample_ms)
        self._s = max(1, min(opts.samples_per_call, by_time))

    def restart(self):
        """Forgets the samples, keeps what was prepared; returns self.

        For a second measurement of a brick that did not settle: a fresh
        series of samples at another moment, without paying the trace and
        warm-up again (most of a small brick's cost).
        """
        self._samples = []
        self._factors = []
        self._crowded = []
        self._sampling_s = 0.0
        return self

    def sample(self) -> list[float]:
        """Takes one batch of samples; returns them, ms per call.

        The batch has S samples, fewer if `max_samples` is closer; the
        first call prepares the timer first. With a `scale`, the reference
        is read (right after the batch's call, when the timer reads after
        its calls; else right before it) and the batch is
        scaled to the machine's reference state
        (`dlbricks_tf.measuring.reference`).
        """
        if not self._n:
            start = time.perf_counter()
            try:
                self._prepare()
            finally:
                self._prepare_s = time.perf_counter() - start
        count = self._batch_count()
        graph = self._graph is not None
        factor = 1.0
        if self.scale is not None and not graph:
            factor = self.scale.factor()
        before = crowding.read() if self.leaves_out_disturbed else None
        start = time.perf_counter()
        batch = self._take(count)
        self._sampling_s += time.perf_counter() - start
        after = crowding.read() if before is not None else None
        crowded = crowding.crowded(before, after)
        if graph:
            factor = self.scale.factor_of(self._reading)
        if factor != 1.0:
            batch = [v * factor for v in batch]
        self._factors += [factor] * len(batch)  # For `settled`.
        self._crowded += [crowded] * len(batch)
        self._samples += batch
        return batch

    def result(self) -> stats.Timing:
        """Summarises the samples not disturbed; noisy unless settled.

        `dispatch_ms` is the cost of one call that no sample contains (see
        `dlbricks_tf.estimating.estimate`); `loop_overhead_ms` all that was
        subtracted per call.

        Raises:
            MeasurementError: If no sample was taken.
        """
        if not self._samples:
            raise MeasurementError(
                f"No samples of {self._what}; call sample()."
            )
        return stats.summarize(
            self.kept_samples,
            noisy=not self.settled,
            calls_per_sample=self.calls_per_sample,
            dispatch_ms=self.dispatch_ms,
            loop_overhead_ms=self.overhead_per_call_ms,
        )

    @property
    def _what(self) -> str:
        """What is timed, as error messages name it ("model 'x'")."""
        raise NotImplementedError

    def _prepare(self) -> None:
        """Warms up, measures the overheads and chooses K (`_n`) and S."""
        raise NotImplementedError

    def _take(self, count: int) -> list[float]:
        """Takes `count` samples; returns them, ms per call, overheads out."""
        raise NotImplementedError

    def _batch_count(self) -> int:
        """Samples the next batch takes: S, fewer if `max_samples` is near."""
        left = self.options.max_samples - len(self._samples)
        return max(min(self._s, left), 1)


def time_interleaved(timers: Sequence[Sampler]) -> list[stats.Timing]:
    """Samples timers in rounds until each is done; returns their results.

    Each round takes one batch of samples of every timer that is not done
    yet, so measurements that will be compared (bricks and their whole
    model) are taken close together in time on a noisy machine.

    Args:
        timers: Timers to sample: `Timer`s, `OrtTimer`s, or any `Sampler`.

    Returns:
        One `Timing` per timer, in order.
    """
    pending = list(timers)
    while pending:
        for timer in pending:
            timer.sample()
        pending = [t for t in pending if not t.done]
    return [t.result() for t in timers]
