"""Bricks and whole models as ONNX files, converted once, for ONNX Runtime.

`onnx_file` converts a Keras model to an ONNX file in a folder (a dynamic
batch first, then the batch size timed) and writes its inputs' id bounds
beside it, or reuses the file converted before; an `OnnxFile` is what
`brick_timing` hands ONNX Runtime's timer. `brick_timing.brick_onnx_file`
and `brick_timing.model_onnx_file` name the files of bricks and models.

A whole model is converted with the inputs and outputs it has; a brick
with `BRICK_BOUNDARY`: its rank-4 float inputs and outputs next to a
convolution-like op channels-first, the layout they have inside the
whole model once ONNX Runtime has cancelled the Transposes tf2onnx writes
around each such op (`onnx_convert`, "Boundary layout"). The layout is in
the file's name, so a file converted with another one is not reused.
Importing this module imports no TensorFlow (the conversion does).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dlbricks_tf import errors
from dlbricks_tf.measuring import ort_timing

# `onnx_convert.KERAS_LAYOUT` and `onnx_convert.CONV_NCHW` (that module
# imports TensorFlow): the boundary layout of whole models and of bricks.
MODEL_BOUNDARY = "keras"
BRICK_BOUNDARY = "conv_nchw"


@dataclasses.dataclass(frozen=True)
class OnnxFile:
    """A brick or model as an ONNX file, what ONNX Runtime times.

    Attributes:
        path: The `.onnx` file.
        id_bounds: Exclusive id bound per input (None: none).
        input_specs: (shape without batch, dtype) per input, or None to
            read them from the file.
    """

    path: str
    id_bounds: tuple[int | None, ...] | None = None
    input_specs: tuple[tuple[tuple[int, ...], str], ...] | None = None


def onnx_file(
    build: Callable[[int | None], Any],
    folder: str | Path,
    stem: str,
    batch_size: int,
    *,
    reuse: bool = True,
    boundary: str = MODEL_BOUNDARY,
) -> OnnxFile:
    """A Keras model as an ONNX file in `folder`, converted once.

    A dynamic batch is tried first, then the batch size timed (some bricks
    only build with a fixed one). The id bounds are written beside the
    file last (`ort_timing.convert_for_ort`): a file without them is
    converted again. Bricks are named by signature, so their files serve
    every later run and shard with the same folder. A boundary layout
    other than the model's own is part of the file's name
    (`<stem>-<boundary>.onnx`): files of two layouts are never mixed up.

    Args:
        build: build(batch) -> the Keras model (batch None: dynamic).
        folder: Where the files are kept.
        stem: The file name without suffix (and without the layout).
        batch_size: The batch size timed.
        reuse: Use a file already converted in the current format
            (`ort_timing.FILE_FORMAT`; False: convert again).
        boundary: The layout of the file's inputs and outputs, one of
            `onnx_convert.BOUNDARIES` (`MODEL_BOUNDARY`: as the Keras
            model's; `BRICK_BOUNDARY`: channels-first next to a
            convolution-like op).

    Raises:
        dlbricks_tf.Error: If neither conversion works.
    """
    folder = Path(folder)
    if boundary != MODEL_BOUNDARY:
        stem = f"{stem}-{boundary}"
    names = ((None, stem), (batch_size, f"{stem}-b{batch_size}"))
    if reuse:
        for _, name in names:
            path = folder / f"{name}.onnx"
            bounds = ort_timing.load_id_bounds(path)
            current = ort_timing.is_current(path)
            if bounds is not None and path.is_file() and current:
                return OnnxFile(str(path), tuple(bounds))
    failure: BaseException | None = None
    for batch, name in names:
        try:
            path, bounds = ort_timing.convert_for_ort(
                build(batch), folder, name, batch_size=batch, boundary=boundary
            )
            return OnnxFile(str(path), tuple(bounds))
        except Exception as e:  # Keras and tf2onnx raise many types.
            failure = e
    if isinstance(failure, errors.Error):
        raise failure
    raise errors.Error(
        f"Cannot convert {stem} to ONNX: {type(failure).__name__}: {failure}"
    ) from failure
