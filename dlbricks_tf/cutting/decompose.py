"""`decompose`: a model in, its bricks and their DAG out."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dlbricks_tf.cutting import graph as graph_lib
from dlbricks_tf.cutting import loading, merge, replay, signature, split
from dlbricks_tf.cutting.brick import Brick
from dlbricks_tf.errors import DecompositionError


@dataclasses.dataclass(frozen=True)
class Decomposition:
    """A model cut into bricks.

    Attributes:
        name: the model's name.
        granularity: G, the most calls a brick holds.
        bricks: the bricks in topological order; every call the model
            runs is in exactly one.
        dependencies: for brick i, the indices (< i) of the bricks it reads.
        inputs: ids of the model's input tensors (flattened, keras.tree
            order), the ids that `Brick.input_ids` refer to.
        outputs: ids of the model's output tensors (flattened).
        num_calls: how many layer calls the model runs (merged calls not
            counted).
        fuse: whether fusion units were kept whole (G counts units).
        merged: (call, the earlier call it repeats) for each call that
            computes what an earlier call does, which TensorFlow runs once
            and no brick holds (`dlbricks_tf.cutting.merge`).
    """

    name: str
    granularity: int
    bricks: list[Brick]
    dependencies: list[tuple[int, ...]]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    num_calls: int
    fuse: bool = False
    merged: tuple[tuple[str, str], ...] = ()


def decompose(
    model_or_path: Any,
    granularity: int = 1,
    custom_objects: Mapping[str, Any] | None = None,
    safe_mode: bool = True,
    *,
    fuse: bool = False,
    input_shapes: Mapping[str, Sequence[int | None]] | None = None,
) -> Decomposition:
    """Cuts a Keras model into bricks of at most `granularity` layer calls.

    The model's config is walked (no weight is read), nested models are
    flattened, and the calls are split in topological order with the
    paper's Algorithms 1 and 2 (see `split.py`).

    Args:
        model_or_path: a Functional or Sequential `keras.Model`, or the path
            of a `.keras` archive, an `.h5` file or a model-config `.json`.
        granularity: G, the most layer calls a brick may hold (1 or more).
        custom_objects: custom layer classes by name, for model files whose
            layers are not registered with Keras.
        safe_mode: refuse Lambda layers from files, whose code would run when
            a brick is built. A model in memory is trusted: its code already
            runs here.
        fuse: never cut a convolution or dense layer from the
            BatchNormalization and activation that TensorFlow fuses into
            it; G then counts such units (see `split.fusion_units`).
        input_shapes: {input name: shape without the batch dimension} for
            inputs with open dimensions (a transformer's sequence length),
            e.g. {"token_ids": (128,), "padding_mask": (128,)}; "*" names
            every input not named. The shapes go into the signatures, so
            two lengths give different bricks.

    Returns:
        The `Decomposition`.

    Raises:
        DecompositionError: the model, or one of its layers, cannot be
            decomposed; the message names it and what to do.
        ValueError: `granularity` is not an integer of 1 or more.

    Example:
        >>> m = keras.applications.InceptionV3(weights=None)
        >>> d = dlbricks_tf.decompose(m, granularity=3)
        >>> d.bricks[5].build(batch_size=1)
    """
    if isinstance(granularity, bool) or not isinstance(granularity, int):
        raise ValueError(
            f"granularity must be an integer. Received: {granularity!r}"
        )
    if granularity < 1:
        raise ValueError(
            f"granularity must be 1 or more. Received: {granularity}"
        )
    graph, factory = model_graph(
        model_or_path,
        custom_objects,
        safe_mode,
        input_shapes=input_shapes,
    )
    return from_runs(
        graph,
        factory,
        split.split(graph, granularity, fuse),
        granularity=granularity,
        fuse=fuse,
    )


def model_graph(
    model_or_path: Any,
    custom_objects: Mapping[str, Any] | None = None,
    safe_mode: bool = True,
    *,
    input_shapes: Mapping[str, Sequence[int | None]] | None = None,
) -> tuple[graph_lib.Graph, replay.LayerFactory]:
    """The model's checked graph of calls, and the factory bricks build with.

    What `decompose` cuts; the arguments are `decompose`'s. Other ways of
    choosing runs (`dlbricks_tf.estimating.cover`) start here and end in
    `from_runs`. A call that repeats an earlier one on the same tensors is
    merged into it, as TensorFlow runs it once (`merge.merge_equal_calls`).

    Raises:
        DecompositionError: As `decompose`.
    """
    source = loading.load(model_or_path, safe_mode=safe_mode)
    factory = replay.LayerFactory(
        custom_objects=dict(custom_objects or {}),
        safe_mode=safe_mode and not source.trusted,
        live_classes=source.live_classes,
    )
    graph = graph_lib.walk(source.entry)
    if not graph.calls:
        raise DecompositionError(
            f"Model '{graph.name}' has no layer calls to decompose."
        )
    checked: set[tuple] = set()
    for c in graph.calls:
        kind = (
            c.class_name,
            c.layer_config.get("module"),
            c.name if c.class_name == "Lambda" else None,
        )
        if kind not in checked:
            factory.check(c)
            checked.add(kind)
    graph = replay.infer_missing_specs(graph, factory)
    if input_shapes:
        graph = replay.with_input_shapes(graph, input_shapes, factory)
    return merge.merge_equal_calls(graph), factory


class Cutter:
    """Makes the brick of any run of a graph's calls, as `decompose` does.

    The signature of a run depends on which of its outputs the rest of the
    model reads, so it is made here, with the model around it, for
    `decompose` and for every other way of choosing runs alike.

    Args:
        graph: The model's calls (`model_graph`).
        factory: The factory the bricks build their layers with.
    """

    def __init__(
        self, graph: graph_lib.Graph, factory: replay.LayerFactory
    ) -> None:
        self.graph = graph
        self.factory = factory
        self._keys = [signature.call_key(c) for c in graph.calls]
        self._consumers: list[list[int]] = [[] for _ in graph.specs]
        for c in graph.calls:
            for t in c.inputs:
                self._consumers[t].append(c.index)
        self._model_outputs = set(graph.outputs)

    def brick(self, begin: int, end: int) -> Brick:
        """The brick of calls `[begin, end)` (a buildable run)."""
        graph, calls = self.graph, self.graph.calls
        consumers = self._consumers
        exposed = {
            t
            for c in calls[begin:end]
            for t in c.outputs
            if t in self._model_outputs
            or not consumers[t]
            or any(not begin <= u < end for u in consumers[t])
        }
        # The same sub-network gets the same brick wherever it is.
        order = signature.canonical_order(
            calls[begin:end], self._keys[begin:end], graph.specs, exposed
        )
        run = tuple(calls[begin + j] for j in order)
        inputs: list[int] = []
        produced: set[int] = set()
        for c in run:
            for t in c.inputs:
                if t not in produced and t not in inputs:
                    inputs.append(t)
            produced.update(c.outputs)
        outputs = [t for c in run for t in c.outputs if t in exposed]
        specs = []
        for t in inputs:
            spec = graph.specs[t]
            if spec is None:
                reader = next(c for c in run if t in c.inputs)
                raise DecompositionError(
                    f"The input shape of layer '{reader.name}' is unknown; "
                    "give the model a keras.Input with a shape."
                )
            specs.append(spec)
        return Brick(
            layers=tuple(c.name for c in run),
            signature=signature.brick_signature(
                run, [self._keys[c.index] for c in run], inputs, specs, outputs
            ),
            inputs=tuple(specs),
            outputs=tuple(graph.specs[t] for t in outputs),
            class_names=tuple(c.class_name for c in run),
            input_ids=tuple(inputs),
            output_ids=tuple(outputs),
            calls=run,
            factory=self.factory,
            specs=graph.specs,
        )


def from_runs(
    graph: graph_lib.Graph,
    factory: replay.LayerFactory,
    runs: Sequence[tuple[int, int]],
    *,
    granularity: int,
    fuse: bool = False,
    cutter: Cutter | None = None,
) -> Decomposition:
    """The decomposition of a graph into given runs of calls.

    Args:
        graph: The model's calls (`model_graph`).
        factory: The factory the bricks build their layers with.
        runs: Disjoint, buildable runs `(begin, end)` in order, covering
            every call (`split.split`, or a cover).
        granularity: G, recorded in the decomposition.
        fuse: Whether the runs keep fusion units whole, recorded.
        cutter: A `Cutter` of this graph to reuse.

    Returns:
        The `Decomposition`.
    """
    cutter = cutter or Cutter(graph, factory)
    brick_of_call = [0] * len(graph.calls)
    bricks = []
    dependencies = []
    for number, (begin, end) in enumerate(runs):
        brick = cutter.brick(begin, end)
        for c in brick.calls:
            brick_of_call[c.index] = number
        bricks.append(brick)
        dependencies.append(
            tuple(
                sorted(
                    {
                        brick_of_call[graph.producers[t]]
                        for t in brick.input_ids
                        if graph.producers[t] >= 0
                    }
                )
            )
        )
    return Decomposition(
        name=graph.name,
        granularity=granularity,
        bricks=bricks,
        dependencies=dependencies,
        inputs=graph.inputs,
        outputs=graph.outputs,
        num_calls=len(graph.calls),
        fuse=fuse,
        merged=graph.merged,
    )
