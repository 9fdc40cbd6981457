"""Walks a Keras model config into a DAG of layer calls.

This is the one module that reads the Keras model-config format
(`model.get_config()`, a `.keras` archive's `config.json`, the
`model_config` of an `.h5` file). Everything downstream works on the small,
typed `Graph` it returns.

Keras 3 facts this walk relies on:

* A Functional config lists `layers`, each with its `inbound_nodes` (one per
  call of that layer inside this model). A call's arguments are serialized
  with every tensor as `{"class_name": "__keras_tensor__", "config":
  {"shape", "dtype", "keras_history": [layer, node_index, tensor_index]}}`.
* A nested Functional model starts with a built-in node of its own. Call
  arguments skip it (`node_index` k is the model's k-th call in this
  graph), but `output_layers` count it (k + 1).
* A Sequential config has no inbound nodes: its layers form a chain, and the
  shapes between them are not recorded (they are inferred later, see
  `replay.infer_missing_specs`).
* Raw `keras.ops` operations (`x[:, :4]`, `ops.concatenate`) are entries of
  `layers` like any layer.
* Structures of tensors (dict inputs and outputs) flatten with dict keys in
  sorted order, as `keras.tree` does.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterator
from typing import Any

from dlbricks_tf.errors import DecompositionError

_KERAS_TENSOR = "__keras_tensor__"
_SEQUENTIAL = "Sequential"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """Shape (without the batch dimension) and dtype of a tensor."""

    shape: tuple[int | None, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of a Keras operation inside a model.

    Attributes:
        index: position of the call in the graph's topological order.
        name: qualified name of the layer: `outer/inner` inside nested models.
            A layer called twice gives two calls of the same name.
        class_name: the operation's class, e.g. `Conv2D` or `GetItem`.
        inputs: ids of the tensors the call reads, in the order they appear in
            its serialized arguments (see `iter_tensor_refs`).
        outputs: ids of the tensors the call produces that anything reads.
        output_slots: for each of `outputs`, its index in the call's
            flattened outputs.
        layer_config: the serialized layer (`module`, `class_name`, `config`,
            `registered_name`), as Keras wrote it.
        node: the serialized call arguments, `{"args": ..., "kwargs": ...}`.
    """

    index: int
    name: str
    class_name: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    output_slots: tuple[int, ...]
    layer_config: dict = dataclasses.field(compare=False, repr=False)
    node: dict = dataclasses.field(compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class Graph:
    """A model as a DAG of calls over tensors, in topological order.

    Attributes:
        name: the model's name.
        calls: every layer call, nested models flattened, topologically sorted.
        specs: for each tensor id, its recorded spec, or None where the config
            does not record it.
        producers: for each tensor id, the index of the call producing it, or
            -1 for a model input.
        inputs: tensor ids of the model inputs, flattened.
        outputs: tensor ids of the model outputs, flattened.
        input_names: the name of each of `inputs` (its InputLayer's).
        merged: (call, the earlier call it repeats) for each call left out
            because it computes what an earlier one does
            (`dlbricks_tf.cutting.merge`).
    """

    name: str
    calls: tuple[Call, ...]
    specs: tuple[TensorSpec | None, ...]
    producers: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    input_names: tuple[str, ...] = ()
    merged: tuple[tuple[str, str], ...] = ()


def iter_tensor_refs(obj: Any) -> Iterator[dict]:
    """Yields the config of each serialized tensor in `obj`, in walk order.

    The order (dicts in insertion order, lists and tuples in order; a config
    from memory holds tuples where a file holds lists) is the contract
    between this module and `replay`: the i-th tensor yielded here is
    `Call.inputs[i]`.
    """
    if isinstance(obj, dict):
        if obj.get("class_name") == _KERAS_TENSOR:
            yield obj["config"]
            return
        for value in obj.values():
            yield from iter_tensor_refs(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from iter_tensor_refs(value)


def map_tensor_refs(obj: Any, fn: Callable[[int], Any]) -> Any:
    """Returns a copy of `obj` with the i-th serialized tensor set to fn(i).

    Walks in the same order as `iter_tensor_refs`.
    """
    counter = iter(range(1 << 62))

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if x.get("class_name") == _KERAS_TENSOR:
                return fn(next(counter))
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [walk(v) for v in x]
        return x

    return walk(obj)


def model_class_name(entry: dict) -> str:
    """The class name of a serialized model or layer entry."""
    return entry.get("class_name", "")


def is_model_entry(entry: dict) -> bool:
    """Whether a serialized layer entry is itself a Functional or Sequential."""
    config = entry.get("config")
    return isinstance(config, dict) and isinstance(config.get("layers"), list)


def walk(model_entry: dict) -> Graph:
    """Walks a serialized model into a `Graph`.

    Args:
        model_entry: `{"class_name": ..., "config": {...}}` as Keras serializes
            a model (`keras.saving.serialize_keras_object(model)`, the
            `config.json` of a `.keras` archive, `model.to_json()`).

    Returns:
        The model's calls in topological order, nested models flattened.

    Raises:
        DecompositionError: the entry is not a Functional or Sequential config
            (a subclassed model), or its graph is inconsistent.
    """
    if not isinstance(model_entry, dict):
        raise DecompositionError(
            f"A model config must be a JSON object, not "
            f"{type(model_entry).__name__}."
        )
    config = model_entry.get("config")
    name = config.get("name", "model") if isinstance(config, dict) else "model"
    if not is_model_entry(model_entry):
        raise DecompositionError(
            f"Model '{name}' (class {model_class_name(model_entry)!r}) has no "
            "layer graph in its config: it is a subclassed keras.Model. "
            "Rebuild it with the Functional API or keras.Sequential."
        )
    walker = _Walker()
    try:
        outputs = walker.model(model_entry, prefix="", bound=None)
        return walker.freeze(name, outputs)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
        # A config from a file may be malformed in any field; the walk
        # reads it as Keras writes it, so say so in one line.
        text = " ".join(str(e).split())[:200]
        raise DecompositionError(
            f"Model '{name}' has a malformed config ({type(e).__name__}: "
            f"{text}); save the model again with Keras."
        ) from e


def _tensor_spec(tensor_config: dict) -> TensorSpec | None:
    shape = tensor_config.get("shape")
    dtype = tensor_config.get("dtype")
    if shape is None or dtype is None:
        return None
    return TensorSpec(tuple(shape[1:]), str(dtype))


def _is_leaf(x: Any) -> bool:
    return (
        isinstance(x, list | tuple)
        and len(x) == 3
        and isinstance(x[0], str)
        and isinstance(x[1], int)
    )


def _flatten_leaves(structure: Any) -> list[Any]:
    """Flattens input/output_layers the way keras.tree does (sorted keys)."""
    if _is_leaf(structure):
        return [structure]
    if isinstance(structure, dict):
        return [
            leaf
            for key in sorted(structure)
            for leaf in _flatten_leaves(structure[key])
        ]
    if isinstance(structure, list | tuple):
        return [leaf for item in structure for leaf in _flatten_leaves(item)]
    return []


def _flatten_tensors(structure: Any) -> list[dict]:
    """Flattens serialized call arguments in keras.tree order (sorted keys)."""
    if isinstance(structure, dict):
        if structure.get("class_name") == _KERAS_TENSOR:
            return [structure["config"]]
        return [
            t
            for key in sorted(structure)
            for t in _flatten_tensors(structure[key])
        ]
    if isinstance(structure, list | tuple):
        return [t for item in structure for t in _flatten_tensors(item)]
    return []


def _legacy_node(node: list) -> dict:
    """Converts a Keras 2 `[[name, node, tensor, kwargs], ...]` node."""
    tensors = []
    kwargs: dict = {}
    for ref in node:
        tensors.append(
            {
                "class_name": _KERAS_TENSOR,
                "config": {
                    "shape": None,
                    "dtype": None,
                    "keras_history": [ref[0], ref[1], ref[2]],
                },
            }
        )
        if len(ref) > 3 and isinstance(ref[3], dict):
            kwargs = ref[3]
    args = tensors[0] if len(tensors) == 1 else tensors
    return {"args": [args], "kwargs": kwargs}


def _input_spec(entry: dict, model_name: str) -> TensorSpec:
    config = entry.get("config") or {}
    shape = config.get("batch_shape") or config.get("batch_input_shape")
    if shape is None:
        raise DecompositionError(
            f"Input '{_entry_name(entry)}' of model '{model_name}' has no "
            "shape in the config; give the model a keras.Input with a shape."
        )
    dtype = config.get("dtype") or "float32"
    if isinstance(dtype, dict):
        dtype = (dtype.get("config") or {}).get("name", "float32")
    return TensorSpec(tuple(shape[1:]), str(dtype))


def _is_functional(entry: dict) -> bool:
    return is_model_entry(entry) and "input_layers" in entry["config"]


def _entry_name(entry: dict) -> str:
    name = entry.get("name")
    if name is None:
        name = (entry.get("config") or {}).get("name")
    if not name:
        raise DecompositionError(
            f"A layer of class {model_class_name(entry)!r} has no name in the "
            "model config; the config is malformed. Re-save the model."
        )
    return name


class _PendingCall:
    __slots__ = ("name", "entry", "node", "inputs", "slots")

    def __init__(self, name: str, entry: dict, node: dict, inputs: list[int]):
        self.name = name
        self.entry = entry
        self.node = node
        self.inputs = inputs
        self.slots: dict[int, int] = {}  # output slot -> tensor id


class _Produced:
    """The outputs of one call (or one nested-model call) in a scope."""

    __slots__ = ("walker", "call", "fixed")

    def __init__(self, walker: _Walker, call: int, fixed: list[int] | None):
        self.walker = walker
        self.call = call
        self.fixed = fixed

    def tensor(self, slot: int, where: str) -> int:
        if self.fixed is not None:
            if not 0 <= slot < len(self.fixed):
                raise DecompositionError(
                    f"Layer '{where}' reads output {slot} of a call that has "
                    f"{len(self.fixed)}; the model config is inconsistent."
                )
            return self.fixed[slot]
        pending = self.walker.calls[self.call]
        if slot not in pending.slots:
            pending.slots[slot] = self.walker.new_tensor(self.call)
        return pending.slots[slot]


class _Walker:
    """Mutable state of one walk; `freeze` turns it into a `Graph`."""

    def __init__(self) -> None:
        self.calls: list[_PendingCall] = []
        self.specs: list[TensorSpec | None] = []
        self.producers: list[int] = []
        self.inputs: list[int] = []
        self.input_names: list[str] = []

    def new_tensor(self, producer: int, spec: TensorSpec | None = None) -> int:
        self.specs.append(spec)
        self.producers.append(producer)
        return len(self.specs) - 1

    def note_spec(self, tensor: int, tensor_config: dict) -> None:
        if self.specs[tensor] is None:
            self.specs[tensor] = _tensor_spec(tensor_config)

    def add_call(self, name: str, entry: dict, node: dict, inputs: list[int]):
        self.calls.append(_PendingCall(name, entry, node, inputs))
        return len(self.calls) - 1

    def model(
        self, entry: dict, prefix: str, bound: list[int] | None
    ) -> list[int]:
        """Walks a model entry; returns its flattened output tensor ids."""
        config = entry["config"]
        if model_class_name(entry) == _SEQUENTIAL or (
            "input_layers" not in config
        ):
            return self.sequential(config, prefix, bound)
        return self.functional(config, prefix, bound)

    def input_tensor(self, entry: dict, model_name: str) -> int:
        tensor = self.new_tensor(-1, _input_spec(entry, model_name))
        self.inputs.append(tensor)
        self.input_names.append(_entry_name(entry))
        return tensor

    def bind(self, tensor: int, entry: dict, model_name: str, prefix: str):
        """The tensor a nested model's input layer `entry` gives its calls.

        A nested model converts what it is called with to the dtype of its
        keras.Input (`Functional._standardize_inputs`). Where that changes
        the recorded dtype, the conversion becomes a call of its own, a Cast
        named `outer/input_name/cast`: the calls inside (a raw keras.ops
        call does not autocast) read its output, as they do in the model.
        Where the outer dtype is not recorded (a nested model inside a
        Sequential), the calls inside read the outer tensor.
        """
        outer = self.specs[tensor]
        inner = _input_spec(entry, model_name)
        if outer is None or outer.dtype == inner.dtype:
            return tensor
        name = f"{prefix}{_entry_name(entry)}/cast"
        cast = {
            "module": "keras.src.ops.core",
            "class_name": "Cast",
            "config": {"name": "cast", "dtype": inner.dtype},
            "registered_name": "Cast",
        }
        node = {
            "args": [
                {
                    "class_name": _KERAS_TENSOR,
                    "config": {
                        "shape": [None, *outer.shape],
                        "dtype": outer.dtype,
                        "keras_history": ["", 0, 0],
                    },
                }
            ],
            "kwargs": {},
        }
        call = self.add_call(name, cast, node, [tensor])
        converted = _Produced(self, call, None).tensor(0, name)
        self.specs[converted] = TensorSpec(outer.shape, inner.dtype)
        return converted

    def sequential(
        self, config: dict, prefix: str, bound: list[int] | None
    ) -> list[int]:
        layers = list(config.get("layers") or [])
        name = config.get("name", "sequential")
        if layers and model_class_name(layers[0]) == "InputLayer":
            first = layers.pop(0)
            if bound is None:
                current = self.input_tensor(first, name)
            else:
                current = self.bind(bound[0], first, name, prefix)
                if self.specs[current] is None:
                    self.specs[current] = _input_spec(first, name)
        elif bound is not None:
            current = bound[0]
        else:
            shape = config.get("build_input_shape")
            if shape is None:
                raise DecompositionError(
                    f"Sequential model '{name}' is not built, so its input "
                    "shape is unknown. Start it with keras.Input(shape) or "
                    "call model.build(input_shape) first."
                )
            current = self.new_tensor(
                -1, TensorSpec(tuple(shape[1:]), "float32")
            )
            self.inputs.append(current)
            self.input_names.append(f"{name}_input")
        for entry in layers:
            layer_name = prefix + _entry_name(entry)
            if is_model_entry(entry):
                current = self.model(entry, layer_name + "/", [current])[0]
                continue
            node = {
                "args": [
                    {
                        "class_name": _KERAS_TENSOR,
                        "config": {
                            "shape": None,
                            "dtype": None,
                            "keras_history": ["", 0, 0],
                        },
                    }
                ],
                "kwargs": {},
            }
            call = self.add_call(layer_name, entry, node, [current])
            current = _Produced(self, call, None).tensor(0, layer_name)
        return [current]

    def functional(
        self, config: dict, prefix: str, bound: list[int] | None
    ) -> list[int]:
        model_name = config.get("name", "model")
        entries = config["layers"]
        by_name = {_entry_name(e): e for e in entries}
        scope: dict[tuple[str, int], _Produced] = {}

        input_leaves = _flatten_leaves(config.get("input_layers", []))
        if bound is not None and len(bound) != len(input_leaves):
            raise DecompositionError(
                f"Nested model '{prefix[:-1]}' is called with {len(bound)} "
                f"tensors but has {len(input_leaves)} inputs."
            )
        for i, leaf in enumerate(input_leaves):
            entry = by_name.get(leaf[0])
            if entry is None:
                raise DecompositionError(
                    f"Model '{model_name}' names input '{leaf[0]}' that is not "
                    "among its layers; the config is malformed."
                )
            if bound is None:
                tensor = self.input_tensor(entry, model_name)
            else:
                tensor = self.bind(bound[i], entry, model_name, prefix)
            scope[(leaf[0], leaf[1])] = _Produced(self, -1, [tensor])

        # Kahn's algorithm. Ready nodes wait in a heap keyed by (position of
        # the layer, node index), so the order follows the config's own
        # (Keras lists operations in the order of their first call) where
        # nothing better applies; a shared layer's later calls may read
        # tensors produced further down the config, so they wait for them.
        waiting: dict[tuple[str, int], list[tuple[int, int]]] = {}
        missing: dict[tuple[int, int], int] = {}
        ready: list[tuple[int, int]] = []
        nodes: dict[tuple[int, int], tuple[dict, dict]] = {}
        for position, entry in enumerate(entries):
            if model_class_name(entry) == "InputLayer":
                continue
            for k, node in enumerate(entry.get("inbound_nodes") or []):
                if isinstance(node, list):
                    node = _legacy_node(node)
                key = (position, k)
                nodes[key] = (entry, node)
                deps = {
                    (ref["keras_history"][0], ref["keras_history"][1])
                    for ref in iter_tensor_refs(node)
                }
                deps = {d for d in deps if d not in scope}
                missing[key] = len(deps)
                for dep in deps:
                    waiting.setdefault(dep, []).append(key)
                if not deps:
                    heapq.heappush(ready, key)

        follow: tuple[int, int] | None = None
        while ready or follow is not None:
            if follow is not None:
                key, follow = follow, None
            else:
                key = heapq.heappop(ready)
            entry, node = nodes.pop(key)
            layer_name = _entry_name(entry)
            qualified = prefix + layer_name
            inputs = []
            for ref in iter_tensor_refs(node):
                history = ref["keras_history"]
                tensor = scope[(history[0], history[1])].tensor(
                    history[2], qualified
                )
                self.note_spec(tensor, ref)
                inputs.append(tensor)
            if is_model_entry(entry):
                args = node.get("args") or []
                flat = _flatten_tensors(args[0] if args else [])
                bound_inner = []
                for ref in flat:
                    history = ref["keras_history"]
                    bound_inner.append(
                        scope[(history[0], history[1])].tensor(
                            history[2], qualified
                        )
                    )
                outs = self.model(entry, qualified + "/", bound_inner)
                produced = _Produced(self, -1, outs)
            else:
                call = self.add_call(qualified, entry, node, inputs)
                produced = _Produced(self, call, None)
            done = (layer_name, key[1])
            scope[done] = produced
            unblocked = []
            for waiter in waiting.pop(done, ()):
                missing[waiter] -= 1
                if missing[waiter] == 0:
                    unblocked.append(waiter)
            # Follow the chain: a call the one just walked has unblocked
            # comes next, so chains stay consecutive in the order and runs
            # of G calls along them can become bricks.
            if unblocked:
                unblocked.sort()
                follow = unblocked[0]
                for waiter in unblocked[1:]:
                    heapq.heappush(ready, waiter)

        if nodes:
            position, _ = min(nodes)
            raise DecompositionError(
                f"Layer '{prefix}{_entry_name(entries[position])}' of model "
                f"'{model_name}' reads a tensor no layer produces (or the "
                "graph has a loop); the model config is malformed."
            )
        outputs = []
        for leaf in _flatten_leaves(config.get("output_layers", [])):
            node_index = leaf[1]
            entry = by_name.get(leaf[0])
            if entry is not None and _is_functional(entry):
                # Unlike call arguments, output_layers count the built-in
                # node a Functional model starts with.
                node_index -= 1
            produced = scope.get((leaf[0], node_index))
            if produced is None:
                raise DecompositionError(
                    f"Model '{model_name}' names output '{leaf[0]}' that no "
                    "layer call produces; the config is malformed."
                )
            outputs.append(produced.tensor(leaf[2], model_name))
        return outputs

    def freeze(self, name: str, outputs: list[int]) -> Graph:
        calls = []
        for index, pending in enumerate(self.calls):
            slots = sorted(pending.slots)
            calls.append(
                Call(
                    index=index,
                    name=pending.name,
                    class_name=model_class_name(pending.entry),
                    inputs=tuple(pending.inputs),
                    outputs=tuple(pending.slots[s] for s in slots),
                    output_slots=tuple(slots),
                    layer_config=pending.entry,
                    node=pending.node,
                )
            )
        return Graph(
            name=name,
            calls=tuple(calls),
            specs=tuple(self.specs),
            producers=tuple(self.producers),
            inputs=tuple(self.inputs),
            outputs=tuple(outputs),
            input_names=tuple(self.input_names),
        )
