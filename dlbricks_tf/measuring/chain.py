"""Chain timing: many bricks in one traced `tf.function`, timed per link.

A chain is a list of bricks (built Keras models) run one after another in
one traced function. One call of it is one pass over the chain: every brick
once, in order, with a `tf.timestamp()` between consecutive bricks. Each
brick starts after the stamp before it, and the stamp after it depends on
the brick's outputs, so the time between two stamps is the brick's, plus
what reading a stamp and handing over to the next op costs (the link cost).
One sample of every link is the mean over enough passes to last
`TARGET_SAMPLE_MS` (one pass for most chains).

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
    chain.result(sig, noisy=False).median_ms
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from dlbricks_tf import settings as settings_lib
from dlbricks_tf import stats
from dlbricks_tf.cutting import synthetic
from dlbricks_tf.measuring.timing import MeasurementError
from dlbricks_tf.measuring.timing_loop import pack_inputs

# Empty links per chain: enough for a steady median of the link cost.
EMPTY_LINKS = 8
# Wanted length of one sample: the stamps have microsecond resolution, so
# a short chain runs several passes per sample.
TARGET_SAMPLE_MS = 20.0
MAX_PASSES = 200


class ChainTimer:
    """Times a chain of bricks, one sample of every link per call.

    The first `sample()` traces the chain, warms it up and chooses the
    passes per sample. `samples(signature)` and `result(...)` give a
    brick's per-call samples and summary, link cost subtracted.

    Args:
        bricks: (key, built Keras model) pairs, in chain order; keys are
            unique (brick signatures).
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
    ) -> None:
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
        self._layout = _layout(len(bricks), empty_links)
        specs, arrays = [], []
        for i, (key, model) in enumerate(bricks):
            try:
                model_specs = synthetic.input_specs(model, settings.batch_size)
                if id_bounds and key in id_bounds:
                    values = synthetic.arrays_for_specs(
                        [(shape[1:], dtype) for shape, dtype in model_specs],
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
            specs.append(model_specs)
            arrays.append(values)
        # An outer dimension of 1: see `_chain_function`.
        self._inputs = [
            tf.constant(a[np.newaxis]) for values in arrays for a in values
        ]
        self._inputs.append(tf.zeros([1], tf.float32))  # The empty links'.
        self._run = _chain_function([m for _, m in bricks], specs, self._layout)
        self._concrete = None
        self._n = 0
        self._samples: list[list[float]] = [[] for _ in bricks]
        self._empty: list[float] = []
        self._prepare_s = 0.0
        self._sampling_s = 0.0

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
        """Samples taken of every link so far."""
        return len(self._empty) // max(self._layout.count(None), 1)

    @property
    def link_ms(self) -> float:
        """Per-call cost of one link (median of the empty links, ms)."""
        return stats.median(self._empty) if self._empty else 0.0

    def _call(self, n: int) -> np.ndarray:
        """Per-pass ms of every link (bricks and empty), over n passes."""
        if self._concrete is None:  # Traced once; called without the
            # polymorphic function's argument matching (2 of 22 ms a pass of
            # 64 MobileNetV2 bricks).
            self._concrete = self._run.get_concrete_function()
        sums = self._concrete(self._inputs)[0].numpy()
        for _ in range(n - 1):
            sums = sums + self._concrete(self._inputs)[0].numpy()
        return sums * 1e3 / n

    def _prepare(self) -> None:
        start = time.perf_counter()
        self._call(1)  # Traces and instantiates the function.
        once = self._call(1)  # Warm: allocations made, caches filled.
        per_pass = max(float(once.sum()), 1e-3)
        self._n = int(
            min(
                max(math.ceil(self._target_ms / per_pass), 1),
                MAX_PASSES,
            )
        )
        self._prepare_s = time.perf_counter() - start

    def sample(self) -> None:
        """Takes one sample of every link (`iterations` passes)."""
        if not self._n:
            self._prepare()
        start = time.perf_counter()
        per_call = self._call(self._n)
        self._sampling_s += time.perf_counter() - start
        brick = 0
        for owner, value in zip(self._layout, per_call.tolist(), strict=True):
            if owner is None:
                self._empty.append(value)
            else:
                self._samples[brick].append(value)
                brick += 1

    def samples(self, index: int) -> list[float]:
        """Per-call samples of brick `index` (link cost subtracted), ms."""
        link = self.link_ms
        return [max(v - link, 0.0) for v in self._samples[index]]

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
        return stats.summarize(
            values,
            noisy=noisy,
            calls_per_sample=self._n,
            loop_overhead_ms=self.link_ms,
        )


def _layout(bricks: int, empty: int) -> list[int | None]:
    """Chain order: brick indices with `empty` Nones spread among them.

    The empty links are evenly spaced, the first before any brick, so that
    they sample the link cost all along the chain.
    """
    empty = max(empty, 1)
    layout: list[int | None] = []
    placed = 0
    for i in range(bricks):
        while placed < empty and placed * bricks <= i * empty:
            layout.append(None)
            placed += 1
        layout.append(i)
    layout += [None] * (empty - placed)
    return layout


def _chain_function(
    models: Sequence[keras.Model],
    specs: Sequence[Sequence[tuple[tuple[int, ...], str]]],
    layout: Sequence[int | None],
):
    """Returns f(inputs) -> the duration of every link in one pass.

    `inputs` is the flat list of every brick's inputs, in chain order, then
    one float32 for the empty links, each with an outer dimension of 1
    (the slice that orders a link after its stamp). The result is float64
    seconds, one entry per link of `layout`.

    One pass, no `tf.while_loop`: a loop body captures every weight of
    every brick as a loop variable, which doubled both the trace and the
    first call (graph optimisation and instantiation) of a chain. Passes
    are repeated by the caller; what runs between two calls is outside
    every link.
    """
    signature = [
        tf.TensorSpec((1, *shape), dtype)
        for model_specs in specs
        for shape, dtype in model_specs
    ] + [tf.TensorSpec([1], tf.float32)]
    offsets = np.cumsum([0] + [len(s) for s in specs]).tolist()

    @tf.function(input_signature=[signature], autograph=False)
    def run(inputs):
        scalar = inputs[-1]
        # Slices share their index constants (see `_FirstElement`).
        first = _FirstElement()
        acc = tf.constant(0.0)
        stamp = tf.timestamp()
        stamps = []
        for owner in layout:
            # Untimed, between the previous link's end and this one's
            # start: write the link's inputs afresh, as the layer before it
            # would in a model (hot in cache, weights not). They depend on
            # the previous stamp by data.
            zero = tf.cast(tf.math.is_nan(stamp), tf.float32)
            if owner is None:
                flat = [scalar + zero]
            else:
                model = models[owner]
                flat = [
                    _plus(x, zero)
                    for x in inputs[offsets[owner] : offsets[owner + 1]]
                ]
            with tf.control_dependencies(flat):
                start = tf.timestamp()
            # The link starts after its stamp. Only a slice of each input
            # carries that edge: a control edge on the brick's own ops (or
            # on an Identity, which grappler removes and whose edges it
            # moves onto them) keeps grappler from fusing them (Sigmoid and
            # Mul into Swish), as it fuses them in a model.
            with tf.control_dependencies([start]):
                flat = [first.of_outer(x) for x in flat]
            if owner is None:
                outputs = [flat[0] + 1.0]
            else:
                outputs = tf.nest.flatten(
                    model(pack_inputs(model, flat), training=False)
                )
            # Grappler turns a stateless op whose outputs feed only control
            # edges into a NoOp, so a brick's outputs are consumed by data:
            # one element of each is added to the accumulator before the
            # stamp that ends its link is read.
            for y in outputs:
                element = first.of_all(y)
                if element.dtype != tf.float32:
                    element = tf.cast(element, tf.float32)
                acc = acc + element
            with tf.control_dependencies([acc]):
                stamp = tf.timestamp()
            stamps += [start, stamp]
        stamps = tf.stack(stamps)
        # The accumulator is returned, so that the bricks' outputs feed data
        # out of the function (see above).
        return stamps[1::2] - stamps[0::2], acc

    return run


class _FirstElement:
    """Static slices `x[0]` and `y[0, ..., 0]` over shared index constants."""

    def __init__(self) -> None:
        self._consts: dict[int, tuple[tf.Tensor, tf.Tensor, tf.Tensor]] = {}

    def _indices(self, rank: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        if rank not in self._consts:
            self._consts[rank] = (
                tf.zeros([rank], tf.int32),
                tf.ones([rank], tf.int32),
                tf.ones([rank], tf.int32),
            )
        return self._consts[rank]

    def of_outer(self, x: tf.Tensor) -> tf.Tensor:
        """`x[0]`: the outermost dimension dropped."""
        return tf.strided_slice(x, *self._indices(1), shrink_axis_mask=1)

    def of_all(self, y: tf.Tensor) -> tf.Tensor:
        """`y[0, ..., 0]`: the first element, as a scalar."""
        rank = len(y.shape)
        if rank == 0:
            return y
        return tf.strided_slice(
            y, *self._indices(rank), shrink_axis_mask=(1 << rank) - 1
        )


def _plus(x: tf.Tensor, zero: tf.Tensor) -> tf.Tensor:
    """A fresh copy of `x` that data-depends on `zero`.

    `zero` is 0.0 computed from a timestamp: no optimiser can prove a
    timestamp is not NaN, so the copy is never folded away.
    """
    if x.dtype == tf.bool:
        return tf.logical_or(x, tf.cast(zero, tf.bool))
    return x + (zero if x.dtype == tf.float32 else tf.cast(zero, x.dtype))
