"""Checks a suite's bricks before any of them runs.

A suite folder travels: someone exports it, someone else times it. The
manifest's SHA-256 digests prove only that the files are those the author
listed, not what they do, and a SavedModel is a program (TensorFlow's own
security guidance: running an untrusted model is running untrusted code).
So before a brick is loaded, `check_entry` reads its files as data
(protocol buffers, no TensorFlow or ONNX Runtime session) and refuses it,
with a one-line reason, if:

- a file or folder of the brick is a symlink that leaves the suite folder;
- its SavedModel (tf backend) holds an op outside `ALLOWED_OPS`, the ops
  Keras bricks export to, in its graph or in any function of its library.
  The saver functions TensorFlow adds to every SavedModel (`SaveV2`,
  `RestoreV2`, ...) are allowed their file ops only while no serving
  function can reach them; `tf.saved_model.load` never runs them;
- its ONNX file (onnxruntime backend) uses an operator domain other than
  the default ones the exporter writes (`""`, `ai.onnx`, `ai.onnx.ml`),
  defines local functions, or names external data outside its brick's
  folder.

`--unsafe_suite` skips these checks for a suite the user trusts.

Example:
    reason = check_entry(entry, suite.folder, "tf")
    if reason:
        print(f"refused {entry.signature}: {reason}")
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from dlbricks_tf.portable import suite_dir

# Ops of the serving functions Keras bricks export to: every op of the
# traced `serving_default` of the 40 keras.applications models, of the
# test models, and of the other built-in Keras layers, activations and
# common `keras.ops` (float32 and mixed precision), BroadcastTo and All
# (the keras_hub backbones of tests/hub_test.py), plus the call and
# variable plumbing of a TF2 SavedModel. Built by tracing them (see
# docs/untrusted-files.md); an op outside it refuses the brick.
COMPUTE_OPS = frozenset(
    {
        "Abs",
        "AddV2",
        "All",
        "Any",
        "ArgMax",
        "AssignVariableOp",
        "Atan",
        "AvgPool",
        "AvgPool3D",
        "BatchMatMulV2",
        "BiasAdd",
        "BroadcastTo",
        "Bitcast",
        "BitwiseAnd",
        "Bucketize",
        "Cast",
        "Ceil",
        "ConcatV2",
        "Const",
        "Conv2D",
        "Conv2DBackpropInput",
        "Conv3D",
        "Conv3DBackpropInputV2",
        "Cos",
        "Cumsum",
        "DenseBincount",
        "DepthwiseConv2dNative",
        "DivNoNan",
        "Einsum",
        "Elu",
        "Equal",
        "Erf",
        "Erfc",
        "Exp",
        "ExpandDims",
        "Expm1",
        "Fill",
        "Floor",
        "FloorDiv",
        "FloorMod",
        "GatherV2",
        "Greater",
        "GreaterEqual",
        "Identity",
        "IdentityN",
        "If",
        "IsFinite",
        "IsInf",
        "IsNan",
        "LeakyRelu",
        "Less",
        "LessEqual",
        "Log",
        "Log1p",
        "LogSoftmax",
        "LogicalAnd",
        "LogicalNot",
        "LogicalOr",
        "MatMul",
        "MatrixBandPart",
        "Max",
        "MaxPool",
        "MaxPool3D",
        "Maximum",
        "Mean",
        "Min",
        "Minimum",
        "Mul",
        "Neg",
        "NoOp",
        "NotEqual",
        "OneHot",
        "OnesLike",
        "Pack",
        "Pad",
        "PartitionedCall",
        "Placeholder",
        "Pow",
        "Prod",
        "Range",
        "ReadVariableOp",
        "RealDiv",
        "Reciprocal",
        "Relu",
        "Relu6",
        "Reshape",
        "ResizeBilinear",
        "ReverseV2",
        "Roll",
        "Round",
        "Rsqrt",
        "SelectV2",
        "Selu",
        "Shape",
        "Sigmoid",
        "Sign",
        "Sin",
        "Size",
        "Slice",
        "Softmax",
        "Softplus",
        "Softsign",
        "Split",
        "Sqrt",
        "Square",
        "SquaredDifference",
        "Squeeze",
        "StatefulPartitionedCall",
        "StatelessIf",
        "StatelessWhile",
        "StopGradient",
        "StridedSlice",
        "Sub",
        "Sum",
        "Tanh",
        "TensorListFromTensor",
        "TensorListGetItem",
        "TensorListReserve",
        "TensorListSetItem",
        "TensorListStack",
        "Tile",
        "TopKV2",
        "Transpose",
        "VarHandleOp",
        "VarIsInitializedOp",
        "While",
        "ZerosLike",
    }
)

# File ops of the saver functions every TF2 SavedModel carries
# (`__inference__traced_save_*`, `__inference__traced_restore_*`).
SAVER_OPS = frozenset(
    {
        "DisableCopyOnRead",
        "MergeV2Checkpoints",
        "Pack",
        "RestoreV2",
        "SaveV2",
        "Select",
        "ShardedFilename",
        "StaticRegexFullMatch",
        "StringJoin",
    }
)
ALLOWED_OPS = COMPUTE_OPS | SAVER_OPS
# Operator domains of the ONNX files tf2onnx writes ("" is ai.onnx).
ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})


class RefusedBrickError(suite_dir.SuiteError):
    """A suite brick failed a check and was not run."""


def check_entry(
    entry: suite_dir.SuiteDirEntry, root: str | os.PathLike, backend: str
) -> str | None:
    """Why a suite brick must not run on `backend`, or None if it may.

    Args:
        entry: A brick of a `SuiteDir`.
        root: The suite folder.
        backend: "tf" (its SavedModel) or "onnxruntime" (its ONNX file).

    Returns:
        A one-line reason, or None.
    """
    root = Path(os.path.realpath(root))
    files = [entry.saved_model, entry.keras] + (
        [entry.onnx] if entry.onnx else []
    )
    for path in files:
        reason = _leaves(Path(path), root)
        if reason:
            return reason
    if backend == "onnxruntime":
        if entry.onnx is None:
            return None  # The timing says there is no ONNX file.
        return check_onnx(entry.onnx)
    return check_saved_model(entry.saved_model)


def refusals(suite: suite_dir.SuiteDir, backend: str) -> dict[str, str]:
    """The bricks of `suite` that must not run on `backend`, with reasons."""
    out = {}
    for entry in suite.entries:
        reason = check_entry(entry, suite.folder, backend)
        if reason:
            out[entry.signature] = reason
    return out


def require(
    entry: suite_dir.SuiteDirEntry, root: str | os.PathLike, backend: str
) -> None:
    """Raises `RefusedBrickError` if `check_entry` finds a reason."""
    reason = check_entry(entry, root, backend)
    if reason:
        raise RefusedBrickError(
            f"Brick {entry.signature} refused, not run: {reason}; time it "
            "only if you trust the suite (--unsafe_suite)."
        )


def _leaves(path: Path, root: Path) -> str | None:
    """Why `path`, or anything under it, resolves outside `root`."""
    for item in [path, *_walk(path)]:
        real = os.path.realpath(item)
        if not _inside(real, root):
            shown = os.path.relpath(item, root)
            return f"{shown} is a link to {real}, outside the suite folder"
    return None


def _walk(path: Path) -> Iterator[str]:
    if not path.is_dir() or path.is_symlink():
        return
    for folder, dirs, names in os.walk(path, followlinks=False):
        for name in dirs + names:
            yield os.path.join(folder, name)


def _inside(path: str, root: Path) -> bool:
    return os.path.commonpath([path, str(root)]) == str(root)


def saved_model_ops(folder: str | os.PathLike) -> dict[str, set[str]]:
    """Op types of a SavedModel, by place: "graph", "saver", "functions".

    "saver" holds the functions only the saver's graph nodes reach (the
    TF1 save and restore functions); "functions" every other function,
    which the serving signatures or the object graph may call.

    Raises:
        ValueError: If saved_model.pb is not a SavedModel protocol buffer.
    """
    from google.protobuf import message
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    data = (Path(folder) / suite_dir.SAVED_MODEL_PB).read_bytes()
    try:
        proto.ParseFromString(data)
    except message.DecodeError as e:
        raise ValueError(f"saved_model.pb is not a SavedModel: {e}") from e
    ops: dict[str, set[str]] = {
        "graph": set(),
        "saver": set(),
        "functions": set(),
    }
    for meta in proto.meta_graphs:
        graph = meta.graph_def
        library = {f.signature.name: f for f in graph.library.function}
        saver_nodes = {
            name.split(":")[0]
            for name in (
                meta.saver_def.save_tensor_name,
                meta.saver_def.restore_op_name,
            )
            if name
        }
        saver_roots, other_roots = set(), set()
        for node in graph.node:
            ops["graph"].add(node.op)
            called = set(_called(node))
            (saver_roots if node.name in saver_nodes else other_roots).update(
                called
            )
        other_roots |= set(meta.object_graph_def.concrete_functions)
        # Functions no graph node calls are checked as serving functions.
        reached_by_saver = _closure(saver_roots, library)
        other_roots |= set(library) - reached_by_saver
        served = _closure(other_roots, library)
        for name, function in library.items():
            place = "functions" if name in served else "saver"
            ops[place].update(n.op for n in function.node_def)
    return ops


def _called(node) -> Iterator[str]:
    """Names of the functions a NodeDef calls (attrs f, body, branches...)."""
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        yield from (f.name for f in value.list.func)


def _closure(roots: Iterable[str], library: dict) -> set[str]:
    seen, stack = set(), [r for r in roots if r in library]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in library[name].node_def:
            stack.extend(c for c in _called(node) if c in library)
    return seen


def check_saved_model(folder: str | os.PathLike) -> str | None:
    """Why a brick's SavedModel must not be loaded, or None.

    Reads saved_model.pb as data: nothing of it runs.
    """
    try:
        ops = saved_model_ops(folder)
    except (OSError, ValueError) as e:
        return f"cannot read its SavedModel: {e}"
    for place, allowed in (
        ("graph", COMPUTE_OPS),
        ("functions", COMPUTE_OPS),
        ("saver", ALLOWED_OPS),
    ):
        bad = sorted(ops[place] - allowed)
        if bad:
            shown = ", ".join(bad[:5]) + (", ..." if len(bad) > 5 else "")
            return (
                f"its SavedModel runs op(s) {shown}, not among the ops Keras "
                "bricks export to"
            )
    return None


def check_onnx(path: str | os.PathLike) -> str | None:
    """Why a brick's ONNX file must not be run, or None.

    Reads the file as data, without its external data: nothing of it runs
    and no other file is opened.
    """
    import onnx

    try:
        model = onnx.load(os.fspath(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError and others.
        return f"cannot read its ONNX file: {type(e).__name__}"
    domains = {o.domain for o in model.opset_import} - ONNX_DOMAINS
    if domains:
        return f"its ONNX file imports operator domain(s) {sorted(domains)}"
    if model.functions:
        return "its ONNX file defines local functions"
    folder = Path(os.path.realpath(os.path.dirname(os.fspath(path))))
    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.domain not in ONNX_DOMAINS:
                return (
                    f"its ONNX file runs {node.op_type} of domain "
                    f"{node.domain!r}"
                )
        for tensor in _tensors(graph):
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            where = {e.key: e.value for e in tensor.external_data}
            location = where.get("location", "")
            real = os.path.realpath(folder / location)
            if (
                not location
                or os.path.isabs(location)
                or not _inside(real, folder)
            ):
                return (
                    f"its ONNX file names external data {location!r}, "
                    "outside its brick's folder"
                )
    return None


def _graphs(graph) -> Iterator:
    """A graph and every subgraph in its nodes' attributes (If, Loop...)."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for node in g.node:
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    stack.append(attribute.g)
                stack.extend(attribute.graphs)


def _tensors(graph) -> Iterator:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            for sparse in attribute.sparse_tensors:
                yield sparse.values
                yield sparse.indices
