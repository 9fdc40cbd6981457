"""Synthetic inputs for a built Keras model, valid in dtype and range.

A brick or model is timed on random data, but the data must be data the
model accepts: integer ids fed to an `Embedding` stay below its
`input_dim` (an out-of-range id fails on CPU), masks are 0/1, floats are
standard normal. The id bound of each integer input is found by following
the model's graph from the input through integer-valued tensors to the
layers that consume them as indices (also inside nested models).

Example:
    xs = synthetic_inputs(model, batch_size=1, seed=0)
    model(xs if len(xs) > 1 else xs[0])
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
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


def input_specs(
    model: keras.Model, batch_size: int
) -> list[tuple[tuple[int, ...], str]]:
    """Returns (shape with batch dimension, dtype) per flat model input.

    Args:
        model: A built Keras model.
        batch_size: Batch dimension to use where the model leaves it open.

    Returns:
        Concrete shapes and Keras dtype names.

    Raises:
        ValueError: If an input has an unknown non-batch dimension, or a
            fixed batch dimension other than `batch_size`.
    """
    specs = []
    for tensor in model.inputs:
        shape = tuple(tensor.shape)
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
                f"{shape} with an unknown dimension; give the model fixed "
                "input shapes to time it."
            )
        specs.append(((batch_size, *shape[1:]), str(tensor.dtype)))
    return specs


def synthetic_inputs(
    model: keras.Model, batch_size: int = 1, *, seed: int = 0
) -> list[np.ndarray]:
    """Returns one random array per flat model input, valid for the model.

    Integer inputs feeding an `Embedding` (or `CategoryEncoding`) get ids
    below its `input_dim`; other integer inputs get small non-negative ints;
    bool inputs get 0/1 masks; floats are standard normal.

    Args:
        model: A built Keras model.
        batch_size: Batch dimension where the model leaves it open.
        seed: Seed of the random generator; equal seeds give equal arrays.

    Returns:
        Arrays in the order of `model.inputs`.

    Raises:
        ValueError: For unknown dimensions or an unsupported dtype.
    """
    rng = np.random.default_rng(seed)
    arrays = []
    specs = input_specs(model, batch_size)
    for (shape, dtype), bound in zip(specs, id_bounds(model), strict=True):
        arrays.append(_random_array(rng, shape, dtype, bound, model.name))
    return arrays


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
        values = rng.standard_normal(size=shape).astype(np.float32)
        if dtype == "bfloat16":
            import ml_dtypes  # Shipped with TensorFlow and JAX.

            return values.astype(ml_dtypes.bfloat16)
        return values.astype(dtype)
    raise ValueError(
        f"Cannot make synthetic inputs of dtype {dtype!r} for model "
        f"{model_name!r}; supported: float*, bfloat16, int*, uint*, bool."
    )
