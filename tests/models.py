"""Small Keras models that exercise every kind of graph decompose handles.

Each builder returns `(model, inputs)`: the model and a batch of inputs for
it, flattened in keras.tree order (the order `Decomposition.inputs` uses).
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
from keras import layers, ops

import dlbricks_tf
from dlbricks_tf.cutting import fidelity
from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import timing

_RNG = np.random.default_rng(0)


def settings(
    protocol: str | None = None,
) -> tuple[settings_lib.RunSettings, bool]:
    """The timing tests' run settings, and whether timers may check them.

    Batch 1, one intra- and one inter-op thread (the pools of the test
    process), oneDNN as TensorFlow's build has it. The pools are
    configured here if TensorFlow has run no op yet; if an earlier test
    ran one first with other pools, the flag is False and timers must not
    check the settings against the pools in force.

    Args:
        protocol: How bricks are timed, "chain" or "loop" (None: chains on
            the TF backend).

    Returns:
        (settings, checked).
    """
    try:
        process_lib.configure_threads(1, 1)
        checked = True
    except process_lib.ThreadPoolError:
        checked = False  # An earlier test ran TensorFlow first.
    run = settings_lib.RunSettings(
        1, 1, 1, onednn=process_lib.onednn_enabled(), protocol=protocol
    )
    return run, checked


def ort_settings(protocol: str | None = None) -> settings_lib.RunSettings:
    """`settings()` on ONNX Runtime: batch 1, one intra-op thread."""
    return dataclasses.replace(
        settings()[0],
        batch_size=1,
        intra_op_threads=1,
        backend="onnxruntime",
        protocol=protocol,
    )


# Sampling caps for ONNX Runtime timers in tests: what comes out is
# checked, never how fast.
ORT_FAST = timing.TimingOptions(
    min_samples=4,
    max_samples=8,
    max_seconds=0.5,
    target_sample_ms=0.2,
    samples_per_call=4,
    warmup_calls=1,
)


def _floats(*shape: int) -> np.ndarray:
    return _RNG.standard_normal(shape).astype("float32")


def chain() -> tuple[keras.Model, list]:
    """Conv, BN, ReLU twice over, then pooling and a classifier."""
    x = inp = keras.Input((16, 16, 3), name="image")
    for filters in (8, 8):
        x = layers.Conv2D(filters, 3, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
    x = layers.GlobalAveragePooling2D()(x)
    out = layers.Dense(4, activation="softmax")(x)
    return keras.Model(inp, out, name="chain"), [_floats(2, 16, 16, 3)]


def residual() -> tuple[keras.Model, list]:
    """Two residual blocks with an Add and a Concatenate of branches."""
    x = inp = keras.Input((8, 8, 4))
    for _ in range(2):
        y = layers.Conv2D(4, 3, padding="same", activation="relu")(x)
        y = layers.Conv2D(4, 1)(y)
        x = layers.Add()([x, y])
    a = layers.Conv2D(2, 1)(x)
    b = layers.MaxPooling2D(1)(x)
    out = layers.Concatenate()([a, b])
    return keras.Model(inp, out, name="residual"), [_floats(2, 8, 8, 4)]


def repeated() -> tuple[keras.Model, list]:
    """Branches that compute one thing twice, as NASNet's cells do.

    relu_b repeats relu_a, pad_b repeats pad_a once relu_b is merged, and
    pool_b repeats pool_a (and is a model output); conv_b (its own
    weights), pool_c (another config) and the ops' `add` (other inputs)
    repeat nothing.
    """
    inp = keras.Input((8, 8, 3))
    a = layers.Activation("relu", name="relu_a")(inp)
    b = layers.Activation("relu", name="relu_b")(inp)
    pa = layers.ZeroPadding2D(1, name="pad_a")(a)
    pb = layers.ZeroPadding2D(1, name="pad_b")(b)
    ca = layers.Conv2D(4, 3, name="conv_a")(pa)
    cb = layers.Conv2D(4, 3, name="conv_b")(pb)
    p1 = layers.MaxPooling2D(2, name="pool_a")(ca)
    p2 = layers.MaxPooling2D(2, name="pool_b")(ca)
    p3 = layers.MaxPooling2D(2, name="pool_c", padding="same")(cb)
    out = layers.Concatenate(name="concat")([p1, p2, keras.ops.add(p3, p1)])
    model = keras.Model(inp, [out, p2], name="repeated")
    return model, [_floats(2, 8, 8, 3)]


def shared_and_ops() -> tuple[keras.Model, list]:
    """A layer called three times, slicing and raw keras.ops calls."""
    inp = keras.Input((8,), name="features")
    dense = layers.Dense(8, activation="tanh", name="shared")
    x = dense(dense(inp))
    head = x[:, :4]
    tail = ops.concatenate([x[:, 4:], ops.square(head)], axis=-1)
    out = dense(tail) * 2.0 + 1.0
    model = keras.Model(inp, out, name="shared_and_ops")
    return model, [_floats(3, 8)]


def multi_io() -> tuple[keras.Model, list]:
    """Dict inputs (float, int ids, bool mask) and dict outputs."""
    feats = keras.Input((6,), name="feats")
    ids = keras.Input((5,), dtype="int32", name="ids")
    mask = keras.Input((5,), dtype="bool", name="mask")
    emb = layers.Embedding(20, 4)(ids)
    weights = ops.expand_dims(ops.cast(mask, "float32"), -1)
    pooled = ops.sum(emb * weights, axis=1)
    joined = layers.Concatenate()([pooled, layers.Dense(4)(feats)])
    score = layers.Dense(1, name="score")(joined)
    klass = layers.Dense(3, activation="softmax", name="klass")(joined)
    model = keras.Model(
        {"feats": feats, "ids": ids, "mask": mask},
        {"score": score, "klass": klass},
        name="multi_io",
    )
    inputs = {
        "feats": _floats(2, 6),
        "ids": _RNG.integers(0, 20, (2, 5)).astype("int32"),
        "mask": _RNG.integers(0, 2, (2, 5)).astype("bool"),
    }
    return model, keras.tree.flatten(inputs)


def transfer() -> tuple[keras.Model, list]:
    """A functional base network inside a transfer-learning Sequential."""
    base_in = keras.Input((16, 16, 3))
    x = layers.Conv2D(4, 3, name="stem")(base_in)
    x = layers.ReLU(name="stem_relu")(x)
    base = keras.Model(base_in, x, name="base")
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            base,
            layers.GlobalAveragePooling2D(),
            keras.Sequential(
                [layers.Dense(8, activation="relu"), layers.Dense(2)],
                name="head",
            ),
        ],
        name="transfer",
    )
    return model, [_floats(2, 16, 16, 3)]


def nested_functional() -> tuple[keras.Model, list]:
    """A functional block used twice (shared nested model) in a Functional."""
    block_in = keras.Input((6,))
    block_out = layers.Dense(6, activation="relu")(layers.Dense(6)(block_in))
    block = keras.Model(block_in, block_out, name="block")
    inp = keras.Input((6,))
    x = block(block(inp))
    out = layers.Dense(2)(keras.Sequential([layers.Dense(6)], name="seq")(x))
    return keras.Model(inp, out, name="nested"), [_floats(2, 6)]


def mixed_precision() -> tuple[keras.Model, list]:
    """Per-layer dtype policies: mixed_float16 layers in a float32 model."""
    inp = keras.Input((8,))
    x = layers.Dense(16, dtype="mixed_float16")(inp)
    x = layers.ReLU(dtype="mixed_float16")(x)
    out = layers.Dense(4, dtype="float32")(x)
    return keras.Model(inp, out, name="mixed"), [_floats(2, 8)]


@keras.saving.register_keras_serializable(package="dlbricks_test")
class Scale(layers.Layer):
    """A registered custom layer with a weight."""

    def __init__(self, factor: float = 2.0, **kwargs):
        super().__init__(**kwargs)
        self.factor = factor

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        return x * self.w * self.factor

    def get_config(self):
        return {**super().get_config(), "factor": self.factor}


@keras.saving.register_keras_serializable(package="dlbricks_test")
class LooseShape(layers.Layer):
    """Doubles its input but declares its last dimension open (None).

    A model using it runs, but a brick that reads its output has an input
    of open shape: it cannot be timed.
    """

    def call(self, x):
        return x * 2.0

    def compute_output_shape(self, input_shape):
        return (*input_shape[:-1], None)


def loose() -> keras.Model:
    """Dense, LooseShape, ReLU: the ReLU's brick cannot be timed."""
    inp = keras.Input((8,))
    x = LooseShape(name="loose_shape")(layers.Dense(8)(inp))
    return keras.Model(inp, layers.ReLU(name="relu")(x), name="loose")


class Counter(layers.Layer):
    """Passes its input through and counts its calls in a variable."""

    def build(self, input_shape):
        self.calls = self.add_weight(
            shape=(), initializer="zeros", dtype="int32", trainable=False
        )

    def call(self, x):
        self.calls.assign_add(1)
        return x


@keras.saving.register_keras_serializable(package="dlbricks_test")
class Failing(layers.Layer):
    """Raises when run; Keras builds it from `compute_output_shape`.

    A model using it builds, and so does its brick (Keras never calls it
    to find its output); timing either fails on the first trace.
    """

    def call(self, x):
        raise ValueError(f"Layer {self.name!r} fails when run.")

    def compute_output_shape(self, input_shape):
        return input_shape


def failing() -> keras.Model:
    """Dense, then a `Failing` layer: it cannot be timed."""
    inp = keras.Input((8,))
    x = layers.Dense(8)(inp)
    return keras.Model(inp, Failing(name="failing")(x), name="failing")


class Unregistered(layers.Layer):
    """A custom layer Keras cannot find from a file."""

    def call(self, x):
        return x + 1.0


def custom_layers() -> tuple[keras.Model, list]:
    """A registered custom layer and a Lambda layer."""
    inp = keras.Input((5,))
    x = Scale(3.0)(layers.Dense(5)(inp))
    out = layers.Lambda(lambda t: t * 0.5 + 1.0, name="halve")(x)
    return keras.Model(inp, out, name="custom"), [_floats(2, 5)]


def unregistered() -> keras.Model:
    inp = keras.Input((3,))
    return keras.Model(inp, Unregistered(name="plus_one")(inp), name="unreg")


ALL = {
    "chain": chain,
    "residual": residual,
    "shared_and_ops": shared_and_ops,
    "repeated": repeated,
    "multi_io": multi_io,
    "transfer": transfer,
    "nested_functional": nested_functional,
    "mixed_precision": mixed_precision,
    "custom_layers": custom_layers,
}


def check_decomposition(d: dlbricks_tf.Decomposition, granularity: int):
    """The structural invariants every decomposition must satisfy."""
    calls = [name for b in d.bricks for name in b.layers]
    assert len(calls) == d.num_calls, "every call in exactly one brick"
    # Fused, a step of G is a unit of up to 3 calls (split.fusion_units).
    most = granularity * (3 if d.fuse else 1)
    for i, b in enumerate(d.bricks):
        assert 1 <= len(b.layers) <= most
        assert all(j < i for j in d.dependencies[i]), "dependencies topological"
        assert len(b.inputs) == len(b.input_ids) >= 1
        assert b.output_ids


def bricks_reproduce(
    model: keras.Model,
    d: dlbricks_tf.Decomposition,
    inputs: list,
) -> tuple[list, list]:
    """Returns (brick outputs, model outputs) with weights copied over.

    The bricks are built with the batch size of `inputs`, get the source
    layers' weights, and run along the brick DAG.
    """
    batch = np.shape(inputs[0])[0]
    built = [b.build(batch_size=batch) for b in d.bricks]
    for brick, brick_model in zip(d.bricks, built, strict=True):
        fidelity.copy_weights(model, brick, brick_model)
    got = fidelity.evaluate(d, built, inputs)
    structured = (
        keras.tree.pack_sequence_as(model.input, inputs)
        if len(inputs) > 1
        else inputs[0]
    )
    want = keras.tree.flatten(model(structured, training=False))
    return [np.asarray(g) for g in got], [np.asarray(w) for w in want]
