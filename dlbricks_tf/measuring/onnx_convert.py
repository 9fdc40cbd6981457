"""Keras model -> ONNX file, through tf2onnx's `from_graph_def`.

`tf2onnx.convert.from_keras` fails on Sequential models with TF 2.21 /
Keras 3 (tf2onnx issue 2448), so the model is wrapped in a `tf.function`
with an explicit input signature, traced, frozen (variables made
constants, as tf2onnx's `from_function` does) and converted from that
graph; that works for Functional, Sequential and sliced models alike.
Inputs are named
`input_0`, `input_1`, ... in the order of `model.inputs` (no source layer
name leaks into the file), the batch dimension stays dynamic unless a
batch size is given, and the opset is at most 18, the highest tf2onnx
1.17 converts.

Every file written is checked before it counts as converted: the ONNX
checker, an ONNX Runtime session that loads it, and (when the model's
inputs have fixed shapes) one run on synthetic inputs whose outputs must
match the Keras model's. A file that fails any check is removed and the
conversion raises `ConversionError` naming the check.

TensorFlow's exact GELU computes `Erfc`, which tf2onnx passes through as an
`Erfc` node that no ONNX opset defines (tf2onnx 1.17 has no handler; its
GELU rewriter is unreleased and needs opset 20). A custom op handler, the
mechanism tf2onnx offers for this, writes it as `1 - Erf(x)` instead; in
GELU, `0.5 * x * erfc(-x / sqrt(2))`, that differs from erfc by at most
float32's rounding of 1 (about 6e-8), so the activation keeps its numerics.

Nested functions. Keras runs a grouped convolution (a Conv2D with
`groups > 1`, as ConvNeXt's depthwise ones) through a nested
`tf.function(jit_compile=True)`. Traced, that is a
`StatefulPartitionedCall` of a function marked never to be inlined: the
freezing keeps it and tf2onnx passes it through as an op no ONNX opset
defines. The model is traced with functions run eagerly, so the nested
function's body runs as plain Python inside the trace and its ops land in
the traced graph itself.

Large kernels. tf2onnx's passes hold many copies of each constant at
once: VGG16's first Dense kernel (25088x4096, 411 MB) did not convert
within 24 GiB. A kernel of `LARGE_KERNEL_BYTES` or more that only a
MatMul reads as its right operand, untransposed (a Dense kernel), is
handed to tf2onnx as a graph input instead of a constant: ONNX's MatMul
takes it in TensorFlow's layout, so tf2onnx writes the same MatMul either
way. It becomes an initializer holding the kernel after conversion, as a
tensor the traced call captured as an eager constant does, so the file
runs on its own and ONNX Runtime treats the kernel as a constant.

Boundary layout. tf2onnx writes a channels-last Keras convolution (or
pooling) as Transpose(NHWC->NCHW), Conv, Transpose(NCHW->NHWC), then
pushes the Transposes through the ops they can cross. In a whole model
ONNX Runtime cancels the pairs between layers, so its activations stay
channels-first from its first convolution to its last; a lone brick keeps
one at each edge, which the model never pays. With
`boundary=CONV_NCHW` a brick takes and returns channels-first the rank-4
float tensors at whose edge tf2onnx left such a Transpose (its
`inputs_as_nchw` and `outputs_as_nchw`), as the whole model holds them,
and those Transposes are gone; a tensor next to a channels-last op (a
LayerNormalization, a Dense on an image, a Flatten) keeps its layout, as
does the whole file if the change removes no Transpose.

Zero terms. A brick's captured weights reach tf2onnx as graph inputs
(see `_fold_constants`), so TensorFlow's optimizer never sees their
values; a whole model's are frozen constants, and it drops an addition
of zeros (a BatchNormalization's shift with random weights: beta - mean x
scale = 0). In a DenseNet's bricks that Add stayed and kept ONNX Runtime
from turning the scale and ReLU after each concatenation into one NCHWc
convolution, as it does in the model: 11 ms of Mul, Add and Relu in the
bricks of DenseNet121 that the model does not run. `drop_zero_terms`
removes, from every file, an Add or Sub of an all-zero initializer that
leaves its other operand's shape as it is.

Example:
    info = to_onnx(brick.build(None), "brick.onnx")
    session = onnxruntime.InferenceSession("brick.onnx")
    session.run(None, {info.input_names[0]: x})
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import io
import logging
import os
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from dlbricks_tf import errors
from dlbricks_tf.cutting import synthetic
from dlbricks_tf.measuring.timing_loop import pack_inputs

MAX_OPSET = 18
# Weights a model may hold to be converted, at most: an ONNX file is one
# protobuf, which cannot exceed 2 GiB; the rest is left for its graph.
# Refused before anything is traced.
MAX_WEIGHT_BYTES = 1920 * 2**20
# A MatMul kernel this large or larger is kept out of tf2onnx (see the
# module docstring): VGG16's 25088x4096 and 4096x4096 Dense kernels are,
# its 4096x1000 one (15.6 MiB) is not.
LARGE_KERNEL_BYTES = 16 * 2**20
# Constants tf2onnx may be handed, at most (the weights not kept out of it
# as large kernels). Its passes hold many copies of each: VGG16's 411 MB
# kernel took over 10 GB and did not finish within 24 GiB, with or without
# tf2onnx's large_model mode; ConvNeXtTiny's 109 MB of constants bring the
# process to about 7 GiB. Refused after freezing, before tf2onnx runs.
MAX_CONSTANT_BYTES = 256 * 2**20
# Boundary layouts of a converted file (see the module docstring).
KERAS_LAYOUT = "keras"  # Every input and output as the Keras model's.
CONV_NCHW = "conv_nchw"  # Channels-first where a convolution-like op is.
BOUNDARIES = (KERAS_LAYOUT, CONV_NCHW)
# Transpose permutations tf2onnx writes around a channels-first op.
_TO_NCHW = (0, 3, 1, 2)
_TO_NHWC = (0, 2, 3, 1)
# Largest accepted |ONNX - Keras| over an output, as a fraction of
# max(1, the largest |Keras output|): float32 kernels of two runtimes
# differ by rounding (about 1e-6 relative); a wrong conversion by far more.
TOLERANCE = 1e-3


class ConversionError(errors.Error):
    """A model cannot be converted to ONNX."""


@dataclasses.dataclass(frozen=True)
class OnnxInfo:
    """What a converted file expects and returns.

    Attributes:
        input_names: ONNX input names, in the order of `model.inputs`.
        output_names: ONNX output names, in the order of `model.outputs`.
        opset: The opset of the file.
        nchw_inputs: Indices of the inputs the file takes channels-first
            (NCHW): the Keras model's NHWC array transposed by (0, 3, 1, 2).
        nchw_outputs: Indices of the outputs it returns channels-first.
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    opset: int
    nchw_inputs: tuple[int, ...] = ()
    nchw_outputs: tuple[int, ...] = ()


def input_names(model: keras.Model) -> tuple[str, ...]:
    """The names `to_onnx` gives a model's inputs: input_0, input_1, ..."""
    return tuple(f"input_{i}" for i in range(len(model.inputs)))


def to_onnx(
    model: keras.Model,
    path: str | os.PathLike,
    *,
    opset: int = MAX_OPSET,
    batch_size: int | None = None,
    boundary: str = KERAS_LAYOUT,
) -> OnnxInfo:
    """Converts a built Keras model to an ONNX file.

    Args:
        model: A built Keras model (Functional or Sequential).
        path: The `.onnx` file to write (its folder must exist).
        opset: ONNX opset, at most `MAX_OPSET`.
        batch_size: Fixed batch dimension, or None for a dynamic one.
        boundary: `KERAS_LAYOUT` (inputs and outputs as the model has
            them) or `CONV_NCHW` (channels-first next to a
            convolution-like op, as inside a whole model; for bricks).

    Returns:
        The file's input and output names, and which are channels-first.

    Raises:
        ConversionError: If tf2onnx cannot convert the model, its
            weights exceed `MAX_WEIGHT_BYTES`, or the constants tf2onnx
            would hold exceed `MAX_CONSTANT_BYTES`.
        ValueError: If `opset` is above `MAX_OPSET` or below 1, or
            `boundary` is not one of `BOUNDARIES`.
    """
    if not 1 <= opset <= MAX_OPSET:
        raise ValueError(
            f"opset must be in 1..{MAX_OPSET} (tf2onnx 1.17). "
            f"Received: opset={opset}"
        )
    if boundary not in BOUNDARIES:
        raise ValueError(
            f"boundary must be one of {BOUNDARIES}. Received: {boundary!r}"
        )
    _check_weight_bytes(model)
    names = input_names(model)
    specs = [
        tf.TensorSpec((batch_size, *t.shape[1:]), t.dtype, name=name)
        for name, t in zip(names, model.inputs, strict=True)
    ]

    @tf.function(input_signature=specs)
    def call(*xs):
        outputs = model(pack_inputs(model, list(xs)), training=False)
        return tf.nest.flatten(outputs)

    concrete = _trace(call)
    graph = _frozen_graph(concrete, model.name)
    proto = _convert(graph, opset, model.name)
    nchw_inputs: tuple[int, ...] = ()
    nchw_outputs: tuple[int, ...] = ()
    if boundary == CONV_NCHW:
        nchw_inputs, nchw_outputs = conv_edges(proto)
    if nchw_inputs or nchw_outputs:
        edges = proto.graph
        nchw = _convert(
            graph,
            opset,
            model.name,
            inputs_as_nchw=[edges.input[i].name for i in nchw_inputs],
            outputs_as_nchw=[edges.output[i].name for i in nchw_outputs],
        )
        # Kept only if it removes Transposes; a tensor whose consumers
        # want both layouts could move one from the edge to inside.
        if count_ops(nchw, "Transpose") < count_ops(proto, "Transpose"):
            proto = nchw
        else:
            nchw_inputs = nchw_outputs = ()
    _fold_constants(proto, names, graph.constants, model.name)
    drop_zero_terms(proto)
    import onnx

    check_proto(proto, model.name)
    onnx.save(proto, str(Path(path)))
    info = OnnxInfo(
        input_names=tuple(i.name for i in proto.graph.input),
        output_names=tuple(o.name for o in proto.graph.output),
        opset=opset,
        nchw_inputs=nchw_inputs,
        nchw_outputs=nchw_outputs,
    )
    try:
        check_outputs(model, path, info)
    except ConversionError:
        Path(path).unlink(missing_ok=True)
        raise
    return info


def _check_weight_bytes(model: keras.Model) -> None:
    """Refuses a model whose weights cannot fit in one ONNX protobuf."""
    weight_bytes = sum(
        int(np.prod(w.shape)) * np.dtype(w.dtype).itemsize
        for w in model.weights
    )
    if weight_bytes > MAX_WEIGHT_BYTES:
        raise ConversionError(
            f"Model {model.name!r} holds {weight_bytes / 2**20:.0f} MiB of "
            f"weights; an ONNX file is one protobuf of at most 2 GiB, so "
            f"models over {MAX_WEIGHT_BYTES // 2**20} MiB are not "
            "converted. Time it on --backend=tf."
        )


def _trace(call):
    """The concrete function of `call`, nested `tf.function`s inlined.

    With functions run eagerly, a nested `tf.function` called during the
    trace runs its Python body there (see "Nested functions" in the
    module docstring); the outer trace itself is unaffected.
    """
    eager = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    try:
        return call.get_concrete_function()
    finally:
        tf.config.run_functions_eagerly(eager)


@dataclasses.dataclass(frozen=True)
class _FrozenGraph:
    """A traced call, frozen, as tf2onnx converts it.

    Attributes:
        name: The traced function's name.
        graph_def: The frozen graph, large kernels as Placeholders.
        inputs: Names of its input tensors: the call's own, then the
            tensors it captured as eager constants, then large kernels.
        outputs: Names of its output tensors.
        renames: ONNX names of the call's own inputs, by tensor name.
        constants: Values of the inputs that are not the call's own (the
            captured constants and large kernels), by tensor name.
        constant_bytes: Bytes of the constants left in `graph_def`.
    """

    name: str
    graph_def: object
    inputs: list[str]
    outputs: list[str]
    renames: dict[str, str]
    constants: dict[str, np.ndarray]
    constant_bytes: int


def _frozen_graph(concrete, model_name: str) -> _FrozenGraph:
    """Freezes a traced call's variables; its large kernels become inputs.

    Raises:
        ConversionError: If the constants left for tf2onnx exceed
            `MAX_CONSTANT_BYTES`.
    """
    # Tensors the model captured as eager constants (not variables, e.g.
    # a Normalization layer's mean) stay Placeholders when frozen.
    constants = {
        inner.name: outer.numpy()
        for outer, inner in zip(
            concrete.captured_inputs,
            concrete.graph.internal_captures,
            strict=True,
        )
        if outer.dtype != tf.resource
    }
    inputs = [t.name for t in concrete.inputs if t.dtype != tf.resource]
    outputs = [t.name for t in concrete.outputs if t.dtype != tf.resource]
    # The call's own inputs come first, named after its signature.
    specs = tf.nest.flatten(concrete.structured_input_signature)
    renames = {
        t.name: spec.name
        for t, spec in zip(concrete.inputs[: len(specs)], specs, strict=True)
    }
    graph_def = _freeze(concrete, model_name)
    kernels = _large_kernels_as_placeholders(graph_def)
    constant_bytes = sum(
        len(node.attr["value"].tensor.tensor_content)
        for node in graph_def.node
        if node.op == "Const"
    )
    if constant_bytes > MAX_CONSTANT_BYTES:
        raise ConversionError(
            f"Model {model_name!r} would hand tf2onnx "
            f"{constant_bytes / 2**20:.0f} MiB of constants besides its "
            f"large MatMul kernels; tf2onnx needs many times that in memory "
            f"(over 24 GiB for 411 MB), so over "
            f"{MAX_CONSTANT_BYTES // 2**20} MiB is not converted. Time it "
            "on --backend=tf."
        )
    return _FrozenGraph(
        name=concrete.name,
        graph_def=graph_def,
        inputs=inputs + list(kernels),
        outputs=outputs,
        renames=renames,
        constants={**constants, **kernels},
        constant_bytes=constant_bytes,
    )


def _freeze(concrete, model_name: str):
    """The graph of a traced call, its variables made constants.

    As tf2onnx's `from_function` freezes, with its fixes, but without
    first loading the frozen graph back into a function: that copies
    every weight again, and took most of the time VGG16 took to freeze.

    Raises:
        ConversionError: If TensorFlow cannot freeze it.
    """
    from tf2onnx import tf_loader  # Lazy: slow to import, only needed here.

    try:
        graph_def = tf_loader.convert_variables_to_constants_large_model(
            concrete
        )
    except Exception as e:  # TensorFlow raises many types.
        raise ConversionError(
            f"Cannot freeze model {model_name!r} for ONNX: {_first_line(e)}"
        ) from e
    graph_def = tf_loader.fix_freezing_errors(graph_def)
    return tf_loader.fix_freezing_errors_part2(graph_def)


def _large_kernels_as_placeholders(graph_def) -> dict[str, np.ndarray]:
    """Replaces the large MatMul kernels of a frozen graph by Placeholders.

    A kernel is a float Const of `LARGE_KERNEL_BYTES` or more whose value
    (through Identity nodes, which stand for the variable reads) only
    MatMul-like ops read, as their untransposed right operand.

    Returns:
        The kernels' values, by the name of the tensor now a Placeholder.
    """
    from tensorflow.core.framework import node_def_pb2
    from tensorflow.python.framework import tensor_util

    readers = _value_readers(graph_def)

    def only_a_kernel(name: str) -> bool:
        uses = readers.get(name, [])
        return bool(uses) and all(
            only_a_kernel(node.name)
            if node.op == "Identity"
            else _is_untransposed_kernel(node, index)
            for node, index in uses
        )

    kernels = {}
    for node in graph_def.node:
        if node.op != "Const":
            continue
        tensor = node.attr["value"].tensor
        if (
            tensor.dtype not in _FLOAT_DTYPES
            or len(tensor.tensor_content) < LARGE_KERNEL_BYTES
            or not only_a_kernel(node.name)
        ):
            continue
        kernels[f"{node.name}:0"] = tensor_util.MakeNdarray(tensor)
        placeholder = node_def_pb2.NodeDef(name=node.name, op="Placeholder")
        placeholder.attr["dtype"].type = tensor.dtype
        placeholder.attr["shape"].shape.CopyFrom(tensor.tensor_shape)
        node.CopyFrom(placeholder)
    return kernels


def _value_readers(graph_def) -> dict[str, list[tuple[object, int]]]:
    """The (node, input index) pairs reading each node's value, by name."""
    readers: dict[str, list[tuple[object, int]]] = {}
    for node in graph_def.node:
        for index, name in enumerate(node.input):
            if not name.startswith("^"):  # Control edges read no value.
                readers.setdefault(name.split(":")[0], []).append((node, index))
    return readers


_FLOAT_DTYPES = tuple(
    dtype.as_datatype_enum for dtype in (tf.float16, tf.float32, tf.float64)
)
# MatMul-like ops, with their attributes that transpose the right operand.
_MATMULS = {
    "MatMul": ("transpose_b",),
    "BatchMatMul": ("adj_y",),
    "BatchMatMulV2": ("adj_y",),
    "BatchMatMulV3": ("adj_y",),
}


def _is_untransposed_kernel(node, index: int) -> bool:
    """Whether `node` is a MatMul reading input `index` as is, on the right.

    ONNX's MatMul takes that operand in TensorFlow's layout, so tf2onnx
    writes no Transpose of it and needs no constant value.
    """
    flags = _MATMULS.get(node.op)
    return (
        flags is not None
        and index == 1
        and not any(node.attr[flag].b for flag in flags if flag in node.attr)
    )


def _convert(graph: _FrozenGraph, opset: int, model_name: str, **layout):
    """tf2onnx's `from_graph_def` of a frozen graph, quiet; the ONNX proto.

    Args:
        graph: The frozen traced call.
        opset: The ONNX opset.
        model_name: The name to give in errors.
        **layout: `inputs_as_nchw` / `outputs_as_nchw`: names of the
            graph's inputs and outputs to make channels-first.
    """
    import tf2onnx  # Lazy: slow to import, only needed here.

    try:
        with _quiet():
            proto, _ = tf2onnx.convert.from_graph_def(
                graph.graph_def,
                name=graph.name,
                input_names=list(graph.inputs),
                output_names=list(graph.outputs),
                tensors_to_rename=dict(graph.renames),
                opset=opset,
                custom_op_handlers={"Erfc": (_erfc_as_one_minus_erf, [])},
                **layout,
            )
    except Exception as e:  # tf2onnx raises many types.
        raise ConversionError(
            f"Cannot convert model {model_name!r} to ONNX (opset {opset}): "
            f"{type(e).__name__}: {e}"
        ) from e
    finally:
        # tf2onnx's optimizer deep-copies its graph, constants included,
        # before each pass; the copies are cycles, left for a full
        # collection that may come long after. Collected now if they hold
        # much (a collection takes about 0.2 s).
        if graph.constant_bytes >= LARGE_KERNEL_BYTES:
            gc.collect()
    return proto


@contextlib.contextmanager
def _quiet():
    """Silences tf2onnx's output and TensorFlow's and tf2onnx's logs.

    An unsupported op is logged at ERROR, then named by the checks of the
    file; `from_graph_def` runs TensorFlow v1 freezing code that logs a
    deprecation warning.
    """
    loggers = [logging.getLogger(name) for name in ("tf2onnx", "tensorflow")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def conv_edges(proto) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The boundary tensors of a channels-last file next to an NCHW op.

    An input read by a Transpose to channels-first, or an output written
    by a Transpose from channels-first: where tf2onnx's own optimizer,
    having pushed the Transposes of its channels-first ops (convolution,
    pooling, resizing) as far as they go, left them at the file's edge.
    Rank-4 float tensors only.

    Args:
        proto: An `onnx.ModelProto` converted channels-last.

    Returns:
        (indices of such inputs, indices of such outputs).
    """
    from onnx import TensorProto, helper

    graph = proto.graph
    float32 = TensorProto.FLOAT

    def rank4_float(value) -> bool:
        tensor = value.type.tensor_type
        return tensor.elem_type == float32 and len(tensor.shape.dim) == 4

    def perm(node) -> tuple[int, ...]:
        for attribute in node.attribute:
            if attribute.name == "perm":
                return tuple(helper.get_attribute_value(attribute))
        return ()

    read = {
        name
        for node in graph.node
        if node.op_type == "Transpose" and perm(node) == _TO_NCHW
        for name in node.input[:1]
    }
    written = {
        node.output[0]
        for node in graph.node
        if node.op_type == "Transpose" and perm(node) == _TO_NHWC
    }
    inputs = tuple(
        i
        for i, value in enumerate(graph.input)
        if rank4_float(value) and value.name in read
    )
    outputs = tuple(
        i
        for i, value in enumerate(graph.output)
        if rank4_float(value) and value.name in written
    )
    return inputs, outputs


def count_ops(proto, op_type: str) -> int:
    """How many nodes of `op_type` an ONNX model's main graph holds."""
    return sum(node.op_type == op_type for node in proto.graph.node)


def _erfc_as_one_minus_erf(ctx, node, name, args) -> None:
    """tf2onnx handler of TF's `Erfc`: `1 - Erf(x)` (ONNX has no Erfc)."""
    del args  # Unused.
    from tf2onnx import utils

    dtype = utils.map_onnx_to_numpy_type(ctx.get_dtype(node.input[0]))
    node.type = "Erf"
    one = ctx.make_const(utils.make_name(f"{name}_one"), np.array(1, dtype))
    ctx.insert_new_node_on_output(
        "Sub",
        node.output[0],
        name=utils.make_name(f"{name}_one_minus"),
        inputs=[one.output[0], node.output[0]],
    )


def check_proto(proto, model_name: str = "model") -> None:
    """Checks an ONNX model with the ONNX checker and an ORT session.

    Args:
        proto: An `onnx.ModelProto`.
        model_name: The name to give in errors.

    Raises:
        ConversionError: If either refuses it (e.g. an operator that ONNX
            does not define), with their first line of explanation.
    """
    import onnx

    try:
        onnx.checker.check_model(proto)
    except Exception as e:  # onnx.checker.ValidationError and others.
        raise ConversionError(
            f"Model {model_name!r} converted to an invalid ONNX file (ONNX "
            f"checker): {_first_line(e)}"
        ) from e
    _session(proto.SerializeToString(), model_name)


def _session(source, model_name: str):
    try:
        import onnxruntime as ort
    except ImportError:
        return None  # Checked where it runs; the ONNX checker has passed.
    from dlbricks_tf.measuring import ort_session

    options = ort_session.session_options(ort, 1, 1)
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(
            source, sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as e:  # ORT raises its own types.
        raise ConversionError(
            f"Model {model_name!r} converted to an ONNX file that ONNX "
            f"Runtime cannot load: {_first_line(e)}"
        ) from e


def check_outputs(
    model: keras.Model, path: str | os.PathLike, info: OnnxInfo
) -> None:
    """Runs an ONNX file and the Keras model on the same synthetic inputs.

    The inputs the file takes channels-first (`info.nchw_inputs`) are fed
    transposed, and the outputs it returns channels-first are transposed
    back before they are compared with the Keras model's.

    Skipped (nothing is compared) if ONNX Runtime is missing or an input
    has an unknown dimension beyond the batch.

    Raises:
        ConversionError: If ORT cannot run the file, or an output differs
            from the Keras model's by more than `TOLERANCE` (relative to
            max(1, the output's largest magnitude)).
    """
    session = _session(str(path), model.name)
    if session is None:
        return
    batch = session.get_inputs()[0].shape[0] if info.input_names else 1
    batch = batch if isinstance(batch, int) else 1
    try:
        xs = synthetic.synthetic_inputs(model, batch)
    except ValueError:
        return  # Unknown dimensions: the file was loaded, not run.
    fed = [
        np.ascontiguousarray(x.transpose(_TO_NCHW))
        if i in info.nchw_inputs
        else x
        for i, x in enumerate(xs)
    ]
    try:
        got = session.run(None, dict(zip(info.input_names, fed, strict=True)))
    except Exception as e:  # ORT raises its own types.
        raise ConversionError(
            f"Model {model.name!r}: ONNX Runtime cannot run its ONNX file: "
            f"{_first_line(e)}"
        ) from e
    got = [
        np.asarray(g).transpose(_TO_NHWC) if i in info.nchw_outputs else g
        for i, g in enumerate(got)
    ]
    packed = pack_inputs(model, [tf.constant(x) for x in xs])
    want = keras.tree.flatten(model(packed, training=False))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        error = _relative_error(np.asarray(g), np.asarray(w))
        if error > TOLERANCE:
            raise ConversionError(
                f"Model {model.name!r}: output {i} of its ONNX file differs "
                f"from Keras by {error:.2g} of its scale (more than "
                f"{TOLERANCE:g}): the conversion changed its numerics."
            )


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max(1, max |want|), NaNs and infs matched."""
    if got.shape != want.shape:
        return float("inf")
    got = got.astype(np.float64)
    want = want.astype(np.float64)
    same = (np.isnan(got) & np.isnan(want)) | (got == want)
    finite = np.isfinite(want)
    scale = max(1.0, float(np.max(np.abs(want[finite]), initial=0.0)))
    diff = np.where(same, 0.0, np.abs(got - want))
    diff = np.where(np.isnan(diff), np.inf, diff)
    return float(np.max(diff, initial=0.0)) / scale


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    first = text.splitlines()[0].strip() if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


def drop_zero_terms(proto) -> int:
    """Removes x + 0, 0 + x and x - 0 (see "Zero terms"), in place.

    Only where the zero is an initializer, x's shape is known (ONNX shape
    inference) and broadcasting the zero to it changes nothing (every
    dimension of the zero is 1 or x's). The sum's readers read x instead;
    if the sum is a graph output, x's node writes it under the output's
    name (and the sum is kept where x is a graph input, an initializer
    or a graph output itself).

    Returns:
        How many nodes were removed.
    """
    import onnx
    from onnx import numpy_helper

    graph = proto.graph
    # Only the operands of additions are read: a model's other weights
    # (VGG16's 528 MiB) need not be.
    terms = {
        name
        for node in graph.node
        if node.op_type in ("Add", "Sub")
        for name in node.input[:2]
    }
    zeros = {
        i.name: tuple(i.dims)
        for i in graph.initializer
        if i.name in terms and not np.any(numpy_helper.to_array(i))
    }
    if not zeros:
        return 0
    inferred = onnx.shape_inference.infer_shapes(proto).graph
    shapes = {}
    for value in [*inferred.input, *inferred.value_info]:
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = tuple(
            d.dim_value if d.HasField("dim_value") else None for d in dims
        )
    outputs = {o.name for o in graph.output}

    def keeps_shape(x: str, zero: str) -> bool:
        shape, dims = shapes.get(x), zeros[zero]
        if shape is None or len(dims) > len(shape):
            return False
        tail = shape[len(shape) - len(dims) :]
        return all(d == 1 or d == s for d, s in zip(dims, tail, strict=True))

    # Names no node writes, or that must stay: x keeps them.
    ends = outputs | {i.name for i in graph.input}
    ends |= {i.name for i in graph.initializer}
    renamed: dict[str, str] = {}  # A tensor's name -> the one it takes.
    kept = []
    for node in graph.node:
        x = zero = None
        if node.op_type in ("Add", "Sub") and node.input[1] in zeros:
            x, zero = node.input[0], node.input[1]
        elif node.op_type == "Add" and node.input[0] in zeros:
            x, zero = node.input[1], node.input[0]
        total = node.output[0]
        if x is None or x in zeros or not keeps_shape(x, zero):
            kept.append(node)
            continue
        x = renamed.get(x, x)
        if total not in outputs:
            renamed[total] = x
        elif x not in ends:
            renamed[x] = total  # x's node writes the output itself.
        else:
            kept.append(node)
            continue
    if len(kept) == len(graph.node):
        return 0

    def final(name: str) -> str:
        while name in renamed:
            name = renamed[name]
        return name

    for node in kept:
        for k, name in enumerate(node.input):
            node.input[k] = final(name)
        for k, name in enumerate(node.output):
            node.output[k] = final(name)
    removed = len(graph.node) - len(kept)
    del graph.node[:]
    graph.node.extend(kept)
    return removed


def _fold_constants(proto, names, constants, model_name: str) -> None:
    """Turns graph inputs that stand for constants into initializers.

    Args:
        proto: The converted `onnx.ModelProto`, changed in place.
        names: The model's own input names, left inputs.
        constants: Values of the other inputs (captured constants and
            large kernels), by name.
        model_name: The name to give in errors.

    Raises:
        ConversionError: If the file has an input that is neither a model
            input nor a known constant.
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
            numpy_helper.from_array(value, graph_input.name)
        )
        proto.graph.input.remove(graph_input)
