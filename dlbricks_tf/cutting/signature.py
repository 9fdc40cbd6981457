"""Signatures: stable digests that say when two bricks are the same.

Two bricks are the same iff they compute the same thing at the same cost:
same internal topology, same class and performance-relevant config for each
call, same input specs. Left out: names, weights, initializers,
regularizers, constraints, `trainable` and seeds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence
from typing import Any

from dlbricks_tf.cutting.graph import Call, TensorSpec, map_tensor_refs

_DROPPED_KEYS = frozenset({"name", "trainable", "seed"})
_DROPPED_SUFFIXES = ("_initializer", "_regularizer", "_constraint")
_LENGTH = 16  # Hex digits: 64 bits, plenty for a corpus of bricks.
# Call arguments Keras fills in by itself when it builds a Functional model
# (the input's mask, None; the call's default `training`, None or False) and
# records in the config, but never records for the layers of a Sequential.
# They change nothing at inference, where bricks run; kept, one layer call
# would have two signatures, inside a Sequential and outside.
_FILLED_KWARGS = {"mask": (None,), "training": (None, False)}


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
    node = map_tensor_refs(_without_filled(call.node), lambda i: {"tensor": i})
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


def _without_filled(node: dict) -> dict:
    """`node` without the call arguments Keras fills in (see above)."""
    kwargs = node.get("kwargs")
    if not isinstance(kwargs, dict):
        return node
    kept = {
        k: v
        for k, v in kwargs.items()
        if not any(v is filled for filled in _FILLED_KWARGS.get(k, ()))
    }
    return {**node, "kwargs": kept}


def canonical_order(
    calls: Sequence[Call],
    keys: Sequence[str],
    specs: Sequence[TensorSpec | None],
    exposed: Collection[int] = (),
) -> list[int]:
    """An order of a brick's calls that depends on the brick's DAG only.

    A run of calls comes in the order the graph walk met them, which depends
    on the model around them: a nested model's calls are walked together,
    and a brick's branches may come either way round. The same sub-network
    in two models, or a built brick decomposed again, would then list its
    calls in two orders and get two signatures. This order is Kahn's
    algorithm taking, of the calls ready, the first by (key, where each of
    its inputs comes from, what reads its outputs downstream). A chain has
    one order only and keeps it. The first call is one that reads every
    input of the brick, as `split.buildable` asks of a run.

    Args:
        calls: the brick's calls, in a topological order.
        keys: `call_key` of each call.
        specs: the spec of each tensor id of the graph (None: unknown).
        exposed: the tensor ids the brick outputs.

    Returns:
        Indices into `calls`, in the canonical order.
    """
    producer = {t: j for j, c in enumerate(calls) for t in c.outputs}
    slot_of = {
        t: slot
        for c in calls
        for slot, t in zip(c.output_slots, c.outputs, strict=True)
    }
    # What each call's outputs feed, as a digest: the tie-break between
    # calls of one key reading the same tensors.
    reads: list[list] = [[] for _ in calls]
    downstream = [""] * len(calls)
    for j in reversed(range(len(calls))):
        c = calls[j]
        feeds = sorted(
            reads[j] + [["out", slot_of[t]] for t in c.outputs if t in exposed]
        )
        text = json.dumps([keys[j], feeds], separators=(",", ":"))
        downstream[j] = hashlib.sha256(text.encode()).hexdigest()
        for k, t in enumerate(c.inputs):
            if t in producer:
                reads[producer[t]].append([downstream[j], k, slot_of[t]])

    outside = {t for c in calls for t in c.inputs if t not in producer}
    local: dict[int, Any] = {}
    order: list[int] = []
    left = list(range(len(calls)))
    read = 0
    while left:
        ready = [
            j
            for j in left
            if all(t in local or t not in producer for t in calls[j].inputs)
        ]
        if not order:
            ready = [
                j for j in ready if outside <= set(calls[j].inputs)
            ] or ready
        best: tuple[str, int] | None = None
        for j in ready:
            refs = [local.get(t) or _unread(specs[t]) for t in calls[j].inputs]
            text = json.dumps([keys[j], refs, downstream[j]])
            if best is None or text < best[0]:
                best = (text, j)
        assert best is not None, "calls must be in a topological order"
        j = best[1]
        left.remove(j)
        for t in calls[j].inputs:
            if t not in local:
                local[t] = ["in", read]
                read += 1
        for t in calls[j].outputs:
            local[t] = [len(order), slot_of[t]]
        order.append(j)
    return order


def _unread(spec: TensorSpec | None) -> list:
    """Where an input no call has read yet comes from: its spec only."""
    return ["new"] if spec is None else ["new", list(spec.shape), spec.dtype]


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
