"""Replays serialized layer calls on fresh layers and fresh tensors.

A brick is built, and a missing shape is inferred, by creating each layer
anew from its config and calling it with the recorded arguments, tensors
swapped for the brick's own. Nothing is shared with the source model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import keras
from keras.src.saving import serialization_lib

from dlbricks_tf.cutting import graph as graph_lib
from dlbricks_tf.cutting import synthetic
from dlbricks_tf.errors import DecompositionError

_SLOT = "__dlbricks_slot__"
_UNSAFE_CLASSES = frozenset({"Lambda"})


@dataclasses.dataclass(frozen=True)
class LayerFactory:
    """Creates fresh Keras operations from serialized layer entries.

    Attributes:
        custom_objects: classes Keras cannot find by itself, by name.
        safe_mode: refuse to rebuild layers that carry Python code (Lambda).
        live_classes: for a model in memory, the class of each call by its
            qualified name, so that unregistered custom layers rebuild too.
    """

    custom_objects: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    safe_mode: bool = True
    live_classes: Mapping[str, type] = dataclasses.field(default_factory=dict)

    def check(self, call: graph_lib.Call) -> None:
        """Raises DecompositionError if `call` could not be rebuilt."""
        if call.name in self.live_classes:
            return
        entry = _with_module(call.layer_config)
        if self.safe_mode and call.class_name in _UNSAFE_CLASSES:
            raise DecompositionError(
                f"Layer '{call.name}' is a {call.class_name} layer, which "
                "carries Python code; it is refused in safe mode. If you "
                "trust the file, pass safe_mode=False "
                "(--unsafe_deserialization on the command line)."
            )
        try:
            serialization_lib._retrieve_class_or_fn(  # noqa: SLF001
                entry.get("class_name"),
                entry.get("registered_name", entry.get("class_name")),
                entry.get("module"),
                obj_type="class",
                full_config=entry,
                custom_objects=dict(self.custom_objects),
            )
        except Exception as e:  # Keras raises TypeError or ValueError.
            raise DecompositionError(
                f"Layer '{call.name}' has class {call.class_name!r}, which "
                "Keras cannot find. Register it with "
                "@keras.saving.register_keras_serializable() in a module "
                "imported first (on the command line: --import=your.module) "
                f"or pass custom_objects={{'{call.class_name}': ...}}."
            ) from e

    def create(self, call: graph_lib.Call, name: str | None = None) -> Any:
        """A fresh operation (new weights) for `call`, optionally renamed."""
        entry = _with_module(call.layer_config)
        config = dict(entry.get("config") or {})
        if name is not None:
            config["name"] = name
        entry["config"] = config
        # The call builds the layer for the shapes it is given.
        entry.pop("build_config", None)
        entry.pop("compile_config", None)
        entry.pop("inbound_nodes", None)
        cls = self.live_classes.get(call.name)
        try:
            if cls is not None:
                with serialization_lib.SafeModeScope(False):
                    with keras.saving.CustomObjectScope(
                        dict(self.custom_objects)
                    ):
                        return cls.from_config(config)
            return serialization_lib.deserialize_keras_object(
                entry,
                custom_objects=dict(self.custom_objects),
                safe_mode=self.safe_mode,
            )
        except Exception as e:
            raise DecompositionError(
                f"Layer '{call.name}' ({call.class_name}) cannot be rebuilt "
                f"from its config: {_first_line(e)}"
            ) from e


def call(op: Any, node: dict, inputs: Sequence[Any]) -> list[Any]:
    """Calls `op` with the recorded arguments of `node` on `inputs`.

    Args:
        op: a Keras operation (layer or `keras.ops` operation).
        node: the serialized call, `{"args": ..., "kwargs": ...}`.
        inputs: one tensor for each serialized tensor in `node`, in
            `graph.iter_tensor_refs` order.

    Returns:
        The call's outputs, flattened as `keras.tree.flatten` does.
    """
    args, kwargs = arguments(node, inputs)
    return keras.tree.flatten(op(*args, **kwargs))


def output_specs(op: Any, node: dict, inputs: Sequence[Any]) -> list[Any]:
    """Like `call` on KerasTensors, without building weights if it can.

    A layer that implements `compute_output_shape` (Conv2D, Dense,
    LayerNormalization, ...) answers without creating its weights, which is
    most of what a symbolic call costs; any other falls back to a call.
    """
    args, kwargs = arguments(node, inputs)
    if isinstance(op, keras.Layer) and getattr(op, "_convert_input_args", True):
        # `compute_output_spec` skips the autocast `__call__` does first
        # (a float32 Flatten after a mixed_float16 layer returns float32).
        def autocast(x: Any) -> Any:
            if isinstance(x, keras.KerasTensor):
                return op.dtype_policy.convert_input(
                    x, op.autocast, op.input_dtype
                )
            return x

        args = keras.tree.map_structure(autocast, args)
        kwargs = keras.tree.map_structure(autocast, kwargs)
    try:
        return keras.tree.flatten(op.compute_output_spec(*args, **kwargs))
    except Exception:  # An unbuilt layer without compute_output_shape.
        return keras.tree.flatten(op(*args, **kwargs))


def arguments(node: dict, inputs: Sequence[Any]) -> tuple[Any, dict]:
    """The deserialized (args, kwargs) of `node`, tensors from `inputs`."""
    template = graph_lib.map_tensor_refs(node, _slot_tensor)
    args = serialization_lib.deserialize_keras_object(template.get("args", []))
    kwargs = serialization_lib.deserialize_keras_object(
        template.get("kwargs", {})
    )

    def swap(x: Any) -> Any:
        history = getattr(x, "_pre_serialization_keras_history", None)
        if history is not None and history[0] == _SLOT:
            return inputs[history[1]]
        return x

    args = keras.tree.map_structure(swap, args)
    kwargs = keras.tree.map_structure(swap, kwargs or {})
    return args, kwargs


def infer_missing_specs(
    graph: graph_lib.Graph, factory: LayerFactory
) -> graph_lib.Graph:
    """Fills in the specs a config does not record (inside Sequentials).

    Each call whose outputs are read but unrecorded is replayed symbolically
    on `keras.KerasTensor`s, in topological order.
    """
    specs = list(graph.specs)
    needed = {t for c in graph.calls for t in c.inputs if specs[t] is None}
    if not needed:
        return graph
    for c in graph.calls:
        if not any(t in needed and specs[t] is None for t in c.outputs):
            continue
        _replay_specs(c, specs, factory, "its recorded input shapes")
    return dataclasses.replace(graph, specs=tuple(specs))


def _replay_specs(
    c: graph_lib.Call,
    specs: list[graph_lib.TensorSpec | None],
    factory: LayerFactory,
    shapes: str,
) -> None:
    """Replays call `c` symbolically; writes its outputs' specs in place.

    `shapes` names the input shapes in the error of a layer that fails.
    """
    if any(specs[t] is None for t in c.inputs):
        raise DecompositionError(
            f"The input shape of layer '{c.name}' is unknown; give the "
            "model a keras.Input with a shape."
        )
    symbolic = [
        keras.KerasTensor((None, *specs[t].shape), dtype=specs[t].dtype)
        for t in c.inputs
    ]
    try:
        outputs = output_specs(factory.create(c), c.node, symbolic)
    except DecompositionError:
        raise
    except Exception as e:
        raise DecompositionError(
            f"Layer '{c.name}' ({c.class_name}) fails on {shapes}: "
            f"{_first_line(e)}"
        ) from e
    for slot, t in zip(c.output_slots, c.outputs, strict=True):
        out = outputs[slot]
        specs[t] = graph_lib.TensorSpec(tuple(out.shape[1:]), str(out.dtype))


def with_input_shapes(
    graph: graph_lib.Graph,
    input_shapes: Mapping[str, Sequence[int | None]],
    factory: LayerFactory,
) -> graph_lib.Graph:
    """Fixes the model's input shapes and infers every shape they change.

    For models whose inputs leave dimensions open beyond the batch (a
    transformer's sequence length): each tensor whose recorded shape has
    an open dimension is inferred again by replaying the calls, in
    topological order, on the new input shapes.

    Args:
        graph: The walked model.
        input_shapes: {input name: shape without the batch dimension}; the
            name "*" stands for every input not named. A shape must have
            the input's rank and agree with its fixed dimensions.
        factory: Rebuilds the layers to replay.

    Raises:
        DecompositionError: For an unknown input name, a shape that does
            not fit its input, or a layer that fails on the new shapes.
    """
    specs = list(graph.specs)
    try:
        shapes = synthetic.fixed_shapes(
            graph.name,
            [
                (name, specs[t].shape)
                for name, t in zip(graph.input_names, graph.inputs, strict=True)
            ],
            input_shapes,
        )
    except ValueError as e:
        raise DecompositionError(str(e)) from None
    for t, shape in zip(graph.inputs, shapes, strict=True):
        specs[t] = graph_lib.TensorSpec(shape, specs[t].dtype)
    inputs = set(graph.inputs)
    for t, spec in enumerate(specs):
        if t not in inputs and spec is not None and None in spec.shape:
            specs[t] = None  # Open: inferred again below.
    for c in graph.calls:
        if all(specs[t] is not None for t in c.outputs):
            continue
        _replay_specs(c, specs, factory, "the input shapes given")
    return dataclasses.replace(graph, specs=tuple(specs))


def _with_module(entry: dict) -> dict:
    """A copy of `entry`; legacy (.h5) entries get the module they omit."""
    entry = dict(entry)
    if entry.get("module") is None and entry.get("registered_name") is None:
        name = entry.get("class_name", "")
        if hasattr(keras.layers, name):
            entry["module"] = "keras.layers"
    return entry


def _slot_tensor(index: int) -> dict:
    return {
        "class_name": "__keras_tensor__",
        "config": {
            "shape": [None],
            "dtype": "float32",
            "keras_history": [_SLOT, index, 0],
        },
    }


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
