"""A brick as a program over its layers, not a `keras.Model`.

`Brick.build` makes a `keras.Model`: input layers, a symbolic replay of
every call and a Functional graph, 7-8 ms a brick at G=1, a fifth of a
chain campaign's setup, and none of it runs when the chain is timed. A
chain needs less of a brick: the shapes and dtypes of its inputs and
outputs, and a function that calls its layers on tensors inside the
chain's trace. `BrickProgram` is that: it calls the brick's layers (the
source model's own, weights and all, where it has them) in the brick's
order, with the recorded arguments, as a Functional model's `call` does
(`training=False` where a layer takes it), so the traced ops are those of
the built brick.

It has what the chain, the synthetic inputs and the memory check read of a
model: `name`, `inputs` and `outputs` (specs with the batch dimension),
`weights`, and `__call__`. A call whose layer the source does not have (no
source, a raw `keras.ops` call, a layer of another config) gets a fresh
layer from its config, built by one symbolic call on a bare
`keras.KerasTensor`. A brick with an integer input (ids with bounds, which
the synthetic inputs read from a Functional graph) is built as a
`keras.Model`.

Example:
    runnable = program(brick, 1, model)  # A BrickProgram or a keras.Model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras

from dlbricks_tf.cutting import replay
from dlbricks_tf.cutting.brick import Brick, layer_name, live_layer


@dataclasses.dataclass(frozen=True)
class Spec:
    """A tensor's shape (batch dimension first) and Keras dtype name."""

    shape: tuple[int | None, ...]
    dtype: str
    name: str = ""


class BrickProgram:
    """Calls a brick's layers on tensors, as its built `keras.Model` would.

    Args:
        brick: The brick.
        layers: {qualified name: layer} for every call, built.
        batch_size: The batch dimension of its inputs and outputs.
        outputs: Its outputs' specs (batch first), where `brick.outputs`
            lacks one.
    """

    def __init__(
        self,
        brick: Brick,
        layers: dict[str, Any],
        batch_size: int,
        outputs: list[Spec] | None = None,
    ) -> None:
        self.brick = brick
        self.name = f"brick_{brick.signature}"
        self._layers = layers
        self.inputs = [
            Spec((batch_size, *s.shape), s.dtype, f"input_{i}")
            for i, s in enumerate(brick.inputs)
        ]
        self.outputs = outputs or [
            Spec((batch_size, *s.shape), s.dtype) for s in brick.outputs
        ]
        inner = [
            brick.specs[t]
            for c in brick.calls
            for t in c.outputs
            if t < len(brick.specs) and brick.specs[t] is not None
        ]
        # Every tensor it holds (as a built brick's input layers and calls
        # write them): the largest bounds the activations.
        self.tensors = [
            *self.inputs,
            *(Spec((batch_size, *s.shape), s.dtype) for s in inner),
            *self.outputs,
        ]

    @property
    def layers(self) -> list[Any]:
        """The distinct layers it calls, in call order."""
        return list({id(x): x for x in self._layers.values()}.values())

    @property
    def weights(self) -> list[Any]:
        """The weights of its layers, each once."""
        seen = {}
        for layer in self.layers:  # A raw `keras.ops` call has none.
            for w in getattr(layer, "weights", ()):
                seen.setdefault(id(w), w)
        return list(seen.values())

    def __call__(self, inputs: Any, training: bool = False) -> Any:
        """Runs the calls on `inputs` (one tensor, or a list)."""
        flat = keras.tree.flatten(inputs)
        tensors = dict(zip(self.brick.input_ids, flat, strict=True))
        for c in self.brick.calls:
            op = self._layers[c.name]
            args, kwargs = replay.arguments(
                c.node, [tensors[t] for t in c.inputs]
            )
            # As a Functional model passes its `training` to each layer.
            if "training" in getattr(op, "_call_context_args", ()):
                kwargs["training"] = training
            outs = keras.tree.flatten(op(*args, **kwargs))
            for slot, t in zip(c.output_slots, c.outputs, strict=True):
                tensors[t] = outs[slot]
        outputs = [tensors[t] for t in self.brick.output_ids]
        return outputs[0] if len(outputs) == 1 else outputs


def program(
    brick: Brick, batch_size: int, source: keras.Model | None = None
) -> BrickProgram | keras.Model:
    """A `BrickProgram` of `brick`, or its built `keras.Model` where a
    program cannot be made (integer inputs).

    Args:
        brick: The brick.
        batch_size: The batch dimension of its inputs.
        source: The model in memory it was cut from: its own layers,
            weights and all, are called wherever one has the call's class
            and config (see `Brick.build`); the other calls get fresh
            layers from their configs, built as `Brick.build` builds them
            (one symbolic call each, here on bare `keras.KerasTensor`s:
            no input layers, no Functional graph).
    """
    if not all(keras.backend.is_float_dtype(s.dtype) for s in brick.inputs):
        return brick.build(batch_size, source=source)
    layers: dict[str, Any] = {}
    symbolic = any(s is None for s in brick.outputs)
    for c in brick.calls:
        if c.name in layers:
            continue
        layer = live_layer(source, c) if source is not None else None
        if layer is None or not layer.built:
            layer = brick.factory.create(c, name=layer_name(c.name))
            symbolic = True
        layers[c.name] = layer
    outputs = None
    if symbolic:  # Builds the fresh layers; gives every output's spec.
        tensors = {
            t: keras.KerasTensor((batch_size, *s.shape), s.dtype)
            for t, s in zip(brick.input_ids, brick.inputs, strict=True)
        }
        for c in brick.calls:
            outs = replay.call(
                layers[c.name], c.node, [tensors[t] for t in c.inputs]
            )
            for slot, t in zip(c.output_slots, c.outputs, strict=True):
                tensors[t] = outs[slot]
        outputs = [
            Spec(tuple(tensors[t].shape), tensors[t].dtype)
            for t in brick.output_ids
        ]
    return BrickProgram(brick, layers, batch_size, outputs)
