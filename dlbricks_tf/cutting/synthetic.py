"""Synthetic inputs for a built Keras model, valid in dtype and range.

A brick or model is timed on random data, but the data must be data the
model accepts: integer ids fed to an `Embedding` stay below its
`input_dim` (an out-of-range id fails on CPU), masks are 0/1, floats are
standard normal (a large input repeats a block of 65,536 draws). The id
bound of each integer input is found by following the model's graph from
the input through integer-valued tensors to the layers that consume them
as indices (also inside nested models).

Where the graph is not at hand (an ONNX file, a SavedModel behind
`keras.layers.TFSMLayer`, whose graph hides its Embeddings),
`arrays_for_specs` makes the same arrays from recorded input specs and id
bounds.

A model whose inputs leave dimensions open beyond the batch (a
transformer's sequence length) gets them from `input_shapes`, {input name:
shape without the batch}, "*" standing for every input not named; the same
mapping fixes them in `dlbricks_tf.decompose`, so a whole model is timed
at the shapes its bricks were cut at.

Example:
    xs = synthetic_inputs(model, batch_size=1, seed=0)
    model(xs if len(xs) > 1 else xs[0])
    ys = arrays_for_specs([((5,), "int32")], [100], batch_size=2)
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np

# Exclusive upper bound for integer inputs that feed no index-consuming
# layer: small, so that they stay valid as counts, positions or indices.
SMALL_INT_HIGH = 8


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _index_bound(operation: Any) -> int | None:
    """Exclusive bound on the ids an operation accepts as input, if any."""
    if isinstance(operation, keras.layers.Embedding):
        return int(operation.input_dim)
    if isinstance(operation, keras.layers.CategoryEncoding):
        return int(operation.num_tokens)
    return None


def _functional(model: Any) -> Any:
    """The functional graph behind a model, or None (subclassed model)."""
    if isinstance(model, keras.Sequential):
        model = getattr(model, "_functional", None)
    if model is None or not hasattr(model, "_nodes_by_depth"):
        return None
    return model


def _flat_layers(model: keras.Model) -> list[Any]:
    if not hasattr(model, "_flatten_layers"):  # A `BrickProgram`.
        return list(model.layers)
    return list(model._flatten_layers(include_self=False, recursive=True))


def id_bounds(model: keras.Model) -> list[int | None]:
    """Returns, per flat model input, an exclusive upper bound for its ids.

    For an integer input, the bound is the smallest `input_dim` (or
    `num_tokens`) among the index-consuming layers reachable from it through
    integer-valued tensors; `None` if it reaches none. Float and bool inputs
    get `None`. For a model without a functional graph (subclassed), every
    integer input gets the smallest bound of any such layer in the model.

    Args:
        model: A built Keras model.

    Returns:
        One entry per element of `model.inputs`.
    """
    graph = _functional(model)
    if graph is None:
        bounds = [b for b in map(_index_bound, _flat_layers(model)) if b]
        fallback = min(bounds) if bounds else None
        return [
            fallback if _is_integer(str(t.dtype)) else None
            for t in model.inputs
        ]
    return _graph_bounds(graph)


def _graph_bounds(graph: Any) -> list[int | None]:
    consumers: dict[int, list[Any]] = collections.defaultdict(list)
    for nodes in graph._nodes_by_depth.values():
        for node in nodes:
            for tensor in node.input_tensors:
                consumers[id(tensor)].append(node)

    def bound_from(tensor: Any) -> int | None:
        found: list[int] = []
        stack, seen = [tensor], set()
        while stack:
            current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            for node in consumers.get(id(current), ()):
                op = node.operation
                direct = _index_bound(op)
                if direct is not None:
                    found.append(direct)
                    continue
                inner = _functional(op) if isinstance(op, keras.Model) else None
                if inner is not None:
                    found.extend(_nested_bounds(inner, node, current))
                    continue
                # Ids keep being ids through integer-valued ops (Reshape,
                # casts between int types, slicing, ...).
                stack.extend(
                    t for t in node.output_tensors if _is_integer(str(t.dtype))
                )
        return min(found) if found else None

    return [
        bound_from(t) if _is_integer(str(t.dtype)) else None
        for t in graph.inputs
    ]


def _nested_bounds(inner: Any, node: Any, tensor: Any) -> list[int]:
    """Bounds imposed by a nested model on the positions `tensor` feeds."""
    outer = list(node.input_tensors)
    inner_bounds = _graph_bounds(inner)
    if len(outer) != len(inner_bounds):
        # Unusual call structure: be safe and take every bound inside.
        return [b for b in map(_index_bound, _flat_layers(inner)) if b]
    return [
        b
        for t, b in zip(outer, inner_bounds, strict=True)
        if t is tensor and b is not None
    ]


def fixed_shapes(
    model_name: str,
    inputs: Sequence[tuple[str, Sequence[int | None]]],
    input_shapes: Mapping[str, Sequence[int | None]] | None,
) -> list[tuple[int | None, ...]]:
    """Each input's shape (batch left out) with its open dimensions given.

    Args:
        model_name: The model's name, for messages.
        inputs: (name, shape without the batch dimension) of each input.
        input_shapes: {input name: shape without the batch dimension};
            "*" stands for every input not named. None or empty changes
            nothing.

    Returns:
        The shapes, in the order of `inputs`.

    Raises:
        ValueError: For an unknown input name, or a shape that does not
            have the input's rank or disagrees with a fixed dimension.
    """
    shapes = [tuple(shape) for _, shape in inputs]
    if not input_shapes:
        return shapes
    names = [name for name, _ in inputs]
    unknown = sorted(set(input_shapes) - set(names) - {"*"})
    if unknown:
        raise ValueError(
            f"Model '{model_name}' has no input named {unknown[0]!r}; its "
            f"inputs are {', '.join(names) or 'none'} (or '*' for all)."
        )
    for i, (name, old) in enumerate(zip(names, shapes, strict=True)):
        shape = input_shapes.get(name, input_shapes.get("*"))
        if shape is None:
            continue
        shape = tuple(None if d is None else int(d) for d in shape)
        fits = len(shape) == len(old) and all(
            (o is None or n == o) and (n is None or n >= 1)
            for o, n in zip(old, shape, strict=True)
        )
        if not fits:
            raise ValueError(
                f"Input {name!r} of model '{model_name}' has shape {old} "
                f"(batch left out); {shape} does not fit it: give one "
                "positive size per dimension, the same where it is fixed."
            )
        shapes[i] = shape
    return shapes


def input_specs(
    model: keras.Model,
    batch_size: int,
    input_shapes: Mapping[str, Sequence[int | None]] | None = None,
) -> list[tuple[tuple[int, ...], str]]:
    """Returns (shape with batch dimension, dtype) per flat model input.

    Args:
        model: A built Keras model.
        batch_size: Batch dimension to use where the model leaves it open.
        input_shapes: Sizes of open dimensions, {input name: shape
            without the batch} ("*": every input not named); see
            `fixed_shapes`.

    Returns:
        Concrete shapes and Keras dtype names.

    Raises:
        ValueError: If an input has an unknown non-batch dimension that
            `input_shapes` does not give, a fixed batch dimension other
            than `batch_size`, or `input_shapes` does not fit the inputs.
    """
    given = fixed_shapes(
        model.name,
        [(t.name, tuple(t.shape)[1:]) for t in model.inputs],
        input_shapes,
    )
    specs = []
    for tensor, rest in zip(model.inputs, given, strict=True):
        shape = tuple(tensor.shape)
        if shape:
            shape = (shape[0], *rest)
        if not shape:
            raise ValueError(
                f"Input {tensor.name!r} of model {model.name!r} is a scalar;"
                " a batch dimension is needed."
            )
        batch = shape[0]
        if batch is not None and batch != batch_size:
            raise ValueError(
                f"Input {tensor.name!r} of model {model.name!r} has a fixed "
                f"batch dimension {batch}, but batch_size={batch_size}. "
                "Build the brick with the batch size being timed."
            )
        if any(d is None for d in shape[1:]):
            raise ValueError(
                f"Input {tensor.name!r} of model {model.name!r} has shape "
                f"{shape} with an unknown dimension: timing needs every "
                "size fixed (a model's open inputs take input_shapes, "
                "--input_shape=NAME:DIMS on the command line)."
            )
        specs.append(((batch_size, *shape[1:]), str(tensor.dtype)))
    return specs


def synthetic_inputs(
    model: keras.Model,
    batch_size: int = 1,
    *,
    seed: int = 0,
    input_shapes: Mapping[str, Sequence[int | None]] | None = None,
) -> list[np.ndarray]:
    """Returns one random array per flat model input, valid for the model.

    Integer inputs feeding an `Embedding` (or `CategoryEncoding`) get ids
    below its `input_dim`; other integer inputs get small non-negative ints;
    bool inputs get 0/1 masks; floats are standard normal.

    Args:
        model: A built Keras model.
        batch_size: Batch dimension where the model leaves it open.
        seed: Seed of the random generator; equal seeds give equal arrays.
        input_shapes: Sizes of open dimensions (see `input_specs`).

    Returns:
        Arrays in the order of `model.inputs`.

    Raises:
        ValueError: For unknown dimensions or an unsupported dtype.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    specs = input_specs(model, batch_size, input_shapes)
    for (shape, dtype), bound in zip(specs, id_bounds(model), strict=True):
        arrays.append(_random_array(rng, shape, dtype, bound, model.name))
    return arrays


def arrays_for_specs(
    specs: Sequence[tuple[Sequence[int], str]],
    bounds: Sequence[int | None] | None,
    batch_size: int,
    seed: int = 0,
) -> list[np.ndarray]:
    """Returns one random array per input spec, as `synthetic_inputs` would.

    The values follow the rules of `synthetic_inputs`: an integer input
    with a bound gets ids in [0, bound), one without gets small
    non-negative ints, bool inputs get 0/1 masks, floats are standard
    normal. A bound given for a non-integer input is ignored. For a model,
    `arrays_for_specs(specs, id_bounds(model), b, seed)` equals
    `synthetic_inputs(model, b, seed=seed)` when `specs` are its input
    shapes (without the batch dimension) and dtypes.

    Args:
        specs: (shape without the batch dimension, dtype name) per input.
        bounds: Exclusive upper bound of each input's ids, or None for an
            input without one; None for no bound at all.
        batch_size: The batch dimension prepended to every shape.
        seed: Seed of the random generator; equal seeds give equal arrays.

    Returns:
        Arrays of shape (batch_size, *shape), in the order of `specs`.

    Raises:
        ValueError: For a bound count other than the spec count, a bound
            below 1, a batch size below 1, an unknown dimension or an
            unsupported dtype.

    Example:
        >>> ids, x = arrays_for_specs(
        ...     [((5,), "int32"), ((3,), "float32")], [100, None], 2
        ... )
        >>> ids.shape, int(ids.max()) < 100
        ((2, 5), True)
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"batch_size must be a positive int. Received: {batch_size!r}"
        )
    bounds = [None] * len(specs) if bounds is None else list(bounds)
    if len(bounds) != len(specs):
        raise ValueError(
            f"Need one bound (or None) per input spec: {len(specs)} specs "
            f"but {len(bounds)} bounds. Received: bounds={bounds}"
        )
    rng = np.random.default_rng(seed)
    arrays = []
    for i, ((shape, dtype), bound) in enumerate(
        zip(specs, bounds, strict=True)
    ):
        shape = tuple(shape)
        if any(d is None or int(d) < 0 for d in shape):
            raise ValueError(
                f"Input {i} has shape {shape} with an unknown dimension; "
                "give every dimension but the batch one a size."
            )
        if bound is not None:
            if isinstance(bound, bool) or int(bound) != bound or bound < 1:
                raise ValueError(
                    f"The bound of input {i} must be a positive int or None."
                    f" Received: {bound!r}"
                )
            bound = int(bound)
        dtype = _dtype_name(dtype, i)
        if not _is_integer(dtype):
            bound = None
        full = (batch_size, *(int(d) for d in shape))
        arrays.append(_random_array(rng, full, dtype, bound, f"input_{i}"))
    return arrays


def _dtype_name(dtype: Any, index: int) -> str:
    """The canonical name of a supported input dtype ('float32', ...)."""
    if str(dtype) == "bfloat16":
        return "bfloat16"
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name is None or not (
        name == "bool" or _is_integer(name) or name.startswith("float")
    ):
        raise ValueError(
            f"Cannot make synthetic values of dtype {dtype!r} for input "
            f"{index}; supported: float*, bfloat16, int*, uint*, bool."
        )
    return name


# Normal draws per synthetic float input, at most (then repeated).
_BLOCK = 1 << 16


def _random_array(
    rng: np.random.Generator,
    shape: Sequence[int],
    dtype: str,
    bound: int | None,
    model_name: str,
) -> np.ndarray:
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if _is_integer(dtype):
        high = bound if bound is not None else SMALL_INT_HIGH
        high = min(high, int(np.iinfo(np.dtype(dtype)).max) + 1)
        return rng.integers(0, max(high, 1), size=shape).astype(dtype)
    if dtype.startswith(("float", "bfloat")):
        # Drawing millions of normal values took most of the time of
        # preparing a chain's inputs: a large input repeats a block of
        # draws (values, not their order, are what timing needs).
        size = math.prod(shape)
        block = rng.standard_normal(size=min(size, _BLOCK), dtype=np.float32)
        values = np.resize(block, size).reshape(shape)
        if dtype == "bfloat16":
            import ml_dtypes  # Shipped with TensorFlow and JAX.

            return values.astype(ml_dtypes.bfloat16)
        return values.astype(dtype, copy=False)
    raise ValueError(
        f"Cannot make synthetic inputs of dtype {dtype!r} for model "
        f"{model_name!r}; supported: float*, bfloat16, int*, uint*, bool."
    )
