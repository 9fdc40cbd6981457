"""Keras model -> ONNX file, through tf2onnx's `from_function`.

`tf2onnx.convert.from_keras` fails on Sequential models with TF 2.21 /
Keras 3 (tf2onnx issue 2448), so the model is wrapped in a `tf.function`
with an explicit input signature and converted from there; that works for
Functional, Sequential and sliced models alike. Inputs are named
`input_0`, `input_1`, ... in the order of `model.inputs` (no source layer
name leaks into the file), the batch dimension stays dynamic unless a
batch size is given, and the opset is at most 18, the highest tf2onnx
1.17 converts.

Example:
    info = to_onnx(brick.build(None), "brick.onnx")
    session = onnxruntime.InferenceSession("brick.onnx")
    session.run(None, {info.input_names[0]: x})
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
from pathlib import Path

import keras
import tensorflow as tf

from dlbricks_tf import errors

MAX_OPSET = 18


class ConversionError(errors.Error):
    """A model cannot be converted to ONNX."""


@dataclasses.dataclass(frozen=True)
class OnnxInfo:
    """What a converted file expects and returns.

    Attributes:
        input_names: ONNX input names, in the order of `model.inputs`.
        output_names: ONNX output names, in the order of `model.outputs`.
        opset: The opset of the file.
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    opset: int


def input_names(model: keras.Model) -> tuple[str, ...]:
    """The names `to_onnx` gives a model's inputs: input_0, input_1, ..."""
    return tuple(f"input_{i}" for i in range(len(model.inputs)))


def _pack(model: keras.Model, flat: list[tf.Tensor]):
    if len(flat) == 1:
        return flat[0]
    target = model
    if isinstance(model, keras.Sequential):
        target = getattr(model, "_functional", None) or model
    struct = getattr(target, "_inputs_struct", None)
    if struct is not None:
        return keras.tree.pack_sequence_as(struct, flat)
    return flat


def to_onnx(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    opset: int = MAX_OPSET,
    batch_size: int | None = None,
) -> OnnxInfo:
    """Converts a built Keras model to an ONNX file.

    Args:
        model: A built Keras model (Functional or Sequential).
        path: The `.onnx` file to write (its folder must exist).
        opset: ONNX opset, at most `MAX_OPSET`.
        batch_size: Fixed batch dimension, or None for a dynamic one.

    Returns:
        The file's input and output names.

    Raises:
        ConversionError: If tf2onnx cannot convert the model.
        ValueError: If `opset` is above `MAX_OPSET` or below 1.
    """
    if not 1 <= opset <= MAX_OPSET:
        raise ValueError(
            f"opset must be in 1..{MAX_OPSET} (tf2onnx 1.17). "
            f"Received: opset={opset}"
        )
    import tf2onnx  # Lazy: slow to import, only needed here.

    names = input_names(model)
    specs = [
        tf.TensorSpec((batch_size, *t.shape[1:]), t.dtype, name=name)
        for name, t in zip(names, model.inputs, strict=True)
    ]

    @tf.function(input_signature=specs)
    def call(*xs):
        outputs = model(_pack(model, list(xs)), training=False)
        return tf.nest.flatten(outputs)

    # Tensors the model captured as eager constants (not variables, e.g.
    # a Normalization layer's mean) would become extra graph inputs: they
    # are folded back into the file as initializers below.
    concrete = call.get_concrete_function()
    constants = {
        inner.name: outer
        for outer, inner in zip(
            concrete.captured_inputs,
            concrete.graph.internal_captures,
            strict=True,
        )
        if outer.dtype != tf.resource
    }
    tf2onnx_logger = logging.getLogger("tf2onnx")
    level = tf2onnx_logger.level
    tf2onnx_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            proto, _ = tf2onnx.convert.from_function(
                call, input_signature=specs, opset=opset
            )
    except Exception as e:  # tf2onnx raises many types.
        raise ConversionError(
            f"Cannot convert model {model.name!r} to ONNX (opset {opset}): "
            f"{type(e).__name__}: {e}"
        ) from e
    finally:
        tf2onnx_logger.setLevel(level)
    _fold_constants(proto, names, constants, model.name)
    import onnx

    onnx.save(proto, str(Path(path)))
    return OnnxInfo(
        input_names=tuple(i.name for i in proto.graph.input),
        output_names=tuple(o.name for o in proto.graph.output),
        opset=opset,
    )


def _fold_constants(proto, names, constants, model_name: str) -> None:
    """Turns graph inputs that are captured constants into initializers.

    Raises:
        ConversionError: If the file has an input that is neither a model
            input nor a captured constant.
    """
    from onnx import numpy_helper

    for graph_input in list(proto.graph.input):
        if graph_input.name in names:
            continue
        value = constants.get(graph_input.name)
        if value is None:
            raise ConversionError(
                f"Model {model_name!r} converted to ONNX with an unexpected "
                f"input {graph_input.name!r}; it cannot run on its own."
            )
        proto.graph.initializer.append(
            numpy_helper.from_array(value.numpy(), graph_input.name)
        )
        proto.graph.input.remove(graph_input)
