"""Decomposition of keras.applications models: coverage and fidelity.

Heavy (five ImageNet-sized models at G = 1, 2, 3); Bazel tags it manual and
the README's test command runs it.
"""

import functools

import keras
import numpy as np
import pytest

import dlbricks_tf
from tests import models

_APPS = {
    "MobileNetV2": 224,
    "ResNet50": 224,
    "InceptionV3": 299,
    "DenseNet121": 224,
    "EfficientNetB0": 224,
}


@functools.cache
def _model(name: str) -> keras.Model:
    return getattr(keras.applications, name)(weights=None)


@pytest.mark.parametrize("granularity", [1, 2, 3])
@pytest.mark.parametrize("name", sorted(_APPS))
def test_application_bricks_reproduce_the_model(name, granularity):
    model = _model(name)
    size = _APPS[name]
    x = np.random.default_rng(1).uniform(0, 255, (1, size, size, 3))
    d = dlbricks_tf.decompose(model, granularity=granularity)
    models.check_decomposition(d, granularity)
    assert len(d.bricks) < d.num_calls or granularity == 1
    got, want = models.bricks_reproduce(model, d, [x.astype("float32")])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)


def test_repeated_blocks_share_signatures():
    d = dlbricks_tf.decompose(_model("ResNet50"), granularity=1)
    unique = {b.signature for b in d.bricks}
    # 176 calls, but ResNet50's identity blocks repeat: few are unique.
    assert d.num_calls == 176
    assert len(unique) < d.num_calls / 3


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
