"""In-graph loops that time K model calls inside one `tf.function` call.

`sampled_function(models, specs, copies, jit)` returns f(xs, n, s), which
takes s samples of n loop iterations (each calling the model(s) once per
input copy) in one call, timed inside the graph with `tf.timestamp()`, and
returns the s durations. The `tf.function` dispatch is outside every
sample, so one call yields many samples whatever its overhead.

It is one `tf.while_loop` of s * n iterations (a second loop per sample
doubled the tracing cost, which dominates a brick campaign) that reads a
timestamp after every iteration and keeps the one ending each sample.
Ordering: every call adds the first element of each model output to a
carried accumulator, so the model's work is live (grappler cannot prune it)
and the calls are chained (a control dependency on each call's input
slices, `parallel_iterations=1`);
the loop runs the model exactly s * n times, one after another. Each
timestamp has a control dependency on the accumulator after the
iteration's last call, and the next call depends on the timestamp through
the accumulator (a data dependency grappler cannot fold). Grappler does
not hoist the loop-invariant body (time grows linearly with n); XLA does,
so under `jit_compile` each iteration also feeds its result into the next
inputs, and only a sample's n iterations are compiled (XLA has no
timestamp op).

`looped_function` is the same loop without timestamps (timed from Python);
`loop_overhead_ms` measures what the machinery (timestamps included) costs
per call, on an empty model, so the harness can subtract it.
"""

from __future__ import annotations

from collections.abc import Sequence

import keras
import tensorflow as tf

from dlbricks_tf import stats
from dlbricks_tf.machine import settings as settings_lib


def pack_inputs(model: keras.Model, flat: list[tf.Tensor]):
    """Packs flat inputs into the structure the model was built with."""
    target = model
    if isinstance(model, keras.Sequential):
        target = getattr(model, "_functional", None) or model
    struct = getattr(target, "_inputs_struct", None)
    if struct is not None:
        return keras.tree.pack_sequence_as(struct, flat)
    return flat[0] if len(flat) == 1 else flat


def _signature(specs, input_copies: int) -> list[tf.TensorSpec]:
    return [
        tf.TensorSpec((input_copies, *shape), dtype) for shape, dtype in specs
    ]


def _body(models: Sequence[keras.Model], input_copies: int, jit_compile: bool):
    """Returns body(acc, xs) -> (acc, xs): one iteration of chained calls.

    An iteration makes max(len(models), input_copies) calls, call c on
    model c % len(models) with input copy c % input_copies. A static slice
    of the outermost dimension shares the copy's buffer; a slice by a
    tensor index (or `tf.gather`) would add a memcpy to every call, which
    doubled the time of a ReLU brick here.
    """
    calls = max(len(models), input_copies)

    def body(acc, xs):
        for c in range(calls):
            model = models[c % len(models)]
            # Chain the calls: the next starts when this one is done. Only
            # the input slices carry that edge, as a chain's links do. A
            # model called inside the block gave each of its weight reads
            # and constants a control edge too, and ran 3-13% slower than
            # in its own graph (`docs/measuring.md`).
            with tf.control_dependencies([acc]):
                flat = [x[c % input_copies] for x in xs]
            outputs = model(pack_inputs(model, flat), training=False)
            for y in tf.nest.flatten(outputs):
                if jit_compile:  # XLA would compute element 0 alone.
                    used = tf.reduce_sum(tf.cast(y, tf.float32))
                else:
                    used = tf.cast(tf.reshape(y, [-1])[0], tf.float32)
                acc = acc + used
        if jit_compile:
            # XLA hoists loop-invariant work out of the loop: make the
            # inputs depend on the previous iteration.
            xs = [_touch(x, acc) for x in xs]
        return acc, xs

    return body


def _iterations(
    models: Sequence[keras.Model], input_copies: int, jit_compile: bool
):
    """Returns loop(xs, n, acc) -> (acc, xs): n chained iterations."""
    body = _body(models, input_copies, jit_compile)

    def loop(xs, n, acc):
        _, acc, xs = tf.while_loop(
            lambda i, acc, xs: i < n,
            lambda i, acc, xs: (i + 1, *body(acc, xs)),
            (tf.constant(0), acc, xs),
            parallel_iterations=1,
        )
        return acc, xs

    return loop


def _touch(x: tf.Tensor, acc: tf.Tensor) -> tf.Tensor:
    """x with its first element changed by a value only known at run time.

    `is_nan(acc)` is 0 in practice but no compiler can prove it, so the
    next iteration's inputs depend on this one's outputs; XLA updates the
    loop-carried buffer in place.
    """
    flag = tf.math.is_nan(acc)
    first = tf.reshape(x, [-1])[:1]
    if x.dtype == tf.bool:
        new = tf.logical_xor(first, tf.reshape(flag, [1]))
    else:
        new = first + tf.reshape(tf.cast(flag, x.dtype), [1])
    index = tf.zeros([1, len(x.shape)], tf.int32)
    return tf.tensor_scatter_nd_update(x, index, new)


def looped_function(
    models: Sequence[keras.Model],
    specs: Sequence[tuple[tuple[int, ...], str]],
    input_copies: int,
    jit_compile: bool = False,
):
    """Returns f(xs, n) -> accumulator: n iterations of chained calls.

    See `_iterations` for what one iteration calls.
    """
    loop = _iterations(models, input_copies, jit_compile)
    signature = [_signature(specs, input_copies), tf.TensorSpec([], tf.int32)]

    @tf.function(input_signature=signature, jit_compile=jit_compile)
    def run(xs, n):
        acc, _ = loop(xs, n, tf.constant(0.0))
        return acc

    return run


def zero_after(t: tf.Tensor) -> tf.Tensor:
    """0.0, computed from `t`: adding it makes a data dependency on `t`.

    No optimiser can prove a timestamp is not NaN, so this is not folded.
    """
    return tf.cast(tf.math.is_nan(t), tf.float32)


def sampled_function(
    models: Sequence[keras.Model],
    specs: Sequence[tuple[tuple[int, ...], str]],
    input_copies: int,
    jit_compile: bool = False,
):
    """Returns f(xs, n, s) -> (durations, acc): s in-graph timed samples.

    Each sample is n iterations of chained model calls (as in
    `looped_function`) between two `tf.timestamp()` reads. `durations` is a
    float64 vector of s durations in seconds (microsecond resolution);
    `acc` is the accumulator that keeps the calls live.

    Args:
        models: Models called in turn (weight copies).
        specs: (shape, dtype) of each flat input, batch dimension included.
        input_copies: Input copies the iterations rotate through; each
            input of f has this extra outermost dimension.
        jit_compile: Compile the iterations with XLA.
    """
    if jit_compile:
        # XLA has no timestamp op: a step is a compiled loop of n
        # iterations, timed from outside; there are s steps.
        loop = tf.function(
            _iterations(models, input_copies, True), jit_compile=True
        )

        def unit(acc, xs, n):
            return loop(xs, n, acc)

        def per_sample(n):
            return tf.constant(1)
    else:
        # A step is one iteration; there are s * n steps.
        body = _body(models, input_copies, False)

        def unit(acc, xs, n):
            return body(acc, xs)

        def per_sample(n):
            return n

    signature = [
        _signature(specs, input_copies),
        tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.int32),
    ]

    def sampled(xs, n, s):
        # A timestamp after every step goes to slot ceil((i + 1) / steps)
        # of `stamps`: the last write to slot j is the end of sample j,
        # the start of sample j + 1. Slot 0 is the start of sample 0.
        steps = per_sample(n)
        first = tf.timestamp()
        stamps = tf.fill([s + 1], first)  # Samples of n = 0 last 0.

        def step(i, acc, xs, stamps):
            acc, xs = unit(acc, xs, n)
            with tf.control_dependencies([acc]):  # After the last call.
                now = tf.timestamp()
            slot = (i + steps) // steps
            stamps = tf.tensor_scatter_nd_update(stamps, [[slot]], [now])
            return i + 1, acc + zero_after(now), xs, stamps

        _, acc, _, stamps = tf.while_loop(
            lambda i, acc, xs, stamps: i < steps * s,
            step,
            (tf.constant(0), zero_after(first), xs, stamps),
            parallel_iterations=1,
        )
        return stamps[1:] - stamps[:-1], acc

    return tf.function(sampled, input_signature=signature, autograph=False)


_LOOP_OVERHEAD_MS: dict[tuple[int, int, bool, int], float] = {}


def loop_overhead_ms(
    settings: settings_lib.RunSettings, copies: int = 1
) -> float:
    """Per-call cost of the timing loop around an empty model, in ms.

    Measured in-graph once per process, settings and number of input
    copies, on a model that returns its 1-element input: the median
    duration of samples of many iterations, minus that of empty samples,
    per call. Cached.

    Args:
        settings: Run settings in force.
        copies: Input copies per loop iteration.

    Returns:
        Milliseconds per model call that the loop machinery costs.
    """
    key = (
        settings.intra_op_threads,
        settings.inter_op_threads,
        settings.jit_compile,
        copies,
    )
    if key not in _LOOP_OVERHEAD_MS:
        inputs = keras.Input((1,), batch_size=1)
        empty = keras.Model(inputs, keras.layers.Identity()(inputs))
        run = sampled_function([empty], [((1, 1), "float32")], copies, key[2])
        xs = [tf.zeros((copies, 1, 1))]
        iterations = max(1, 2000 // copies)

        def median_ms(n: int) -> float:
            durations, _ = run(xs, tf.constant(n), tf.constant(15))
            return stats.median(durations.numpy().tolist()) * 1e3

        median_ms(iterations)  # Traces and warms up.
        per_call = [
            (median_ms(iterations) - median_ms(0)) / (iterations * copies)
            for _ in range(3)
        ]
        _LOOP_OVERHEAD_MS[key] = max(stats.median(per_call), 0.0)
    return _LOOP_OVERHEAD_MS[key]
