"""A brick's description: what it computes, as JSON, without its model.

A latency model prices a brick from its features
(`dlbricks_tf.estimating.features`), which it reads from the brick's calls
(class, config, the tensors each reads and writes) and the specs of those
tensors. `describe` writes exactly that as JSON, so that a store can keep
it beside the brick's timing and a predictor can learn from the brick
with no source model at hand; `parse` reads it back as a `DescribedBrick`,
which `features.brick_features` takes as it takes a `Brick`.

A description holds what the brick's signature is a digest of, and
nothing else (`dlbricks_tf.cutting.signature`): each call's class, its
config stripped as the signature strips it (no name, initializer,
regularizer, constraint, `trainable` or seed), its non-tensor arguments,
and the shape and dtype of each tensor, numbered within the brick. No
model name, layer name or weight is written. `parse` recomputes the
signature from the description, so one that does not describe the brick
it is filed under is refused.

    {"format": "dlbricks-brick", "format_version": 1,
     "tensors": [[[8, 8, 3], "float32"], null, ...],
     "inputs": [0], "outputs": [2],
     "calls": [{"class_name": "Conv2D", "registered_name": null,
                "config": {...}, "node": {...}, "inputs": [0],
                "outputs": [1], "slots": [0]}, ...]}

This module imports no TensorFlow.

Example:
    text = brick.describe()
    described = parse(text, brick.signature)
    features.brick_features(described, described.specs)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from dlbricks_tf import errors, json_files, limits
from dlbricks_tf.cutting import signature as signature_lib
from dlbricks_tf.cutting.graph import Call, TensorSpec

FORMAT = "dlbricks-brick"
FORMAT_VERSION = 1


class DescriptionError(errors.Error):
    """A brick description is malformed, over a limit, or of another brick."""


_HEADER = json_files.Header(
    FORMAT,
    FORMAT_VERSION,
    DescriptionError,
    kind="description",
    instead="it was not written by dlbricks_tf",
    again="time the brick again with `dlbricks bench`.",
)


@dataclasses.dataclass(frozen=True)
class DescribedBrick:
    """A brick read back from its description (no layers: nothing to run).

    It has the attributes of a `Brick` that `features.brick_features`
    reads; tensor ids are the description's own.

    Attributes:
        signature: The brick's signature, recomputed from the description.
        inputs: Specs of the tensors it reads.
        outputs: Specs of the tensors it exposes (None where unrecorded).
        input_ids: Ids of the tensors it reads, in `inputs` order.
        output_ids: Ids of the tensors it exposes, in `outputs` order.
        calls: Its calls, in order (names empty).
        specs: The spec of each tensor id.
    """

    signature: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec | None, ...]
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    calls: tuple[Call, ...]
    specs: tuple[TensorSpec | None, ...]


def describe(brick: Any, specs: Sequence[TensorSpec | None]) -> str:
    """A brick's description as canonical JSON.

    Args:
        brick: A `Brick` (its `calls`, `input_ids`, `output_ids`).
        specs: The spec of every tensor id of the brick's graph.

    Returns:
        The description (see the module docstring).
    """
    local: dict[int, int] = {}

    def number(t: int) -> int:
        return local.setdefault(t, len(local))

    for t in brick.input_ids:
        number(t)
    calls = []
    for c in brick.calls:
        key = json.loads(signature_lib.call_key(c))
        calls.append(
            {
                "class_name": key[0],
                "registered_name": key[1],
                "config": key[2],
                "node": key[3],
                "inputs": [number(t) for t in c.inputs],
                "outputs": [number(t) for t in c.outputs],
                "slots": list(c.output_slots),
            }
        )
    tensors: list[Any] = [None] * len(local)
    for t, i in local.items():
        spec = specs[t] if t < len(specs) else None
        if spec is not None:
            tensors[i] = [list(spec.shape), spec.dtype]
    data = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "tensors": tensors,
        "inputs": [local[t] for t in brick.input_ids],
        "outputs": [number(t) for t in brick.output_ids],
        "calls": calls,
    }
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


def parse(text: str | bytes, signature: str | None = None) -> DescribedBrick:
    """Reads a description back, within the limits on files read.

    Args:
        text: The description (`describe`).
        signature: The signature it is filed under; None to skip the check.

    Returns:
        The brick it describes.

    Raises:
        DescriptionError: Over a limit (size, JSON depth, calls as layers),
            not JSON, not a description of this format, malformed, or of
            another brick than `signature` (one line).
    """
    what = f"Description of brick {signature}" if signature else "Description"
    data = _HEADER.parse(text, what, what)
    try:
        described = _read(data)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        reason = " ".join(str(e).split())[:200]
        raise DescriptionError(
            f"{what} is malformed ({type(e).__name__}: {reason})."
        ) from e
    limits.check_count("layers", len(described.calls), what, DescriptionError)
    if signature is not None and described.signature != signature:
        raise DescriptionError(
            f"{what} describes brick {described.signature} instead."
        )
    return described


def _spec(value: Any) -> TensorSpec | None:
    if value is None:
        return None
    shape, dtype = value
    if not isinstance(dtype, str) or not isinstance(shape, list):
        raise TypeError(f"a tensor is [shape, dtype], not {value!r}")
    for d in shape:
        if d is not None and (type(d) is not int or d < 0):
            raise ValueError(f"a dimension is an int or null, not {d!r}")
    return TensorSpec(tuple(shape), dtype)


def _ids(value: Any, count: int) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        type(t) is int and 0 <= t < count for t in value
    ):
        raise ValueError(f"tensor ids must be in [0, {count}): {value!r}")
    return tuple(value)


def _node(value: Any, i: int) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"call {i}'s node is not an object")
    return value


def _read(data: dict[str, Any]) -> DescribedBrick:
    """The brick of a parsed description (the caller names the errors)."""
    raw = data["tensors"]
    if not isinstance(raw, list):
        raise TypeError("tensors must be a list")
    specs = tuple(_spec(v) for v in raw)
    inputs = _ids(data["inputs"], len(specs))
    outputs = _ids(data["outputs"], len(specs))
    if not isinstance(data["calls"], list) or not data["calls"]:
        raise ValueError("a brick has one call or more")
    calls = []
    for i, c in enumerate(data["calls"]):
        if not isinstance(c, dict) or not isinstance(c["class_name"], str):
            raise TypeError(f"call {i} is not an object with a class_name")
        if not isinstance(c["config"], dict):
            raise TypeError(f"call {i}'s config is not an object")
        registered = c["registered_name"]
        outs = _ids(c["outputs"], len(specs))
        slots = _ids(c["slots"], 1 << 30)
        if len(slots) != len(outs):
            raise ValueError(f"call {i} has {len(outs)} outputs and slots")
        calls.append(
            Call(
                index=i,
                name="",
                class_name=c["class_name"],
                inputs=_ids(c["inputs"], len(specs)),
                outputs=outs,
                output_slots=slots,
                layer_config={
                    "class_name": c["class_name"],
                    "config": c["config"],
                    "registered_name": registered or c["class_name"],
                },
                node=_node(c["node"], i),
            )
        )
    input_specs = tuple(specs[t] for t in inputs)
    if any(s is None for s in input_specs):
        raise ValueError("every input of a brick has a spec")
    keys = [signature_lib.call_key(c) for c in calls]
    return DescribedBrick(
        signature=signature_lib.brick_signature(
            calls, keys, inputs, input_specs, outputs
        ),
        inputs=input_specs,
        outputs=tuple(specs[t] for t in outputs),
        input_ids=inputs,
        output_ids=outputs,
        calls=tuple(calls),
        specs=specs,
    )
