"""Tests for dlbricks_tf/measuring/timing_loop.py.

The loops must run the model exactly K times per sample: a stateful counter
layer (which grappler never prunes or hoists) counts the calls. No speed is
asserted.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

from dlbricks_tf.cutting import synthetic
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import timing_loop
from tests import models


def _counted(width=4):
    x = keras.Input((width,), batch_size=1)
    counter = models.Counter()
    return keras.Model(x, layers.Dense(2)(counter(x))), counter


@pytest.mark.parametrize("copies", [1, 3])
def test_loop_calls_the_model_n_times_per_copy(copies):
    model, counter = _counted()
    run = timing_loop.looped_function([model], [((1, 4), "float32")], copies)
    xs = [tf.zeros((copies, 1, 4))]
    for n in (0, 1, 7):
        before = int(counter.calls.numpy())
        run(xs, tf.constant(n)).numpy()
        assert int(counter.calls.numpy()) - before == n * copies


@pytest.mark.parametrize("copies", [1, 3])
def test_sampled_calls_the_model_s_times_k(copies):
    model, counter = _counted()
    run = timing_loop.sampled_function([model], [((1, 4), "float32")], copies)
    xs = [tf.zeros((copies, 1, 4))]
    for n, s in ((0, 3), (1, 1), (7, 5), (3, 0)):
        before = int(counter.calls.numpy())
        durations, _ = run(xs, tf.constant(n), tf.constant(s))
        assert int(counter.calls.numpy()) - before == s * n * copies
        assert durations.shape == (s,) and durations.dtype == tf.float64
        assert np.all(durations.numpy() >= 0)


def test_sampled_durations_bracket_the_calls():
    # A layer records the time of each call: every call of sample j must
    # fall between the sample's start and end timestamps.
    class _Clock(layers.Layer):
        def build(self, input_shape):
            self.times = tf.Variable(tf.zeros([64], tf.float64))
            self.count = tf.Variable(0)

        def call(self, x):
            with tf.control_dependencies([x]):
                now = tf.timestamp()
            self.times.scatter_nd_update([[self.count]], [now])
            self.count.assign_add(1)
            return x + tf.cast(tf.math.is_nan(now), x.dtype)

    x = keras.Input((4,), batch_size=1)
    clock = _Clock()
    model = keras.Model(x, layers.Dense(2)(clock(x)))
    run = timing_loop.sampled_function([model], [((1, 4), "float32")], 1)
    n, s = 4, 5
    durations, _ = run([tf.zeros((1, 1, 4))], tf.constant(n), tf.constant(s))
    durations = durations.numpy()
    times = clock.times.numpy()[: n * s].reshape(s, n)
    assert int(clock.count.numpy()) == n * s
    assert np.all(np.diff(times.ravel()) >= 0)
    # Each sample spans at least from its first to its last call...
    assert np.all(durations >= times[:, -1] - times[:, 0])
    # ...and ends after its last call: from the first call, sample j's
    # last call comes within the first j + 1 durations (1 us of rounding).
    ends = np.cumsum(durations)
    assert np.all(times[:, -1] - times[0, 0] <= ends + 1e-6)


def test_the_model_takes_no_control_edge():
    # Only the input slices wait for the previous call by a control edge.
    # Made inside that block, every weight read and constant of the model
    # took one, and its kernels ran 8-40% slower than in its own graph
    # (`docs/measuring.md`).
    model, _ = _counted()
    run = timing_loop.sampled_function([model], [((1, 4), "float32")], 1)
    spec = tf.TensorSpec([], tf.int32)
    concrete = run.get_concrete_function(
        [tf.TensorSpec((1, 1, 4), tf.float32)], spec, spec
    )
    library = concrete.graph.as_graph_def().library.function
    reads = [
        node
        for function in library
        for node in function.node_def
        if node.op == "ReadVariableOp"
    ]
    assert reads
    for node in reads:
        assert not [x for x in node.input if x.startswith("^")], node


def test_weight_copies_are_called_in_turn():
    (a, count_a), (b, count_b) = _counted(), _counted()
    run = timing_loop.looped_function([a, b], [((1, 4), "float32")], 1)
    run([tf.zeros((1, 1, 4))], tf.constant(5)).numpy()
    assert int(count_a.calls.numpy()) == int(count_b.calls.numpy()) == 5
    sampled = timing_loop.sampled_function([a, b], [((1, 4), "float32")], 1)
    sampled([tf.zeros((1, 1, 4))], tf.constant(2), tf.constant(3))
    assert int(count_a.calls.numpy()) == int(count_b.calls.numpy()) == 11


def test_multiple_inputs_and_outputs_are_packed():
    ids = keras.Input((3,), dtype="int32", batch_size=1, name="ids")
    feats = keras.Input((2,), batch_size=1, name="feats")
    emb = layers.Flatten()(layers.Embedding(5, 2)(ids))
    model = keras.Model({"ids": ids, "feats": feats}, [emb, feats * 2.0])
    specs = synthetic.input_specs(model, 1)  # In model.inputs order.
    run = timing_loop.looped_function([model], specs, 1)
    xs = [tf.ones((1, *shape), dtype) for shape, dtype in specs]
    # Each call adds first(emb) + 2.0; twice that after two iterations.
    once = float(run(xs, tf.constant(1)).numpy())
    assert float(run(xs, tf.constant(2)).numpy()) == pytest.approx(2 * once)
    sampled = timing_loop.sampled_function([model], specs, 1)
    _, acc = sampled(xs, tf.constant(2), tf.constant(3))
    assert float(acc.numpy()) == pytest.approx(6 * once)


@pytest.mark.parametrize("sampled", [False, True])
def test_jit_loop_is_not_hoisted(sampled):
    x = keras.Input((8, 8, 2), batch_size=1)
    conv = keras.Model(x, layers.Conv2D(2, 3)(x))
    make = (
        timing_loop.sampled_function if sampled else timing_loop.looped_function
    )
    run = make([conv], [((1, 8, 8, 2), "float32")], 1, jit_compile=True)
    xs = [tf.ones((1, 1, 8, 8, 2))]

    def acc(n):
        if sampled:
            return float(run(xs, tf.constant(n), tf.constant(1))[1].numpy())
        return float(run(xs, tf.constant(n)).numpy())

    # The accumulator sums every output, so K iterations give K times one.
    one = acc(1)
    assert one != 0
    assert acc(4) == pytest.approx(4 * one, rel=1e-4)


def test_touch_changes_nothing_when_acc_is_finite():
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(2, 3))
    same = timing_loop._touch(x, tf.constant(3.0))
    assert np.array_equal(same.numpy(), x.numpy())
    changed = timing_loop._touch(x, tf.constant(float("nan")))
    assert changed.numpy()[0, 0] == 1.0


def test_loop_overhead_is_cached_and_non_negative():
    settings = settings_lib.RunSettings(1, 1, 1)
    first = timing_loop.loop_overhead_ms(settings)
    assert first >= 0 and np.isfinite(first)
    assert timing_loop.loop_overhead_ms(settings) == first


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
