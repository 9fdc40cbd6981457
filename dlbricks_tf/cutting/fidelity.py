"""Checks that a model's bricks, run along the brick DAG, are the model.

Used by the tests and by anyone who wants to trust a decomposition: copy the
source model's weights into the bricks, evaluate the bricks in order, and
compare with the whole model's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras

from dlbricks_tf.cutting.brick import Brick, layer_name, source_layer
from dlbricks_tf.cutting.decompose import Decomposition


def copy_weights(model: keras.Model, brick: Brick, built: keras.Model) -> None:
    """Copies the weights of `model`'s layers into the built brick's."""
    # `operations`, not `get_layer`: raw keras.ops calls are not layers.
    fresh = {op.name: op for op in built.operations}
    for qualified in dict.fromkeys(brick.layers):
        target = fresh[layer_name(qualified)]
        if getattr(target, "weights", None):
            target.set_weights(source_layer(model, qualified).get_weights())


def evaluate(
    decomposition: Decomposition,
    built: Sequence[keras.Model],
    inputs: Sequence[Any],
) -> list[Any]:
    """Runs the bricks in order on the model's inputs.

    Args:
        decomposition: the model's decomposition.
        built: one built model per brick (`Brick.build`).
        inputs: the model's inputs, flattened as `keras.tree.flatten` does.

    Returns:
        The model's outputs, flattened.
    """
    # Keras refuses a list that mixes arrays and tensors: make all tensors.
    tensors = [keras.ops.convert_to_tensor(x) for x in inputs]
    values = dict(zip(decomposition.inputs, tensors, strict=True))
    for brick, model in zip(decomposition.bricks, built, strict=True):
        args = [values[t] for t in brick.input_ids]
        outs = model(args[0] if len(args) == 1 else args, training=False)
        outs = keras.tree.flatten(outs)
        values.update(zip(brick.output_ids, outs, strict=True))
    return [values[t] for t in decomposition.outputs]
