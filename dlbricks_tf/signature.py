"""Signatures: stable digests that say when two bricks are the same.

Two bricks are the same iff they compute the same thing at the same cost:
same internal topology, same class and performance-relevant config for each
call, same input specs. Left out: names, weights, initializers,
regularizers, constraints, `trainable` and seeds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from dlbricks_tf.graph import Call, TensorSpec, map_tensor_refs

_DROPPED_KEYS = frozenset({"name", "trainable", "seed"})
_DROPPED_SUFFIXES = ("_initializer", "_regularizer", "_constraint")
_LENGTH = 16  # Hex digits: 64 bits, plenty for a corpus of bricks.


def strip_config(value: Any) -> Any:
    """The performance-relevant part of a serialized layer config."""
    if isinstance(value, dict):
        if value.get("class_name") in ("DTypePolicy", "FloatDTypePolicy"):
            return (value.get("config") or {}).get("name")
        return {
            k: strip_config(v)
            for k, v in value.items()
            if k not in _DROPPED_KEYS and not k.endswith(_DROPPED_SUFFIXES)
        }
    if isinstance(value, list | tuple):
        return [strip_config(v) for v in value]
    return value


def call_key(call: Call) -> str:
    """Canonical text of one call: its class, config and non-tensor args.

    Tensors in the arguments become their position in `call.inputs`; where
    they come from is added per brick by `brick_signature`.
    """
    entry = call.layer_config
    registered = entry.get("registered_name")
    node = map_tensor_refs(call.node, lambda i: {"tensor": i})
    return json.dumps(
        [
            call.class_name,
            registered if registered != call.class_name else None,
            strip_config(entry.get("config") or {}),
            node,
        ],
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )


def brick_signature(
    calls: Sequence[Call],
    keys: Sequence[str],
    inputs: Sequence[int],
    input_specs: Sequence[TensorSpec],
    outputs: Sequence[int],
) -> str:
    """The signature of the brick made of `calls`.

    Args:
        calls: the brick's calls, in order.
        keys: `call_key` of each call.
        inputs: tensor ids the brick reads from outside, in order.
        input_specs: their specs.
        outputs: tensor ids the brick exposes, in order.

    Returns:
        A hex digest, equal for bricks that are the same modulo names and
        weights.
    """
    local: dict[int, Any] = {t: ["in", k] for k, t in enumerate(inputs)}
    parts: list[Any] = [
        [[list(s.shape), s.dtype] for s in input_specs],
    ]
    for j, (c, key) in enumerate(zip(calls, keys, strict=True)):
        parts.append([key, [local[t] for t in c.inputs]])
        for slot, t in zip(c.output_slots, c.outputs, strict=True):
            local[t] = [j, slot]
    parts.append([local[t] for t in outputs])
    text = json.dumps(parts, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:_LENGTH]
