"""Chain timing: many bricks in one traced `tf.function`, timed per link.

A chain is a list of bricks (built Keras models, or `BrickProgram`s of
`dlbricks_tf.cutting.program`) run one after another in one traced function.
One call of it is one pass over the chain: every brick once, in order,
with a `tf.timestamp()` between consecutive bricks. A brick reads the
outputs of the brick before it where they fit (`chain_graph.feed_plan`),
as a layer reads its predecessor's in a model, and fresh copies of
synthetic inputs otherwise.
Each brick starts after the stamp before it, and the stamp after it depends on
the brick's outputs, so the time between two stamps is the brick's, plus
what reading a stamp and handing over to the next op costs (the link cost).
One sample of every link is the mean over enough passes to last
`TARGET_SAMPLE_MS` (one pass for most chains). A sample whose links add
up to much more than the chain's usual (a neighbour's burst,
`dlbricks_tf.measuring.disturbed`), or during which other work took the
CPUs (`dlbricks_tf.measuring.crowding`), is left out of every link's
timing.

Why a chain and not a loop per brick: the trace, the grappler pass and the
instantiation of a `tf.function` cost a fixed 20-250 ms whatever it holds,
more than sampling a small brick to its precision; one function for tens
of bricks pays that once. And a brick that runs right after other bricks,
with their weights and inputs passing through the caches, is closer to a
layer inside a model than a brick looped alone on hot data.

The link cost is measured in the same chain: `empty_links` links that run
one trivial op (a scalar add) are spread among the bricks, and the median
of their per-call durations is subtracted from every brick's link. Inputs
are `tf.function` arguments (placeholders), never constants that grappler
could fold into a brick without weights.

XLA has no timestamp op: under `jit_compile` bricks keep their own loop
(`dlbricks_tf.measuring.timing.Timer`).

Example:
    chain = ChainTimer([(sig, brick.build(1)) for sig, brick in items],
                       settings)
    while not enough:
        chain.sample()
    chain.result(index, noisy=False).median_ms
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from dlbricks_tf import stats
from dlbricks_tf.cutting import synthetic
from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import chain_graph, crowding, disturbed
from dlbricks_tf.measuring.timing import MeasurementError

# Empty links per chain: enough for a steady median of the link cost.
EMPTY_LINKS = 8
# Wanted length of one sample: the stamps have microsecond resolution, so
# a short chain runs several passes per sample.
TARGET_SAMPLE_MS = 20.0
MAX_PASSES = 200


@dataclasses.dataclass(frozen=True)
class _Kept:
    """A chain's passes not disturbed, after `passes` passes: their
    indices, the median of their reference factors, and their empty
    links' median (scaled and unscaled) and mean (scaled), ms."""

    passes: int
    indices: list[int]
    factor: float
    link_ms: float
    link_mean_ms: float
    raw_link_ms: float


class ChainTimer:
    """Times a chain of bricks, one sample of every link per call.

    The first `sample()` traces the chain, warms it up and chooses the
    passes per sample. `samples(signature)` and `result(...)` give a
    brick's per-call samples and summary, link cost subtracted.

    Args:
        bricks: (key, built Keras model or `BrickProgram`) pairs, in chain
            order; keys are unique (brick signatures).
        settings: Run settings in force in this process (thread pools and
            oneDNN checked as by `dlbricks_tf.measuring.timing.Timer`).
        empty_links: Links of one trivial op spread among the bricks, for
            the link cost.
        target_sample_ms: Wanted duration of one sample.
        seed: Seed of the synthetic inputs.
        check_settings: Verify `settings` against the process first.
        id_bounds: {key: exclusive id bound per flat input} for bricks
            whose graph hides their Embeddings (a SavedModel in a
            `keras.layers.TFSMLayer`); others use their graph's bounds.
        feed: Feed a brick the outputs of the brick before it where they
            fit (see `chain_graph.feed_plan`); False: always fresh synthetic
            inputs.
        scale: A `reference.ReferenceScale` that every pass is scaled by,
            or None.

    Raises:
        MeasurementError: If a brick has open input shapes, the keys repeat
            or the settings cannot be honoured here.
    """

    def __init__(
        self,
        bricks: Sequence[tuple[str, keras.Model]],
        settings: settings_lib.RunSettings,
        *,
        empty_links: int = EMPTY_LINKS,
        target_sample_ms: float = TARGET_SAMPLE_MS,
        seed: int = 0,
        check_settings: bool = True,
        id_bounds: Mapping[str, Sequence[int | None]] | None = None,
        feed: bool = True,
        scale=None,
    ) -> None:
        self.scale = scale
        if not bricks:
            raise MeasurementError("A chain needs at least one brick.")
        keys = [key for key, _ in bricks]
        if len(set(keys)) != len(keys):
            raise MeasurementError(
                f"A chain holds each brick once. Received keys: {keys}"
            )
        if settings.backend != "tf" or settings.jit_compile:
            raise MeasurementError(
                "Chains time the TF backend without jit_compile. Received: "
                f"settings={settings.key()}"
            )
        if check_settings:
            settings_lib.check_threads(settings)
        self.settings = settings
        self.keys = tuple(keys)
        self._target_ms = target_sample_ms
        self._layout = chain_graph.layout(range(len(bricks)), empty_links)
        models = [model for _, model in bricks]
        specs = []
        for key, model in bricks:
            try:
                specs.append(synthetic.input_specs(model, settings.batch_size))
            except ValueError as e:
                raise MeasurementError(f"Brick {key}: {e}") from e
        plan = (
            chain_graph.feed_plan(models, specs)
            if feed
            else [[None] * len(s) for s in specs]
        )
        self.fed_inputs = sum(x is not None for p in plan for x in p)
        self._inputs = []
        slots: dict[tuple[int, int], int] = {}
        for i, (key, model) in enumerate(bricks):
            # The synthetic inputs: those the brick before does not feed.
            wanted = [j for j, fed in enumerate(plan[i]) if fed is None]
            if not wanted:
                continue  # Always fed by the brick before.
            try:
                if id_bounds and key in id_bounds:
                    values = synthetic.arrays_for_specs(
                        [(shape[1:], dtype) for shape, dtype in specs[i]],
                        list(id_bounds[key]),
                        settings.batch_size,
                        seed + i,
                    )
                else:
                    values = synthetic.synthetic_inputs(
                        model, settings.batch_size, seed=seed + i
                    )
            except ValueError as e:
                raise MeasurementError(f"Brick {key}: {e}") from e
            for j in wanted:
                slots[i, j] = len(self._inputs)
                # An outer dimension of 1: see `chain_graph.chain_function`.
                self._inputs.append(tf.constant(values[j][np.newaxis]))
        signature = [tf.TensorSpec(x.shape, x.dtype) for x in self._inputs]
        self._inputs.append(tf.zeros([1], tf.float32))  # The empty links'.
        # The reference is read right after the last pass of each sample.
        self._graph = getattr(scale, "graph", None)
        self._run = chain_graph.chain_function(
            models, self._layout, plan, slots, signature
        )
        self._reading = 0.0  # Ms of the last reading after a pass.
        self._concrete = None
        self._n = 0
        self._samples: list[list[float]] = [[] for _ in bricks]
        self._empty: list[float] = []
        # Unscaled, for `precise_samples`; and each pass's factor.
        self._raw: list[list[float]] = [[] for _ in bricks]
        self._raw_empty: list[float] = []
        self._factors: list[float] = []
        # Each pass's links summed, unscaled: what tells a disturbed pass.
        self._totals: list[float] = []
        # Whether other work took the CPUs during each sample (`crowding`).
        self._crowded: list[bool] = []
        self._kept_cache: _Kept | None = None
        self._prepare_s = 0.0
        self._sampling_s = 0.0
        # What `prepare_together` caught preparing it: raised by `sample`.
        self._failure: BaseException | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def iterations(self) -> int:
        """Passes over the chain per sample (0 before the first sample)."""
        return self._n

    @property
    def prepare_seconds(self) -> float:
        """Seconds the first `sample()` spent tracing and warming up."""
        return self._prepare_s

    @property
    def sampling_seconds(self) -> float:
        """Seconds spent in calls that took samples."""
        return self._sampling_s

    @property
    def sample_count(self) -> int:
        """Samples taken of every link so far, disturbed ones included
        (what the caps count)."""
        return len(self._totals)

    @property
    def kept_count(self) -> int:
        """Samples of every link not disturbed (what the floor counts)."""
        return len(self._kept())

    def _kept(self) -> list[int]:
        """The passes not disturbed (`disturbed.kept` on their totals)."""
        return self._kept_passes().indices

    def _kept_passes(self) -> _Kept:
        """What every brick reads of the passes not disturbed, worked out
        once per pass taken (the stopping rule reads every brick after
        each pass)."""
        if self._kept_cache is None or self._kept_cache.passes != len(
            self._totals
        ):
            kept = disturbed.kept(self._totals, crowded=self._crowded)
            per_pass = self._layout.count(None)

            def empty(values: Sequence[float]) -> list[float]:
                return [
                    v
                    for j in kept
                    for v in values[j * per_pass : (j + 1) * per_pass]
                ]

            scaled, raw = empty(self._empty), empty(self._raw_empty)
            self._kept_cache = _Kept(
                passes=len(self._totals),
                indices=kept,
                factor=(
                    stats.median([self._factors[j] for j in kept])
                    if kept
                    else 1.0
                ),
                link_ms=stats.median(scaled) if scaled else 0.0,
                link_mean_ms=math.fsum(scaled) / len(scaled) if scaled else 0.0,
                raw_link_ms=stats.median(raw) if raw else 0.0,
            )
        return self._kept_cache

    @property
    def link_ms(self) -> float:
        """Per-call cost of one link (median of the empty links, ms)."""
        return self._kept_passes().link_ms

    @property
    def link_mean_ms(self) -> float:
        """Mean per-call cost of one link (of the empty links, ms)."""
        return self._kept_passes().link_mean_ms

    def _call(self, n: int, read: bool = False) -> np.ndarray:
        """Per-pass ms of every link (bricks and empty), over n passes.

        With `read` (and a scale that reads after the timers' calls), the
        reference is read right after the last pass, into `_reading`.
        """
        self.trace()  # Once; called without the polymorphic function's
        # argument matching (2 of 22 ms a pass of 64 MobileNetV2 bricks).
        passes = [self._concrete(self._inputs)[0] for _ in range(n)]
        if read:
            self._reading = self._graph.after_call()
        return sum(p.numpy() for p in passes) * 1e3 / n

    def trace(self) -> None:
        """Traces the chain's function: Python, holding the GIL."""
        if self._concrete is None:
            self._concrete = self._run.get_concrete_function()

    def instantiate(self) -> None:
        """The first call: TensorFlow optimises the traced graph
        (grappler), instantiates it and makes its kernels and oneDNN
        primitives, in C++ with the GIL released (see `prepare_together`).
        """
        self._call(1)

    def warm(self) -> None:
        """A warm call (allocations made, caches filled) that sets the
        passes per sample."""
        once = self._call(1)
        per_pass = max(float(once.sum()), 1e-3)
        self._n = int(
            min(
                max(math.ceil(self._target_ms / per_pass), 1),
                MAX_PASSES,
            )
        )

    @property
    def prepared(self) -> bool:
        """Whether the chain is traced, instantiated and warm."""
        return self._n > 0

    def _prepare(self) -> None:
        start = time.perf_counter()
        with process_lib.collector_paused():  # A fifth of the trace.
            self.trace()
            self.instantiate()
            self.warm()
        self._prepare_s = time.perf_counter() - start

    def sample(self) -> None:
        """Takes one sample of every link (`iterations` passes).

        With a `scale`, the reference is read (right after the last pass
        when the scale reads after the timers' calls, else right before
        the passes) and every link is scaled to the machine's reference
        state (`dlbricks_tf.measuring.reference`).
        """
        if self._failure is not None:
            raise self._failure
        if not self._n:
            self._prepare()
        start = time.perf_counter()  # The reading counts as sampling.
        before = crowding.read()  # The reference's work is this process's.
        if self._graph is not None:
            raw = self._call(self._n, read=True).tolist()
            factor = self.scale.factor_of(self._reading)
        else:
            factor = self.scale.factor() if self.scale is not None else 1.0
            raw = self._call(self._n).tolist()
        after = crowding.read()
        self._sampling_s += time.perf_counter() - start
        self._factors.append(factor)
        self._crowded.append(crowding.crowded(before, after))
        self._totals.append(math.fsum(raw))
        for owner, value in zip(self._layout, raw, strict=True):
            if owner is None:
                self._empty.append(value * factor)
                self._raw_empty.append(value)
            else:
                self._samples[owner].append(value * factor)
                self._raw[owner].append(value)

    def samples(self, index: int) -> list[float]:
        """Per-call samples of brick `index` (link cost subtracted), ms.

        One per pass not disturbed.
        """
        link = self.link_ms
        return [max(v - link, 0.0) for v in self._scaled(index)]

    def _scaled(self, index: int) -> list[float]:
        """Brick `index`'s scaled samples of the passes not disturbed."""
        values = self._samples[index]
        return [values[j] for j in self._kept()]

    def precise_samples(self, index: int) -> list[float]:
        """What the stopping rule reads: `samples(index)` with one factor.

        The unscaled samples of the passes not disturbed (link cost
        subtracted) times the median of those passes' factors: on the
        common scale, with the spread of the samples alone. Each pass's
        own factor carries the reference's jitter (a reading moves ±30%
        from the next), which kept chains sampling 1.3-1.5x as long for a
        precision of the samples they already had; the stored timing
        still scales each pass by its own.
        """
        if not self._raw[index]:
            return []
        kept = self._kept_passes()
        raw, link = self._raw[index], kept.raw_link_ms
        return [max(raw[j] - link, 0.0) * kept.factor for j in kept.indices]

    def result(self, index: int, noisy: bool) -> stats.Timing:
        """Summary of brick `index`; `noisy` as the caller judged it.

        Raises:
            MeasurementError: If no sample was taken.
        """
        values = self.samples(index)
        if not values:
            raise MeasurementError(
                f"No samples of brick {self.keys[index]}; call sample()."
            )
        timing = stats.summarize(
            values,
            noisy=noisy,
            calls_per_sample=self._n,
            loop_overhead_ms=self.link_ms,
        )
        # The mean is what estimates add up, so the link cost comes off it
        # as a mean too: the empty links' median, subtracted from every
        # sample above, leaves their tail (a stamp's jitter, a thread's
        # wake-up) in every brick, which a sum of 100-250 bricks turns into
        # a few percent of a model. Unclamped, so a brick near the link
        # cost is not pushed up by samples clamped to 0.
        raw = [v - self.link_ms for v in self._scaled(index)]
        mean, half = stats.mean_interval(raw)
        excess = self.link_mean_ms - self.link_ms
        return dataclasses.replace(
            timing,
            mean_ms=max(mean - excess, 0.0),
            mean_half_ms=half if math.isfinite(half) else None,
        )


def prepare_together(chains: Sequence[ChainTimer]) -> None:
    """Prepares chains two at a time, one on each core.

    A chain's setup is two steps that each keep one core busy: its trace
    (Python, holding the GIL) and its first call (grappler, instantiation,
    kernels and oneDNN primitives: C++, the GIL released). So the first
    call of one chain runs on a worker thread while the next chain is
    traced on this one. Then each chain is warmed here, one at a time
    with nothing beside it, as the warm call sets its passes per sample.

    A chain whose trace or first call fails keeps its error, which its
    first `sample()` raises, as if it had been prepared there; the others
    are prepared. Each chain's `prepare_seconds` is a share of the
    wall-clock, in proportion to its bricks.
    """
    todo = [c for c in chains if not c.prepared and c._failure is None]
    if not todo:
        return
    start = time.perf_counter()

    def settle(chain: ChainTimer, future: concurrent.futures.Future) -> None:
        try:
            future.result()
        except Exception as e:  # Grappler and TF raise many types.
            chain._failure = e

    with (
        process_lib.collector_paused(),
        concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="chain-first-call"
        ) as worker,
    ):
        pending = None
        for chain in todo:
            try:
                chain.trace()  # Beside the first call of the one before.
            except Exception as e:  # Keras and TF raise many types.
                chain._failure = e
            if pending is not None:
                settle(*pending)
                pending = None
            if chain._failure is None:
                pending = (chain, worker.submit(chain.instantiate))
        if pending is not None:
            settle(*pending)
        for chain in todo:
            if chain._failure is None:
                try:
                    chain.warm()
                except Exception as e:  # As its first sample would.
                    chain._failure = e
    wall = time.perf_counter() - start
    links = sum(len(c) for c in todo)
    for chain in todo:
        chain._prepare_s = wall * len(chain) / links
