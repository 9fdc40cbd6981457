"""The traced function of a chain: its order, its feeding and its stamps.

`layout` spreads the empty links among the bricks, `feed_plan` decides
which inputs a brick reads from the brick before it, and `chain_function`
builds the one `tf.function` that runs a pass with a `tf.timestamp()`
between links (`dlbricks_tf.measuring.chain.ChainTimer` times it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import keras
import tensorflow as tf

from dlbricks_tf.measuring.timing_loop import pack_inputs


def layout(order: Sequence[int], empty: int) -> list[int | None]:
    """Chain order: `order` with `empty` Nones spread among its entries.

    The empty links are evenly spaced, the first before any brick, so that
    they sample the link cost all along the chain.
    """
    empty = max(empty, 1)
    layout: list[int | None] = []
    placed = 0
    for position, i in enumerate(order):
        while placed < empty and placed * len(order) <= position * empty:
            layout.append(None)
            placed += 1
        layout.append(i)
    layout += [None] * (empty - placed)
    return layout


def feed_plan(
    models: Sequence[keras.Model],
    specs: Sequence[Sequence[tuple[tuple[int, ...], str]]],
) -> list[list[int | None]]:
    """Which inputs of each brick are outputs of the brick before it.

    In a model, a layer reads what the layer before it has just written,
    hot in cache. In a chain in the models' order, most bricks follow the
    brick that precedes them in their model: an input whose shape and dtype
    are those of an output of the brick before is fed that output (each
    output feeds at most one input). Only floating inputs: integer inputs
    are ids or indices with bounds.

    Returns:
        Per brick, per flat input: the index of the previous brick's flat
        output it is fed, or None (a synthetic input, copied afresh).
    """
    plan: list[list[int | None]] = []
    previous: list[tuple[tuple[int, ...], str]] = []
    for model, model_specs in zip(models, specs, strict=True):
        unused = list(enumerate(previous))
        row: list[int | None] = []
        for shape, dtype in model_specs:
            match = None
            if tf.dtypes.as_dtype(dtype).is_floating:
                for k, (index, (out_shape, out_dtype)) in enumerate(unused):
                    if (
                        out_dtype == dtype
                        and out_shape[1:] == tuple(shape[1:])
                        and out_shape[0] in (None, shape[0])
                    ):
                        match = index
                        del unused[k]
                        break
            row.append(match)
        plan.append(row)
        previous = [
            (tuple(y.shape), y.dtype) for y in keras.tree.flatten(model.outputs)
        ]
    return plan


def chain_function(
    models: Sequence[keras.Model],
    layout: Sequence[int | None],
    plan: Sequence[Sequence[int | None]],
    slots: Mapping[tuple[int, int], int],
    signature: Sequence[tf.TensorSpec],
):
    """Returns f(inputs) -> the duration of every link in one pass.

    `layout` gives each link's brick (None: an empty link); `plan` the
    feeding of each brick link (see `feed_plan`). `inputs` is the flat
    list of the synthetic inputs (input j of brick i at `slots[i, j]`,
    with `signature`), then one float32 for the empty links, each with an
    outer dimension of 1 (the slice that orders a link after its stamp).
    The result is float64 seconds, one entry per link of `layout`, and a
    float32 that keeps the bricks live.

    One pass, no `tf.while_loop`: a loop body captures every weight of
    every brick as a loop variable, which doubled both the trace and the
    first call (graph optimisation and instantiation) of a chain. Passes
    are repeated by the caller; what runs between two calls is outside
    every link. The scaffolding of a link is kept to a few ops (two
    stamps, a slice per input and per output): it is traced, optimised
    and instantiated with the bricks. It is built from `tf.raw_ops`, the
    same ops as `tf.timestamp`, `tf.strided_slice` or `+` make, without
    their Python dispatch: a third less of its trace.
    """
    signature = [*signature, tf.TensorSpec([1], tf.float32)]

    @tf.function(input_signature=[signature], autograph=False)
    def run(inputs):
        scalar = inputs[-1]
        # Slices share their index constants (see `_FirstElement`).
        first = _FirstElement()
        stamp = tf.raw_ops.Timestamp()
        stamps, ends = [], []
        previous: list[tf.Tensor] = []  # The last brick's flat outputs.
        rows = iter(plan)
        for owner in layout:
            # Untimed, between the previous link's end and this one's
            # start: the link's inputs are written afresh, as the layer
            # before it would in a model (hot in cache, weights not): the
            # previous brick's outputs where they fit, else copies of the
            # synthetic inputs that depend on the previous stamp by data.
            zero = None
            flat = []
            row = next(rows) if owner is not None else [None]
            for j, fed in enumerate(row):
                if fed is not None:
                    with tf.control_dependencies([stamp]):
                        flat.append(
                            tf.raw_ops.ExpandDims(
                                input=previous[fed], axis=first.zero
                            )
                        )
                    continue
                if zero is None:
                    zero = _cast(tf.raw_ops.IsNan(x=stamp), tf.float32)
                x = scalar if owner is None else inputs[slots[owner, j]]
                flat.append(_plus(x, zero))
            with tf.control_dependencies(flat):
                start = tf.raw_ops.Timestamp()
            # The link starts after its stamp. Only a slice of each input
            # carries that edge: a control edge on the brick's own ops (or
            # on an Identity, which grappler removes and whose edges it
            # moves onto them) keeps grappler from fusing them (Sigmoid and
            # Mul into Swish), as it fuses them in a model. The brick's
            # weight reads, and what it computes from them alone, wait for
            # nothing and run outside the link, as a model runs them beside
            # its kernels: an edge on each read raised small-layer models'
            # estimates by up to 12%, past their measurements.
            with tf.control_dependencies([start]):
                flat = [first.of_outer(x) for x in flat]
            if owner is None:
                outputs = [tf.raw_ops.AddV2(x=flat[0], y=first.one)]
            else:
                model = models[owner]
                outputs = tf.nest.flatten(
                    model(pack_inputs(model, flat), training=False)
                )
                previous = outputs
            # Grappler turns a stateless op whose outputs feed only control
            # edges into a NoOp, so a brick's outputs are consumed by data:
            # one element of each, read before the stamp that ends the
            # link, is summed into the function's second result.
            link_ends = [first.of_all(y) for y in outputs]
            ends += link_ends
            with tf.control_dependencies(link_ends):
                stamp = tf.raw_ops.Timestamp()
            stamps += [start, stamp]
        stamps = tf.stack(stamps)
        total = tf.add_n(
            [
                e if e.dtype == tf.float32 else tf.cast(e, tf.float32)
                for e in ends
            ]
        )
        return stamps[1::2] - stamps[0::2], total

    return run


class _FirstElement:
    """Static slices `x[0]` and `y[0, ..., 0]` over shared index constants.

    Also holds the links' other constants: `zero` (the axis of an
    `ExpandDims`) and `one` (what an empty link adds).
    """

    def __init__(self) -> None:
        self._consts: dict[int, tuple[tf.Tensor, tf.Tensor, tf.Tensor]] = {}
        self.zero = tf.constant(0, tf.int32)
        self.one = tf.constant(1.0, tf.float32)

    def _indices(self, rank: int) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        if rank not in self._consts:
            self._consts[rank] = (
                tf.zeros([rank], tf.int32),
                tf.ones([rank], tf.int32),
                tf.ones([rank], tf.int32),
            )
        return self._consts[rank]

    def _slice(self, x: tf.Tensor, rank: int) -> tf.Tensor:
        begin, end, strides = self._indices(rank)
        return tf.raw_ops.StridedSlice(
            input=x,
            begin=begin,
            end=end,
            strides=strides,
            shrink_axis_mask=(1 << rank) - 1,
        )

    def of_outer(self, x: tf.Tensor) -> tf.Tensor:
        """`x[0]`: the outermost dimension dropped."""
        return self._slice(x, 1)

    def of_all(self, y: tf.Tensor) -> tf.Tensor:
        """`y[0, ..., 0]`: the first element, as a scalar."""
        rank = len(y.shape)
        return y if rank == 0 else self._slice(y, rank)


def _cast(x: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """`tf.cast(x, dtype)` as the op it makes (`Cast`, no truncation)."""
    return tf.raw_ops.Cast(x=x, DstT=dtype, Truncate=False)


def _plus(x: tf.Tensor, zero: tf.Tensor) -> tf.Tensor:
    """A fresh copy of `x` that data-depends on `zero`.

    `zero` is 0.0 computed from a timestamp: no optimiser can prove a
    timestamp is not NaN, so the copy is never folded away.
    """
    if x.dtype == tf.bool:
        return tf.raw_ops.LogicalOr(x=x, y=_cast(zero, tf.bool))
    if x.dtype != tf.float32:
        zero = _cast(zero, x.dtype)
    return tf.raw_ops.AddV2(x=x, y=zero)
