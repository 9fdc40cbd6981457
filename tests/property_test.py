"""Property-based tests of dlbricks_tf.decompose on random Keras models.

Hypothesis draws a `Plan`: plain data that says which operations read which
earlier tensors: Dense, Conv2D, DepthwiseConv2D, pooling (local and global),
BatchNormalization, Dropout, ReLU and Activation, padding and up-sampling,
Add and Concatenate (layers or raw keras.ops), Flatten and Reshape, raw
keras.ops calls (a scale, a slice, a two-way split), shared layers (one layer
called on several tensors of its input shape) and nested blocks (a small
Functional model, with list or dict inputs and outputs, or a Sequential one,
called once or twice, nesting up to two deep), some layers under the
mixed_float16 policy; one or two model inputs, one to three outputs. Shapes
are tracked while drawing, so every plan builds; `_build` turns a plan into a
`keras.Model`. For every drawn model and G in 1..6 the tests check that

* every layer call (and the Cast of a nested model's input whose dtype it
  changes) is in exactly one brick, each brick holds 1..G calls, a
  brick is shorter than G only where the split had to cut (Algorithm 2's
  fallback or the end of the model), and the brick DAG names exactly the
  bricks each brick reads from;
* signatures are stable: the same model decomposed twice, the same plan
  built again (other layer names and seeds), and the model read back from
  its JSON config give the same bricks and signatures; equal signatures,
  across all examples of a run, mean equal classes and tensor specs;
* every brick builds and runs, its outputs have the recorded specs, and the
  bricks evaluated along the brick DAG with the model's weights copied in
  reproduce the model's outputs;
* two bricks of one signature (across all examples of a run) compute the
  same function: given the same weights and inputs, the same outputs;
* a built brick decomposed again with G = its size gives back its calls,
  and, when as one brick, one of the same signature (a published brick
  keeps its signature).

The examples are derandomized (the same ones on every run, for CI).
Environment:
  DLBRICKS_PROPERTY_EXAMPLES: examples per test (default: 60 for the
      structural test, 40 for the one that builds bricks; under a minute
      together on two cores, so that the whole suite stays well under 15
      minutes).
  DLBRICKS_PROPERTY_SEED: draw other examples, from this seed.
A long hunt for bugs:
  DLBRICKS_PROPERTY_EXAMPLES=400 DLBRICKS_PROPERTY_SEED=1 \\
      .venv/bin/python -m pytest tests/property_test.py -q
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import tempfile

import hypothesis
import keras
import numpy as np
import pytest
from hypothesis import strategies as st
from keras import layers, ops

import dlbricks_tf
from dlbricks_tf.cutting import brick as brick_lib
from dlbricks_tf.cutting import fidelity
from tests import models

_EXAMPLES = int(os.environ.get("DLBRICKS_PROPERTY_EXAMPLES") or 0)
_SEED = os.environ.get("DLBRICKS_PROPERTY_SEED")
_MAX_G = 6

# Input shapes (without the batch): small, so models build and run fast.
_INPUT_SHAPES = ((8, 8, 3), (6,), (5, 5, 2))
_ACTIVATIONS = ("relu", "tanh", "sigmoid", "elu", "softplus", "swish", "gelu")
# Layers of one input and one output, usable in a keras.Sequential too.
_UNARY_LAYERS = frozenset(
    {
        "dense",
        "conv",
        "depthwise",
        "pool",
        "gpool",
        "bn",
        "dropout",
        "relu",
        "act",
        "pad",
        "upsample",
        "flatten",
        "reshape",
    }
)
# Layers that may run under the mixed_float16 policy.
_MIXABLE = frozenset({"dense", "conv", "depthwise", "relu", "act"})

Shape = tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a plan.

    Attributes:
        kind: one of `_UNARY_LAYERS`; a raw op, "scale" (args: `(factor,)`),
            "slice" (args: `(width,)`) or "split" (two halves of the last
            axis); "add" or "concat" (args: `(raw,)`: keras.ops, not a
            layer); "shared" (args: `(op,)`: calls the layer of an earlier
            op again); "block" (args: `(plan,)`: a nested model) or "reuse"
            (args: `(op,)`: calls the block of an earlier op again).
        reads: the tensor ids it reads: the plan's inputs first, then each
            op's outputs in order.
        args: the kind's parameters.
        shapes: the shapes of the tensors it produces.
        mixed: the layer runs under the mixed_float16 policy.
    """

    kind: str
    reads: tuple[int, ...]
    args: tuple
    shapes: tuple[Shape, ...]
    mixed: bool = False


@dataclasses.dataclass(frozen=True)
class Plan:
    """A functional model, or a nested block, as plain data.

    Attributes:
        inputs: the input shapes.
        ops: the operations, in order.
        outputs: the output tensor ids (may repeat a tensor, or name an
            input).
        sequential: a block built as a keras.Sequential (a chain).
        with_input: a Sequential block starts with a keras.Input (else it
            is built by its first call).
        dict_io: a Functional block takes and returns dicts.
    """

    inputs: tuple[Shape, ...]
    ops: tuple[Op, ...]
    outputs: tuple[int, ...]
    sequential: bool = False
    with_input: bool = True
    dict_io: bool = False


# ---------------------------------------------------------------- drawing


def _pick(draw, candidates):
    """One of `candidates`, mostly the last (so mostly chains).

    Shrinks towards the last one too.
    """
    candidates = list(candidates)
    if len(candidates) == 1 or draw(st.integers(0, 3)) < 3:
        return candidates[-1]
    return candidates[-1 - draw(st.integers(0, len(candidates) - 1))]


def _rare(draw) -> bool:
    """True once in about eight draws (shrinks to False)."""
    return draw(st.integers(0, 7)) == 7


def _window(size: int, window: int, stride: int, padding: str) -> int:
    if padding == "same":
        return math.ceil(size / stride)
    return (size - window) // stride + 1


def _unary_kinds(shape: Shape, sequential: bool) -> list[str]:
    """The unary operations that apply to a tensor of `shape`."""
    kinds = ["dense", "bn", "dropout", "relu", "act", "flatten", "reshape"]
    if len(shape) == 3:
        # Convolutions most, so that images stay images for a while.
        kinds += ["conv", "conv", "conv", "depthwise", "pool", "gpool"]
        if max(shape[:2]) <= 8:
            kinds += ["pad", "upsample"]
    if not sequential:
        kinds.append("scale")
        if shape[-1] >= 2:
            kinds.append("slice")
        if shape[-1] % 2 == 0:
            kinds.append("split")
    return kinds


def _draw_unary(draw, kind: str, shape: Shape) -> tuple[tuple, tuple]:
    """Parameters and output shapes of a unary op applied to `shape`."""
    if kind == "dense":
        units = draw(st.sampled_from((3, 2, 5)))
        act = draw(st.sampled_from((None, "relu", "tanh")))
        return (units, act), ((*shape[:-1], units),)
    if kind in ("conv", "depthwise"):
        h, w, c = shape
        kernel = draw(st.sampled_from((1, 2, 3)))
        stride = draw(st.sampled_from((1, 2)))
        padding = "valid"
        if min(h, w) < kernel or draw(st.booleans()):
            padding = "same"
        filters = c
        if kind == "conv":
            filters = draw(st.sampled_from((c, 2, 4)))
        act = draw(st.sampled_from((None, "relu")))
        out = (
            _window(h, kernel, stride, padding),
            _window(w, kernel, stride, padding),
            filters,
        )
        return (filters, kernel, stride, padding, act), (out,)
    if kind == "pool":
        h, w, c = shape
        average = draw(st.booleans())
        size = draw(st.sampled_from((2, 1)))
        padding = "valid"
        if min(h, w) < size or draw(st.booleans()):
            padding = "same"
        out = (
            _window(h, size, size, padding),
            _window(w, size, size, padding),
            c,
        )
        return (average, size, padding), (out,)
    if kind == "gpool":
        return (draw(st.booleans()),), ((shape[-1],),)
    if kind == "dropout":
        return (draw(st.sampled_from((0.5, 0.1))),), (shape,)
    if kind == "relu":
        return (draw(st.sampled_from((None, 6.0))),), (shape,)
    if kind == "act":
        return (draw(st.sampled_from(_ACTIVATIONS)),), (shape,)
    if kind == "pad":
        h, w, c = shape
        return (), ((h + 2, w + 2, c),)
    if kind == "upsample":
        h, w, c = shape
        return (), ((2 * h, 2 * w, c),)
    if kind == "flatten":
        return (), ((math.prod(shape),),)
    if kind == "reshape":
        if len(shape) == 1:
            targets = ((1, 1, shape[0]), (shape[0], 1, 1))
        else:
            h, w, c = shape
            targets = ((h * w * c,), (h * w, 1, c))
        target = draw(st.sampled_from(targets))
        return (target,), (target,)
    if kind == "scale":
        return (draw(st.sampled_from((2.0, 0.5))),), (shape,)
    if kind == "slice":
        width = draw(st.integers(1, shape[-1] - 1))
        return (width,), ((*shape[:-1], width),)
    if kind == "split":
        half = (*shape[:-1], shape[-1] // 2)
        return (), (half, half)
    assert kind == "bn", kind
    return (), (shape,)


def _draw_merge(draw, kind: str, shapes: list[Shape]) -> Op | None:
    """An Add or Concatenate of 2-3 earlier tensors, if any can join."""

    def group(s: Shape) -> Shape:
        return s if kind == "add" else (*s[:-1], -1)

    groups = collections.defaultdict(list)
    for t, s in enumerate(shapes):
        groups[group(s)].append(t)
    joinable = [ts for ts in groups.values() if len(ts) >= 2]
    if not joinable:
        return None
    # The group of the newest tensor first, so merges shrink to residuals.
    joinable.sort(key=lambda ts: -ts[-1])
    tensors = joinable[draw(st.integers(0, len(joinable) - 1))]
    first = _pick(draw, tensors)
    reads = [first, _pick(draw, [t for t in tensors if t != first])]
    if _rare(draw):
        reads.append(_pick(draw, tensors))  # May repeat a tensor.
    raw = len(reads) == 2 and draw(st.booleans())
    if kind == "add":
        out = shapes[first]
    else:
        out = (*shapes[first][:-1], sum(shapes[t][-1] for t in reads))
    return Op(kind, tuple(reads), (raw,), (out,))


def _draw_reuse(draw, shapes, ops, kind: str) -> Op | None:
    """Calls an earlier layer ("shared") or block ("reuse") again."""
    choices = []
    for j, op in enumerate(ops):
        reusable = op.kind in _UNARY_LAYERS if kind == "shared" else False
        if kind == "reuse":
            reusable = op.kind == "block"
        if not reusable:
            continue
        wanted = [shapes[t] for t in op.reads]
        pools = [[t for t, s in enumerate(shapes) if s == w] for w in wanted]
        if all(pools):
            choices.append((j, pools))
    if not choices:
        return None
    j, pools = _pick(draw, choices)
    reads = tuple(_pick(draw, pool) for pool in pools)
    return Op(kind, reads, (j,), ops[j].shapes, ops[j].mixed)


def _draw_block(draw, shapes, depth: int, in_sequential: bool) -> Op:
    """A nested Functional (1-2 inputs) or Sequential (1 input) block."""
    tensors = list(range(len(shapes)))
    if in_sequential:
        reads = [tensors[-1]]
    else:
        reads = [_pick(draw, tensors)]
        if draw(st.booleans()):
            reads.append(_pick(draw, tensors))  # May repeat a tensor.
    sequential = len(reads) == 1 and draw(st.booleans())
    plan = draw(
        plans(
            inputs=tuple(shapes[t] for t in reads),
            depth=depth + 1,
            sequential=sequential,
            max_ops=4,
            max_outputs=1 if in_sequential else 2,
        )
    )
    inner = list(plan.inputs) + [s for op in plan.ops for s in op.shapes]
    out_shapes = tuple(inner[t] for t in plan.outputs)
    return Op("block", tuple(reads), (plan,), out_shapes)


@st.composite
def plans(
    draw,
    inputs=None,
    depth=0,
    sequential=False,
    max_ops=12,
    max_outputs=3,
):
    """A `Plan`: inputs, operations over earlier tensors, outputs.

    Args:
        draw: hypothesis's draw.
        inputs: the input shapes (None: one or two drawn shapes).
        depth: how deep in nested blocks the plan is (blocks nest two deep).
        sequential: a chain of unary layers and blocks, for a
            keras.Sequential block.
        max_ops: the most operations.
        max_outputs: the most outputs.
    """
    top = inputs is None
    if top:
        count = draw(st.integers(1, 2))
        inputs = tuple(
            draw(st.sampled_from(_INPUT_SHAPES)) for _ in range(count)
        )
    shapes: list[Shape] = list(inputs)
    ops: list[Op] = []
    if sequential:
        kinds = ["unary"] * 6 + (["block"] if depth < 2 else [])
    else:
        kinds = ["unary"] * 6 + ["add", "concat", "shared"]
        if depth < 2:
            kinds += ["block", "reuse"]
    for _ in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(kinds))
        if sequential and kind == "block" and ops and ops[-1].mixed:
            # A Sequential records no dtype between its layers, so a nested
            # model there cannot know it must cast (see graph.py `bind`).
            kind = "unary"
        op = None
        if kind in ("add", "concat"):
            op = _draw_merge(draw, kind, shapes)
        elif kind in ("shared", "reuse"):
            op = _draw_reuse(draw, shapes, ops, kind)
        elif kind == "block":
            op = _draw_block(draw, shapes, depth, sequential)
        if op is None:
            src = len(shapes) - 1
            if not sequential:
                src = _pick(draw, range(len(shapes)))
            unary = draw(st.sampled_from(_unary_kinds(shapes[src], sequential)))
            args, out = _draw_unary(draw, unary, shapes[src])
            mixed = unary in _MIXABLE and _rare(draw)
            op = Op(unary, (src,), args, out, mixed)
        ops.append(op)
        shapes.extend(op.shapes)
    produced = list(range(len(inputs), len(shapes)))
    if sequential:
        return Plan(
            tuple(inputs),
            tuple(ops),
            (produced[-1],),
            sequential=True,
            with_input=not _rare(draw),
        )
    outputs = [_pick(draw, produced)]
    while len(outputs) < max_outputs and draw(st.booleans()):
        others = [t for t in produced if t not in outputs]
        if _rare(draw) or not others:
            # A repeated output, or an input passed through.
            others = [*range(len(inputs)), *outputs]
        outputs.append(_pick(draw, others))
    # Blocks inside a Sequential take and return one tensor.
    dict_io = not top and max_outputs > 1 and draw(st.booleans())
    return Plan(tuple(inputs), tuple(ops), tuple(outputs), dict_io=dict_io)


# --------------------------------------------------------------- building


def _layer(op: Op) -> keras.Layer:
    """A fresh, auto-named Keras layer for a unary-layer op."""
    a = op.args
    policy = {"dtype": "mixed_float16"} if op.mixed else {}
    if op.kind == "dense":
        return layers.Dense(a[0], activation=a[1], **policy)
    if op.kind == "conv":
        filters, kernel, stride, padding, act = a
        return layers.Conv2D(
            filters,
            kernel,
            strides=stride,
            padding=padding,
            activation=act,
            **policy,
        )
    if op.kind == "depthwise":
        _, kernel, stride, padding, act = a
        return layers.DepthwiseConv2D(
            kernel, strides=stride, padding=padding, activation=act, **policy
        )
    if op.kind == "pool":
        average, size, padding = a
        cls = layers.AveragePooling2D if average else layers.MaxPooling2D
        return cls(size, padding=padding)
    if op.kind == "gpool":
        if a[0]:
            return layers.GlobalAveragePooling2D()
        return layers.GlobalMaxPooling2D()
    if op.kind == "bn":
        return layers.BatchNormalization()
    if op.kind == "dropout":
        return layers.Dropout(a[0])
    if op.kind == "relu":
        return layers.ReLU(max_value=a[0], **policy)
    if op.kind == "act":
        return layers.Activation(a[0], **policy)
    if op.kind == "pad":
        return layers.ZeroPadding2D(1)
    if op.kind == "upsample":
        return layers.UpSampling2D(2)
    if op.kind == "flatten":
        return layers.Flatten()
    if op.kind == "reshape":
        return layers.Reshape(a[0])
    raise AssertionError(op.kind)


def _one_or_list(xs: list):
    return xs[0] if len(xs) == 1 else list(xs)


def _keys(count: int) -> list[str]:
    """Dict keys whose sorted order is not their order of creation."""
    return [f"{chr(ord('z') - i)}{i}" for i in range(count)]


def _call_block(block: keras.Model, plan: Plan, xs: list) -> list:
    if plan.dict_io:
        result = block(dict(zip(_keys(len(xs)), xs, strict=True)))
        return [result[k] for k in _keys(len(plan.outputs))]
    return keras.tree.flatten(block(_one_or_list(xs)))


def _run(plan: Plan, inputs: list) -> tuple[list, list[str]]:
    """Applies the plan to `inputs`.

    Returns:
        The output tensors, and the qualified names of the layer calls a
        model of them holds (each call once, nested blocks flattened): what
        its decomposition must cover.
    """
    tensors = list(inputs)
    made: list = []  # Per op: the layer or (block, its calls) it made.
    calls: list[list[str]] = []  # Per op: the calls it makes.
    for op in plan.ops:
        xs = [tensors[t] for t in op.reads]
        made.append(None)
        if op.kind in _UNARY_LAYERS:
            made[-1] = _layer(op)
            ys = [made[-1](xs[0])]
        elif op.kind == "shared":
            ys = [made[op.args[0]](xs[0])]
        elif op.kind in ("block", "reuse"):
            if op.kind == "block":
                inner_plan = op.args[0]
                made[-1] = _block(inner_plan)
                block, inner = made[-1]
            else:
                inner_plan = plan.ops[op.args[0]].args[0]
                block, inner = made[op.args[0]]
            ys = _call_block(block, inner_plan, xs)
            calls.append(
                _casts(block, inner_plan, xs)
                + [f"{block.name}/{name}" for name in inner]
            )
        elif op.kind == "add":
            ys = [xs[0] + xs[1] if op.args[0] else layers.Add()(xs)]
        elif op.kind == "concat":
            if op.args[0]:
                ys = [ops.concatenate(xs, axis=-1)]
            else:
                ys = [layers.Concatenate()(xs)]
        elif op.kind == "scale":
            ys = [xs[0] * op.args[0]]
        elif op.kind == "slice":
            ys = [xs[0][..., : op.args[0]]]
        elif op.kind == "split":
            ys = list(ops.split(xs[0], 2, axis=-1))
        else:
            raise AssertionError(op.kind)
        if op.kind not in ("block", "reuse"):
            calls.append([ys[0]._keras_history[0].name])  # noqa: SLF001
        assert [tuple(y.shape[1:]) for y in ys] == list(op.shapes), op
        tensors.extend(ys)
    # Keras keeps only the calls the outputs depend on.
    needed = set(plan.outputs)
    first = len(tensors)
    reached = []
    for j in reversed(range(len(plan.ops))):
        first -= len(plan.ops[j].shapes)
        if needed.intersection(range(first, first + len(plan.ops[j].shapes))):
            reached.append(j)
            needed.update(plan.ops[j].reads)
    expected = [name for j in sorted(reached) for name in calls[j]]
    return [tensors[t] for t in plan.outputs], expected


def _casts(block: keras.Model, plan: Plan, xs: list) -> list[str]:
    """The Cast calls a nested block's inputs get (see graph.py `bind`)."""
    # `inputs`, not `input`: a Sequential's `input` is its first caller's.
    inputs = list(block.inputs)
    if plan.dict_io:
        by_name = {x._keras_history[0].name: x for x in inputs}  # noqa: SLF001
        inputs = [by_name[k] for k in _keys(len(plan.inputs))]
    return [
        f"{block.name}/{inp._keras_history[0].name}/cast"  # noqa: SLF001
        for inp, x in zip(inputs, xs, strict=True)
        if inp.dtype != x.dtype
    ]


def _block(plan: Plan) -> tuple[keras.Model, list[str]]:
    """A nested block and the calls it makes, unqualified."""
    if plan.sequential:
        chain, calls = [], []
        for op in plan.ops:
            if op.kind == "block":
                inner, inner_calls = _block(op.args[0])
                chain.append(inner)
                calls += [f"{inner.name}/{name}" for name in inner_calls]
            else:
                chain.append(_layer(op))
                calls.append(chain[-1].name)
        if plan.with_input:
            chain.insert(0, keras.Input(plan.inputs[0]))
        return keras.Sequential(chain), calls
    names = _keys(len(plan.inputs)) if plan.dict_io else [None] * 2
    inputs = [
        keras.Input(shape, name=name)
        for shape, name in zip(plan.inputs, names, strict=False)
    ]
    outputs, calls = _run(plan, inputs)
    if plan.dict_io:
        block = keras.Model(
            dict(zip(_keys(len(inputs)), inputs, strict=True)),
            dict(zip(_keys(len(outputs)), outputs, strict=True)),
        )
    else:
        block = keras.Model(_one_or_list(inputs), _one_or_list(outputs))
    return block, calls


def _build(plan: Plan) -> tuple[keras.Model, list[str]]:
    """The plan's model, and the qualified names of its calls."""
    inputs = [keras.Input(shape) for shape in plan.inputs]
    outputs, calls = _run(plan, inputs)
    model = keras.Model(_one_or_list(inputs), _one_or_list(outputs))
    return model, calls


def _perturb(model: keras.Model, rng: np.random.Generator) -> None:
    """Moves every weight off its initial value (BN statistics too)."""
    seen = set()
    for v in model.weights:
        if id(v) in seen:
            continue
        seen.add(id(v))
        shape = tuple(v.shape)
        if v.path.endswith(("moving_variance", "gamma")):
            value = rng.uniform(0.5, 1.5, shape)
        else:
            value = np.asarray(v) + rng.normal(0.0, 0.2, shape)
        v.assign(value.astype(v.dtype))


# ----------------------------------------------------------------- checks


def _check_split(d: dlbricks_tf.Decomposition, granularity: int) -> None:
    """Bricks are G long but where Algorithm 2 fell back or calls ran out."""
    left = d.num_calls
    for b in d.bricks:
        assert len(b.layers) in (1, min(granularity, left)), b.layers
        left -= len(b.layers)


def _check_dag(d: dlbricks_tf.Decomposition) -> None:
    """Each brick reads model inputs or outputs of the bricks it names."""
    producer = {}
    for i, b in enumerate(d.bricks):
        for t in b.output_ids:
            assert t not in producer, f"tensor {t} exposed twice"
            assert t not in d.inputs
            producer[t] = i
    for i, b in enumerate(d.bricks):
        assert len(set(b.input_ids)) == len(b.input_ids)
        for t in b.input_ids:
            assert t in d.inputs or producer[t] < i, (i, t)
        reads = {producer[t] for t in b.input_ids if t not in d.inputs}
        assert d.dependencies[i] == tuple(sorted(reads)), i
    for t in d.outputs:
        assert t in producer or t in d.inputs, t


def _summary(d: dlbricks_tf.Decomposition) -> list[tuple]:
    """What must not change between decompositions of one model."""
    return [
        (b.signature, b.class_names, b.inputs, b.outputs, len(b.input_ids))
        for b in d.bricks
    ]


def _check_signatures_mean_bricks(seen: dict, bricks) -> None:
    """Equal signatures: equal classes and specs (across all examples)."""
    for b in bricks:
        classes, inputs, outputs = seen.setdefault(
            b.signature, (b.class_names, b.inputs, list(b.outputs))
        )
        assert (classes, inputs) == (b.class_names, b.inputs), b.signature
        assert len(outputs) == len(b.outputs), b.signature
        # An output spec is None where the config does not record it.
        for i, spec in enumerate(b.outputs):
            if outputs[i] is None:
                outputs[i] = spec
            assert spec is None or outputs[i] == spec, b.signature


def _check_brick_runs(b, brick_model, rng, seen: dict) -> bool:
    """Runs a built brick on random inputs and checks its outputs.

    The first brick of a signature (in the whole run) leaves its weights,
    inputs and outputs in `seen`; a later one of the same signature gets
    those weights and inputs and must compute the same outputs. Signatures
    leave weights out, so also which calls share a layer (and weights): a
    layer called twice and two layers of one config are one signature, and
    only bricks that share alike are compared.

    Returns:
        Whether the brick's signature had been seen.
    """
    sharing = tuple(b.layers.index(name) for name in b.layers)
    known = seen.get((b.signature, sharing))
    if known is None:
        xs = [
            rng.standard_normal((2, *spec.shape)).astype(spec.dtype)
            for spec in b.inputs
        ]
        weights = brick_model.get_weights()
    else:
        weights, xs, expected = known
        brick_model.set_weights(weights)
    outs = brick_model(_one_or_list(xs), training=False)
    outs = [np.asarray(out) for out in keras.tree.flatten(outs)]
    assert len(outs) == len(b.output_ids), b.layers
    for out, spec in zip(outs, b.outputs, strict=True):
        if spec is not None:
            assert out.shape == (2, *spec.shape), b.layers
            assert str(out.dtype) == spec.dtype, b.layers
        assert np.all(np.isfinite(out)), b.layers
    if known is None:
        seen[(b.signature, sharing)] = (weights, xs, outs)
        return False
    for out, want in zip(outs, expected, strict=True):
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    return True


def _check_brick_decomposes_into_itself(b, brick_model) -> bool:
    """A built brick, decomposed again with G = its size, is the same brick.

    Its calls come back in bricks; when they come back as one brick, it has
    the same signature, so a brick published in a suite keeps its
    signature. (They need not come back as one: the walk of the built model
    may order two branches the other way round, and then the split cuts.)

    Returns:
        Whether the calls came back as one brick.
    """
    again = dlbricks_tf.decompose(brick_model, granularity=len(b.layers))
    names = sorted(name for x in again.bricks for name in x.layers)
    assert names == sorted(brick_lib.layer_name(n) for n in b.layers)
    if len(again.bricks) > 1:
        return False
    assert again.bricks[0].signature == b.signature, b.layers
    return True


def _property(default_examples: int, **extra):
    """`hypothesis.given` (plan, granularity, **extra), this file's settings."""

    def wrap(test):
        test = hypothesis.given(
            plan=plans(), granularity=st.integers(1, _MAX_G), **extra
        )(test)
        test = hypothesis.settings(
            max_examples=_EXAMPLES or default_examples,
            deadline=None,  # Keras builds take a varying while.
            derandomize=_SEED is None,
            database=None,  # Nothing written into the source tree.
            print_blob=True,
        )(test)
        if _SEED is not None:
            test = hypothesis.seed(int(_SEED))(test)
        return test

    return wrap


def _report(capsys, record_property, name: str, counts) -> None:
    text = ", ".join(f"{v} {k}" for k, v in counts.items())
    record_property(name, text)
    with capsys.disabled():
        print(f"\n{name}: {text}")


# ------------------------------------------------------------------ tests


def test_every_call_in_one_brick_and_signatures_stable(capsys, record_property):
    counts = collections.Counter(examples=0, calls=0, bricks=0)
    signatures: dict = {}

    @_property(default_examples=60)
    def check(plan, granularity):
        keras.backend.clear_session()
        model, calls = _build(plan)
        d = dlbricks_tf.decompose(model, granularity)
        models.check_decomposition(d, granularity)
        got = sorted(name for b in d.bricks for name in b.layers)
        assert got == sorted(calls), "every call in exactly one brick"
        _check_split(d, granularity)
        _check_dag(d)

        again = dlbricks_tf.decompose(model, granularity)
        assert _summary(again) == _summary(d), "same model, same bricks"
        # Built again, the layers get other names (and Dropout other seeds).
        twin, _ = _build(plan)
        twin_d = dlbricks_tf.decompose(twin, granularity)
        assert _summary(twin_d) == _summary(d), "names change no signature"
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.json")
            with open(path, "w") as f:
                f.write(model.to_json())
            from_file = dlbricks_tf.decompose(path, granularity)
        assert _summary(from_file) == _summary(d), "file and memory agree"
        _check_signatures_mean_bricks(signatures, d.bricks)

        counts["examples"] += 1
        counts["calls"] += d.num_calls
        counts["bricks"] += len(d.bricks)
        counts["nested"] += any("/" in name for name in calls)
        counts["two inputs"] += len(plan.inputs) == 2

    check()
    counts["unique signatures"] = len(signatures)
    _report(capsys, record_property, "structure", counts)


def test_bricks_build_run_and_reproduce_the_model(capsys, record_property):
    counts = collections.Counter(
        {
            "examples": 0,
            "bricks": 0,
            "bricks of a signature seen before": 0,
            "bricks that decompose into themselves": 0,
        }
    )
    seen: dict = {}  # Signature -> (weights, inputs, outputs) of a brick.

    # fuse: fusion units kept whole (dlbricks_tf.cutting.split.fusion_units).
    @_property(default_examples=40, fuse=st.booleans())
    def check(plan, granularity, fuse):
        keras.backend.clear_session()
        keras.utils.set_random_seed(0)
        rng = np.random.default_rng(0)
        model, _ = _build(plan)
        _perturb(model, rng)
        d = dlbricks_tf.decompose(model, granularity, fuse=fuse)
        counts["fused decompositions"] += fuse
        models.check_decomposition(d, granularity)
        built = []
        for b in d.bricks:
            brick_model = b.build(batch_size=2)
            counts["bricks of a signature seen before"] += _check_brick_runs(
                b, brick_model, rng, seen
            )
            counts["bricks that decompose into themselves"] += (
                _check_brick_decomposes_into_itself(b, brick_model)
            )
            fidelity.copy_weights(model, b, brick_model)
            built.append(brick_model)

        inputs = [
            rng.standard_normal((2, *shape)).astype("float32")
            for shape in plan.inputs
        ]
        got = fidelity.evaluate(d, built, inputs)
        want = keras.tree.flatten(model(_one_or_list(inputs), training=False))
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            g, w = np.asarray(g), np.asarray(w)
            assert g.dtype == w.dtype
            tolerance = 1e-2 if w.dtype == np.float16 else 1e-5
            scale = max(1.0, float(np.max(np.abs(w), initial=0.0)))
            np.testing.assert_allclose(
                g.astype("float32"),
                w.astype("float32"),
                rtol=10 * tolerance,
                atol=tolerance * scale,
            )

        counts["examples"] += 1
        counts["bricks"] += len(d.bricks)

    check()
    _report(capsys, record_property, "bricks reproduce", counts)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
