"""The in-graph loop that times K model calls in one `tf.function` call.

`looped_function(models, specs, copies, jit)` returns f(xs, n), which runs
n iterations of a `tf.while_loop`, each calling the model(s) once per input
copy. Every call adds the first element of each model output to a carried
accumulator: the model's work is then live (grappler cannot prune it) and
the calls are chained (control dependencies, `parallel_iterations=1`), so
the loop runs the model exactly K times, one after another. Grappler does
not hoist the loop-invariant body (checked: time grows linearly with K, see
`benchmarks/timing_overhead.py`); XLA does, so under `jit_compile` each
iteration also feeds its result into the next inputs.

`loop_overhead_ms` measures what the loop machinery costs per call, on an
empty model, so the harness can subtract it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import keras
import tensorflow as tf

from dlbricks_tf import settings as settings_lib
from dlbricks_tf import stats


def _pack(model: keras.Model, flat: list[tf.Tensor]):
    """Packs flat inputs into the structure the model was built with."""
    target = model
    if isinstance(model, keras.Sequential):
        target = getattr(model, "_functional", None) or model
    struct = getattr(target, "_inputs_struct", None)
    if struct is not None:
        return keras.tree.pack_sequence_as(struct, flat)
    return flat[0] if len(flat) == 1 else flat


def looped_function(
    models: Sequence[keras.Model],
    specs: Sequence[tuple[tuple[int, ...], str]],
    input_copies: int,
    jit_compile: bool = False,
):
    """Returns f(xs, n): n loop iterations of chained model calls.

    Each iteration makes max(len(models), input_copies) calls, call c on
    model c % len(models) with input copy c % input_copies. A static slice
    of the outermost dimension shares the copy's buffer; a slice by a
    tensor index (or `tf.gather`) would add a memcpy to every call, which
    doubled the time of a ReLU brick here.
    """
    signature = [
        [
            tf.TensorSpec((input_copies, *shape), dtype)
            for shape, dtype in specs
        ],
        tf.TensorSpec([], tf.int32),
    ]
    calls = max(len(models), input_copies)

    @tf.function(input_signature=signature, jit_compile=jit_compile)
    def run(xs, n):
        def body(i, acc, xs):
            for c in range(calls):
                model = models[c % len(models)]
                # Chain the calls: the next starts when this one is done.
                with tf.control_dependencies([acc]):
                    flat = [x[c % input_copies] for x in xs]
                    outputs = model(_pack(model, flat), training=False)
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
            return i + 1, acc, xs

        _, acc, _ = tf.while_loop(
            lambda i, acc, xs: i < n,
            body,
            (tf.constant(0), tf.constant(0.0), xs),
            parallel_iterations=1,
        )
        return acc

    return run


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


_LOOP_OVERHEAD_MS: dict[tuple[int, int, bool, int], float] = {}


def loop_overhead_ms(
    settings: settings_lib.RunSettings, copies: int = 1
) -> float:
    """Per-call cost of the timing loop around an empty model, in ms.

    Measured once per process, settings and number of input copies, on a
    model that returns its 1-element input, and cached.

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
        run = looped_function([empty], [((1, 1), "float32")], copies, key[2])
        xs = [tf.zeros((copies, 1, 1))]
        iterations = max(1, 2000 // copies)

        def call_ms(n: int) -> float:
            count = tf.constant(n, tf.int32)
            start = time.perf_counter()
            run(xs, count).numpy()
            return (time.perf_counter() - start) * 1e3

        call_ms(iterations)
        per_call = [
            (call_ms(iterations) - call_ms(0)) / (iterations * copies)
            for _ in range(7)
        ]
        _LOOP_OVERHEAD_MS[key] = max(stats.median(per_call), 0.0)
    return _LOOP_OVERHEAD_MS[key]
