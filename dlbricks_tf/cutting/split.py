"""Cuts a graph into runs of consecutive calls: the paper's Algorithms 1, 2.

FindModelSubgraphs (Algorithm 1) walks the calls in topological order and
asks SplitModel (Algorithm 2) for a runnable network of the next G calls.
When those calls cannot form one, SplitModel emits the first call alone and
the walk retries from the next call.

Which runs are buildable. A run `[begin, end)` becomes a brick whose inputs
are fresh `keras.Input`s, one per tensor it reads from outside. We accept a
run only if every call after the first reads nothing from outside the run
but the first call's own inputs. Why:

* It is the paper's rule: a network that holds a Concatenate without the
  Concatenate's inputs is not a valid network. Letting any call open new
  inputs would turn every cut of a branching graph into a "network".
* Bricks stay single-entry pieces (a chain, or branches forking off the
  run's inputs), the shape that recurs within and across models. Runs that
  mixed calls of unrelated branches, in whatever order the topological sort
  interleaved them, would each be unique, and uniqueness is what DLBricks
  saves time with.

A single call is always buildable; its tensors' shapes are known (recorded
in the config or inferred, see `replay.infer_missing_specs`).

Fusion units (`fuse=True`). TensorFlow's graph optimiser runs a
convolution or dense layer, the BatchNormalization after it and the
activation after those as one fused kernel when they share a graph; cut
apart, each pays its own pass over memory, and a lone BatchNormalization
brick costs more than it does inside the model. With `fuse`, such a chain
(`fusion_units`) is never cut and counts as one step of G, so a brick at
G=1 is a Conv2D + BatchNormalization + ReLU where the model has one.
"""

from __future__ import annotations

from dlbricks_tf.cutting.graph import Graph

# The ways of cutting, as reports, export manifests and recipes name them.
SPLITS = ("plain", "fused")


def split_name(fuse: bool) -> str:
    """The name of a way of cutting: "fused" with fusion units, else "plain"."""
    return "fused" if fuse else "plain"


def buildable(graph: Graph, begin: int, end: int) -> bool:
    """Whether calls `[begin, end)` form a runnable network (see above)."""
    calls = graph.calls
    allowed = set(calls[begin].inputs)
    allowed.update(calls[begin].outputs)
    for c in calls[begin + 1 : end]:
        for t in c.inputs:
            if t not in allowed:
                return False
        allowed.update(c.outputs)
    return True


# Layers TensorFlow's graph optimiser fuses with what follows them.
PRODUCERS = frozenset({
    "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
    "Conv3DTranspose", "DepthwiseConv1D", "DepthwiseConv2D",
    "SeparableConv1D", "SeparableConv2D", "Dense", "EinsumDense",
})  # fmt: skip
NORMALIZATIONS = frozenset({"BatchNormalization"})
ACTIVATIONS = frozenset({"Activation", "ReLU", "LeakyReLU", "ELU"})

# Which class may follow which inside one fusion unit.
_FOLLOWS = {
    "producer": {"normalization", "activation"},
    "normalization": {"activation"},
    "activation": set(),
}


def _role(class_name: str) -> str | None:
    if class_name in PRODUCERS:
        return "producer"
    if class_name in NORMALIZATIONS:
        return "normalization"
    if class_name in ACTIVATIONS:
        return "activation"
    return None


def fusion_units(graph: Graph) -> list[tuple[int, int]]:
    """Cuts the calls into fusion units: runs `(begin, end)` never split.

    A unit is a call, extended by the next call in order while that call
    is a BatchNormalization after a convolution or dense layer, or an
    activation after either, reads only the previous call's one output,
    and is its only reader (the output is not also a model output).
    Every other call is a unit of its own.

    Args:
        graph: the model's calls in topological order.

    Returns:
        Non-overlapping units in order, covering all calls.
    """
    calls = graph.calls
    readers = [0] * len(graph.specs)
    for c in calls:
        for t in set(c.inputs):
            readers[t] += 1
    for t in graph.outputs:
        readers[t] += 1
    units = []
    begin = 0
    while begin < len(calls):
        end = begin + 1
        role = _role(calls[begin].class_name)
        while end < len(calls) and role is not None:
            before, call = calls[end - 1], calls[end]
            nxt = _role(call.class_name)
            if (
                nxt not in _FOLLOWS[role]
                or len(before.outputs) != 1
                or call.inputs != before.outputs
                or readers[before.outputs[0]] != 1
            ):
                break
            role = nxt
            end += 1
        units.append((begin, end))
        begin = end
    return units


def split(
    graph: Graph, granularity: int, fuse: bool = False
) -> list[tuple[int, int]]:
    """FindModelSubgraphs: the runs `(begin, end)` that cover every call.

    Args:
        graph: the model's calls in topological order.
        granularity: G, the most calls a run may hold (1 or more); with
            `fuse`, the most fusion units.
        fuse: Never cut a fusion unit (see `fusion_units`).

    Returns:
        Non-overlapping runs in order, each of 1..G calls (units), covering
        all calls.
    """
    if granularity < 1:
        raise ValueError(
            f"granularity must be 1 or more. Received: {granularity}"
        )
    if fuse:
        units = fusion_units(graph)
    else:
        units = [(i, i + 1) for i in range(len(graph.calls))]
    runs = []
    first = 0
    while first < len(units):
        last = min(first + granularity, len(units))
        begin, end = units[first][0], units[last - 1][1]
        # SplitModel: a range that cannot be built yields its first unit.
        if last - first > 1 and not buildable(graph, begin, end):
            last = first + 1
            end = units[first][1]
        runs.append((begin, end))
        first = last
    return runs
