"""dlbricks_tf: benchmark Keras models on CPUs from their unique bricks.

DLBricks (ICPE '20) cuts each model into small runnable pieces of at most G
layer calls ("bricks"), keeps the unique ones across a corpus, times those
once per machine and rebuilds each model's latency from them.

Example:
    >>> import keras, dlbricks_tf
    >>> m = keras.applications.InceptionV3(weights=None)
    >>> d = dlbricks_tf.decompose(m, granularity=3)
    >>> for b in d.bricks:
    ...     print(b.layers, b.signature)
    >>> brick_model = d.bricks[5].build(batch_size=1)
"""

from dlbricks_tf.brick import Brick
from dlbricks_tf.decompose import Decomposition, decompose
from dlbricks_tf.errors import DecompositionError, Error, LoadError
from dlbricks_tf.graph import TensorSpec

__all__ = [
    "Brick",
    "Decomposition",
    "DecompositionError",
    "Error",
    "LoadError",
    "TensorSpec",
    "decompose",
]
