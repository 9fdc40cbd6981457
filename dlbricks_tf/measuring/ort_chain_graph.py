"""Bricks' ONNX files merged into one graph: a chain for ONNX Runtime.

ONNX Runtime times a lone brick with what a whole model never pays: the
layout changes at its edges (tf2onnx's Transposes, ORT's NCHWc reorders),
and a Pad, an Add or an activation that ORT fuses into the convolution
next to it inside a model stays a node of its own. `merge` puts a run of
bricks (in the models' order) into one ONNX graph in which, as in the
model, a brick reads what the bricks before it wrote, so that ORT's
optimizer treats their boundaries as it treats a model's insides
(`dlbricks_tf.measuring.ort_chain` times the graph and attributes its
time to the bricks).

Feeding. An input of brick k is fed by an output of bricks 0..k-1 with
its dtype (floating only: integer inputs are ids with bounds) and its
shape in the Keras layout, the batch dimension aside: the latest that no
brick reads yet, else the latest (an output may feed inputs of several
bricks, as a tensor read by a block and by its residual connection does
in a model, but one input of each). A brick's file takes
some rank-4 tensors channels-first (`onnx_convert`'s boundary layout, in
the `.json` beside the file): where the layouts of the output and the
input differ, a Transpose joins them, which ORT cancels against its
neighbours as it does inside a model. An input no output fits is an input
of the graph; an output that feeds nothing is an output of the graph (so
that ORT keeps the brick's nodes).

Names. Every name of brick k (nodes, tensors, initializers) gets the
prefix `brick_prefix(k)` (`onnx.compose.add_prefix`), so that the nodes
ORT runs, fused or renamed by its optimizer, name their brick
(`brick_of`); the Transposes that join layouts are named `link<k>_<j>/`,
no brick's. Importing this module imports neither TensorFlow nor ONNX
Runtime (`onnx` is imported when a chain is merged).

Example:
    chain = merge(["brick-a.onnx", "brick-b.onnx"])
    onnx.save(chain.model, "chain.onnx")
    chain.feeds[1]  # (Feed(brick=0, output=0, transposed=False),)
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf import errors

# Transpose permutations between channels-last (NHWC) and channels-first.
_TO_NCHW = (0, 3, 1, 2)
_TO_NHWC = (0, 2, 3, 1)
_BRICK = re.compile(r"(?:^|[^A-Za-z0-9_])brick(\d+)/")


class ChainGraphError(errors.Error):
    """Brick files cannot be merged into one chain graph."""


@dataclasses.dataclass(frozen=True)
class Feed:
    """Where an input of a brick in a chain reads from.

    Attributes:
        brick: The index of the brick whose output it reads.
        output: That output's index in its brick.
        transposed: Whether a Transpose joins the two (their layouts
            differ).
    """

    brick: int
    output: int
    transposed: bool = False


@dataclasses.dataclass(frozen=True, eq=False)
class ChainGraph:
    """A chain's ONNX graph and how its bricks are wired.

    Attributes:
        model: The merged `onnx.ModelProto`.
        feeds: Per brick, per input: the `Feed` it reads, or None (an
            input of the graph).
        inputs: Per input of the graph: (brick, input index).
        outputs: Per output of the graph: (brick, output index).
    """

    model: Any
    feeds: tuple[tuple[Feed | None, ...], ...]
    inputs: tuple[tuple[int, int], ...]
    outputs: tuple[tuple[int, int], ...]

    @property
    def bricks(self) -> int:
        """How many bricks the chain holds."""
        return len(self.feeds)

    @property
    def transposes(self) -> int:
        """Inputs fed through a Transpose (layouts joined)."""
        return sum(
            f is not None and f.transposed for row in self.feeds for f in row
        )


def brick_prefix(index: int) -> str:
    """The prefix of every name of brick `index` in a chain."""
    return f"brick{index}/"


def brick_of(node_name: str) -> int | None:
    """The brick a node of a chain (as ORT runs it) belongs to, or None.

    ORT keeps a fused or rewritten node's name, or makes it from the name
    of a node or tensor of the same brick (`brick3/conv:0_nchwc`); a node
    it adds between bricks (a reorder at the graph's edge) or a Transpose
    that joins layouts (`link3_0/Transpose`) belongs to no brick.
    """
    match = _BRICK.search(node_name)
    return int(match.group(1)) if match else None


def layouts(path: str | os.PathLike) -> tuple[set[int], set[int]]:
    """(channels-first inputs, channels-first outputs) of a brick's file.

    Read from the `.json` that `ort_timing.convert_for_ort` writes beside
    it; a file without one is channels-last throughout.
    """
    sidecar = Path(path).with_suffix(".json")
    if not sidecar.is_file():
        return set(), set()
    data = json.loads(sidecar.read_text())
    return set(data.get("nchw_inputs", ())), set(data.get("nchw_outputs", ()))


def _spec(value) -> tuple[int, tuple[int | None, ...]]:
    """(ONNX element type, dims with None for a symbolic one) of a value."""
    tensor = value.type.tensor_type
    dims = tuple(
        d.dim_value if d.HasField("dim_value") else None
        for d in tensor.shape.dim
    )
    return tensor.elem_type, dims


def _keras_dims(dims, nchw: bool):
    """The dims without the batch, in the Keras (channels-last) layout."""
    if nchw and len(dims) == 4:
        dims = tuple(dims[i] for i in _TO_NHWC)
    return dims[1:]


def _rename_inputs(nodes, renames: dict[str, str]) -> None:
    """Renames the inputs of nodes (and of their subgraphs) in place."""
    import onnx

    for node in nodes:
        for i, name in enumerate(node.input):
            if name in renames:
                node.input[i] = renames[name]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(attribute.g.node, renames)
            for graph in attribute.graphs:
                _rename_inputs(graph.node, renames)


@dataclasses.dataclass
class _Output:
    brick: int
    index: int
    value: Any  # onnx.ValueInfoProto, prefixed
    nchw: bool
    elem_type: int
    keras_dims: tuple[int | None, ...]
    feeds: int = 0


def merge(
    paths: Sequence[str | os.PathLike],
    *,
    feed: bool = True,
    segments: Sequence[Hashable] | None = None,
    check: bool = True,
):
    """Merges brick files, in chain order, into one `ChainGraph`.

    Args:
        paths: The bricks' `.onnx` files (as `onnx_files.onnx_file` writes
            them, with their layouts beside them), in chain order.
        feed: Feed inputs with earlier bricks' outputs (see the module
            docstring); False: every input is an input of the graph.
        segments: Per brick, its segment (e.g. the model it was first
            found in): a brick reads only outputs of its own segment's
            bricks. None: one segment. A tensor read by a brick of
            another model gains a reader its model does not have, which
            can keep ORT from fusing its producer with its own reader.
        check: Run the ONNX checker on the merged graph. A caller that
            loads it in ONNX Runtime next may leave it out: ORT refuses
            an invalid graph too, and the checker costs a third of the
            merge of a chain of a hundred bricks (0.3 s for 120 MB).

    Returns:
        The chain's graph, checked by the ONNX checker if `check`.

    Raises:
        ChainGraphError: If there is no file, or the merged graph is not
            valid ONNX.
    """
    import onnx
    from onnx import compose, helper

    if not paths:
        raise ChainGraphError("A chain needs at least one brick file.")
    if segments is None:
        segments = [0] * len(paths)
    if len(segments) != len(paths):
        raise ChainGraphError(
            f"A chain of {len(paths)} bricks needs as many segments. "
            f"Received: {len(segments)} segments"
        )
    floats = {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
    }
    nodes, initializers, value_info, inputs = [], [], [], []
    graph_inputs: list[tuple[int, int]] = []
    opsets: dict[str, int] = {}
    ir_version = 3
    written: list[_Output] = []  # Every output so far, oldest first.
    feeds: list[tuple[Feed | None, ...]] = []
    for k, path in enumerate(paths):
        nchw_in, nchw_out = layouts(path)
        model = compose.add_prefix(onnx.load(str(path)), brick_prefix(k))
        ir_version = max(ir_version, model.ir_version)
        for opset in model.opset_import:
            opsets[opset.domain] = max(
                opsets.get(opset.domain, 0), opset.version
            )
        graph = model.graph
        renames: dict[str, str] = {}
        row: list[Feed | None] = []
        taken: set[int] = set()
        for j, value in enumerate(graph.input):
            elem_type, dims = _spec(value)
            nchw = j in nchw_in
            want = _keras_dims(dims, nchw)
            source = None
            if feed and elem_type in floats and None not in want:
                fits = [
                    i
                    for i in reversed(range(len(written)))
                    if i not in taken
                    and segments[written[i].brick] == segments[k]
                    and written[i].elem_type == elem_type
                    and len(written[i].value.type.tensor_type.shape.dim)
                    == len(dims)
                    and written[i].keras_dims == want
                ]
                # The latest unread, whatever its layout: in a model a
                # brick reads what was just written (a convolution reads
                # the ReLU after the convolution before it, not that one),
                # and every tensor has a reader (a residual Add reads the
                # shortcut's output, not the convolution its BN read).
                unread = [i for i in fits if not written[i].feeds]
                source = (unread or fits or [None])[0]
            if source is None:
                inputs.append(value)
                graph_inputs.append((k, j))
                row.append(None)
                continue
            taken.add(source)
            out = written[source]
            out.feeds += 1
            transposed = out.nchw != nchw
            if transposed:
                name = f"link{k}_{j}/"
                nodes.append(
                    helper.make_node(
                        "Transpose",
                        [out.value.name],
                        [name + "transposed"],
                        name=name + "Transpose",
                        perm=list(_TO_NCHW if nchw else _TO_NHWC),
                    )
                )
                renames[value.name] = name + "transposed"
            else:
                renames[value.name] = out.value.name
            row.append(Feed(out.brick, out.index, transposed))
        feeds.append(tuple(row))
        _rename_inputs(graph.node, renames)
        nodes += graph.node
        initializers += graph.initializer
        value_info += graph.value_info
        for j, value in enumerate(graph.output):
            elem_type, dims = _spec(value)
            written.append(
                _Output(
                    k,
                    j,
                    value,
                    j in nchw_out,
                    elem_type,
                    _keras_dims(dims, j in nchw_out),
                )
            )
    unread = [out for out in written if not out.feeds]
    merged = helper.make_graph(
        nodes,
        "chain",
        inputs,
        [out.value for out in unread],
        initializer=initializers,
        value_info=value_info,
    )
    chain = helper.make_model(
        merged,
        opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()],
    )
    chain.ir_version = ir_version
    try:
        if check:
            onnx.checker.check_model(chain)
    except Exception as e:  # onnx.checker.ValidationError and others.
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ChainGraphError(
            f"The chain of {len(paths)} brick files is not valid ONNX: "
            f"{type(e).__name__}: {first}"
        ) from e
    return ChainGraph(
        model=chain,
        feeds=tuple(feeds),
        inputs=tuple(graph_inputs),
        outputs=tuple((out.brick, out.index) for out in unread),
    )
