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

    tf2onnx_logger = logging.getLogger("tf2onnx")
    level = tf2onnx_logger.level
    tf2onnx_logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            proto, _ = tf2onnx.convert.from_function(
                call,
                input_signature=specs,
                opset=opset,
                output_path=str(Path(path)),
            )
    except Exception as e:  # tf2onnx raises many types.
        raise ConversionError(
            f"Cannot convert model {model.name!r} to ONNX (opset {opset}): "
            f"{type(e).__name__}: {e}"
        ) from e
    finally:
        tf2onnx_logger.setLevel(level)
    return OnnxInfo(
        input_names=tuple(i.name for i in proto.graph.input),
        output_names=tuple(o.name for o in proto.graph.output),
        opset=opset,
    )
