"""Bricks: runnable pieces of a model, rebuilt as fresh keras.Models."""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from dlbricks_tf.cutting import description, replay
from dlbricks_tf.cutting.graph import Call, TensorSpec


def layer_name(qualified: str) -> str:
    """The name a call's fresh layer gets inside a built brick.

    Keras forbids `/` in layer names, so `outer/inner` becomes
    `outer__inner`.
    """
    return qualified.replace("/", "__")


def source_layer(model: keras.Model, qualified: str) -> keras.Layer:
    """The layer `outer/inner` of `model`, through nested models."""
    layer = model
    for part in qualified.split("/"):
        layer = layer.get_layer(part)
    return layer


def live_layer(source: keras.Model, call: Call) -> Any | None:
    """`source`'s own layer for `call`, or None if it has none like it.

    The layer must have the call's class and config: a model built twice
    in one process can name its auto-named layers differently, and a
    weightless layer of another config would run silently.
    """
    try:
        layer = source_layer(source, call.name)
    except ValueError:  # Not a layer of `source` (a raw keras.ops call).
        return None
    if type(layer).__name__ != call.class_name:
        return None
    if layer.get_config() != call.layer_config.get("config"):
        return None
    return layer


@dataclasses.dataclass(frozen=True)
class Brick:
    """A run of consecutive layer calls that builds into a `keras.Model`.

    Attributes:
        layers: qualified names of the calls it covers, in order (a layer
            called twice appears twice).
        signature: equal for bricks that are the same modulo names and
            weights (see `signature.py`).
        inputs: specs of the tensors it reads, without the batch dimension.
        outputs: specs of the tensors it exposes (None where unrecorded).
        class_names: the class of each call.
        input_ids: ids of the model tensors it reads, in `inputs` order.
        output_ids: ids of the model tensors it exposes, in `outputs` order.
        specs: the spec of every tensor id of the graph it was cut from
            (what `describe` reads; empty for a brick made without one).
    """

    layers: tuple[str, ...]
    signature: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec | None, ...]
    class_names: tuple[str, ...]
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    calls: tuple[Call, ...] = dataclasses.field(repr=False, compare=False)
    factory: replay.LayerFactory = dataclasses.field(repr=False, compare=False)
    specs: tuple[TensorSpec | None, ...] = dataclasses.field(
        default=(), repr=False, compare=False
    )

    def describe(self) -> str:
        """What the brick computes, as JSON without names or weights.

        See `dlbricks_tf.cutting.description`: what a store keeps beside
        the brick's timing, so that a predictor can learn from it.
        """
        return description.describe(self, self.specs)

    def build(
        self,
        batch_size: int | None = 1,
        *,
        anonymous: bool = False,
        source: keras.Model | None = None,
    ) -> keras.Model:
        """A fresh, runnable `keras.Model` of this brick, with new weights.

        Each source layer becomes one fresh layer named `layer_name(...)` of
        its qualified name; a layer called twice in the brick is shared, as
        in the source model.

        Args:
            batch_size: the batch dimension of the inputs (None: dynamic).
            anonymous: name the layers `layer_0`, `layer_1`, ... in call
                order (a shared layer keeps one name), the inputs
                `input_0`, ... and the model `brick`, so that no name of
                the source model is in the built model (for a suite that is
                shared, see `dlbricks_tf.portable.export`).
            source: the model in memory this brick was cut from (or one
                built the same way): its own layers, weights included, are
                called instead of fresh ones wherever one has the call's
                class and config. That skips creating and initialising the
                weights, half of what a build costs (timing a model and
                its bricks in one process, see
                `dlbricks_tf.running.job`). Not with `anonymous`.

        Returns:
            A model taking one tensor (or a list, for several inputs) and
            returning one tensor (or a list).

        Example:
            >>> d = dlbricks_tf.decompose(model, granularity=3)
            >>> m = d.bricks[0].build(batch_size=8)
        """
        if batch_size is not None and batch_size < 1:
            raise ValueError(
                f"batch_size must be 1 or more. Received: {batch_size}"
            )
        tensors = {}
        inputs = []
        for i, (t, spec) in enumerate(
            zip(self.input_ids, self.inputs, strict=True)
        ):
            x = keras.Input(
                batch_shape=(batch_size, *spec.shape),
                dtype=spec.dtype,
                name=f"input_{i}" if anonymous else None,
            )
            tensors[t] = x
            inputs.append(x)
        if anonymous and source is not None:
            raise ValueError("A brick built from `source` keeps its names.")
        layers: dict[str, object] = {}
        for c in self.calls:
            op = layers.get(c.name)
            if op is None and source is not None:
                op = live_layer(source, c)
            if op is None:
                name = f"layer_{len(layers)}" if anonymous else None
                op = self.factory.create(c, name=name or layer_name(c.name))
            layers[c.name] = op
            outs = replay.call(op, c.node, [tensors[t] for t in c.inputs])
            for slot, t in zip(c.output_slots, c.outputs, strict=True):
                tensors[t] = outs[slot]
        outputs = [tensors[t] for t in self.output_ids]
        return keras.Model(
            inputs=inputs[0] if len(inputs) == 1 else inputs,
            outputs=outputs[0] if len(outputs) == 1 else outputs,
            name="brick" if anonymous else f"brick_{self.signature}",
        )
