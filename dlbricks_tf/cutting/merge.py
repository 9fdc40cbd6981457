"""Calls that repeat an earlier call on the same tensors, merged into it.

A model may compute one thing twice: NASNet's cells start several branches
with their own `Activation("relu")` of one tensor, and two of their pooling
layers read the same input with the same config. TensorFlow computes such
a thing once: grappler's arithmetic optimizer merges ops of the same type,
attributes and inputs (`DedupComputations`), and ONNX Runtime's basic
optimizations do the same (common subexpression elimination). A brick of
each call would be timed and counted as often as the model writes it, so
the estimate would count work the model never does (NASNetMobile: 80 of
its 770 calls, 60 of them ReLUs).

Only calls that compute a function of their inputs alone are merged: Keras
layers without weights and without randomness (`MERGEABLE`) and Keras ops
(`keras.src.ops`). A layer with weights reads its own variables, so two
of them never compute the same thing. Calls are equal when their class,
config (names aside) and call arguments are, and they read the same
tensors in the same order, after earlier merges: a call that repeats
another on tensors that were merged is merged too, as grappler's fixed
point does.
"""

from __future__ import annotations

import dataclasses

from dlbricks_tf.cutting import signature
from dlbricks_tf.cutting.graph import Call, Graph

# Keras layers that hold no weights and draw no random numbers.
MERGEABLE = frozenset({
    "Activation", "ReLU", "LeakyReLU", "ELU", "Softmax",
    "MaxPooling1D", "MaxPooling2D", "MaxPooling3D",
    "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
    "GlobalAveragePooling1D", "GlobalAveragePooling2D",
    "GlobalAveragePooling3D", "GlobalMaxPooling1D", "GlobalMaxPooling2D",
    "GlobalMaxPooling3D",
    "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D",
    "Cropping1D", "Cropping2D", "Cropping3D",
    "UpSampling1D", "UpSampling2D", "UpSampling3D",
    "Flatten", "Reshape", "Permute", "RepeatVector", "Identity",
    "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum",
    "Concatenate", "Dot", "Rescaling",
})  # fmt: skip
_KERAS_LAYERS = "keras.layers"
_KERAS_OPS = "keras.src.ops."


def mergeable(call: Call) -> bool:
    """Whether `call` computes a function of its inputs alone."""
    module = call.layer_config.get("module") or ""
    if module.startswith(_KERAS_OPS):
        return True
    return module == _KERAS_LAYERS and call.class_name in MERGEABLE


def merge_equal_calls(graph: Graph) -> Graph:
    """`graph` without the calls that repeat an earlier one.

    A merged call's readers (and the model's outputs) read the earlier
    call's outputs instead; its own tensors are then read by nothing.
    `Graph.merged` names each merged call and the call it repeats.

    Args:
        graph: The model's calls, in topological order.

    Returns:
        The graph of the calls TensorFlow runs, in the same order, or
        `graph` itself when no call repeats another.
    """
    alias: dict[int, int] = {}  # Tensor of a merged call -> the kept one's.
    first: dict[tuple, Call] = {}
    merged: list[tuple[str, str]] = []
    kept: list[Call] = []
    for call in graph.calls:
        inputs = tuple(alias.get(t, t) for t in call.inputs)
        if mergeable(call):
            key = (signature.call_key(call), inputs)
            earlier = first.get(key)
            # Only a tensor the earlier call's readers made real can stand in
            # for one of this call's (`Call.outputs` holds what is read).
            slots = (
                dict(zip(earlier.output_slots, earlier.outputs, strict=True))
                if earlier is not None
                else {}
            )
            if slots and all(s in slots for s in call.output_slots):
                for s, t in zip(call.output_slots, call.outputs, strict=True):
                    alias[t] = slots[s]
                merged.append((call.name, earlier.name))
                continue
            first.setdefault(key, call)
        # A node names its tensors by position in `inputs`: only they change.
        kept.append(dataclasses.replace(call, inputs=inputs))
    if not merged:
        return graph
    new_index = {c.index: i for i, c in enumerate(kept)}
    calls = tuple(
        dataclasses.replace(c, index=new_index[c.index]) for c in kept
    )
    # A merged call's tensors that nothing read are left without a producer.
    producers = tuple(
        new_index.get(p, -1) if p >= 0 else p for p in graph.producers
    )
    return dataclasses.replace(
        graph,
        calls=calls,
        producers=tuple(
            producers[alias[t]] if t in alias else p
            for t, p in enumerate(producers)
        ),
        outputs=tuple(alias.get(t, t) for t in graph.outputs),
        merged=graph.merged + tuple(merged),
    )
