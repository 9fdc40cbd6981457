"""A known law of latency for the predictor tests: small convolutional
networks drawn from a seed, and real stores of their bricks "timed" by
the law, so that what a predictor should find is known exactly."""

import keras
import numpy as np
from keras import layers

from dlbricks_tf.cutting import split
from dlbricks_tf.cutting.decompose import Cutter
from dlbricks_tf.estimating import features
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store
from tests.fakes import FP, SETTINGS


def law_ms(f) -> float:
    """The synthetic latency: a roofline, a cost per call, and a step."""
    ms = 0.002 * f["calls"] + f["flops"] / 5e9 + f["bytes"] / 2e9
    if f["max_kernel"] >= 5:  # Wide windows run slower than their FLOPs.
        ms *= 1.5
    return ms


def timing(ms):
    return Timing(ms, ms, ms, ms, 10, 0.98 * ms, 1.02 * ms, False)


def net(seed: int) -> keras.Model:
    """A small convolutional network drawn from a seed."""
    rng = np.random.default_rng(seed)
    size = int(rng.choice([8, 12, 16, 24]))
    x = inp = keras.Input((size, size, int(rng.choice([3, 4, 8]))))
    for _ in range(int(rng.integers(3, 6))):
        filters = int(rng.choice([4, 8, 16, 32]))
        kernel = int(rng.choice([1, 3, 5]))
        if rng.random() < 0.3:
            x = layers.DepthwiseConv2D(kernel, padding="same")(x)
        x = layers.Conv2D(filters, kernel, padding="same")(x)
        x = layers.BatchNormalization()(x)
        x = layers.ReLU()(x)
        if rng.random() < 0.4:
            x = layers.MaxPooling2D(int(rng.choice([2, 3])), padding="same")(x)
    x = layers.GlobalAveragePooling2D()(x)
    out = layers.Dense(int(rng.choice([4, 10, 32])))(x)
    return keras.Model(inp, out, name=f"net{seed}")


def law_store(path, graphs, skip=frozenset()):
    """A store of every G=1..2 brick of `graphs`, timed by the law."""
    store = Store(path)
    for graph, factory in graphs.values():
        cut = Cutter(graph, factory)
        for begin in range(len(graph.calls)):
            for end in (begin + 1, begin + 2):
                if end > len(graph.calls) or not split.buildable(
                    graph, begin, end
                ):
                    continue
                b = cut.brick(begin, end)
                if b.signature in skip:
                    continue
                ms = law_ms(features.brick_features(b, graph.specs))
                store.put(b.signature, SETTINGS, FP, timing(ms))
    return store
