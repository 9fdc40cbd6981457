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
"""

from __future__ import annotations

from dlbricks_tf.graph import Graph


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


def split(graph: Graph, granularity: int) -> list[tuple[int, int]]:
    """FindModelSubgraphs: the runs `(begin, end)` that cover every call.

    Args:
        graph: the model's calls in topological order.
        granularity: G, the most calls a run may hold (1 or more).

    Returns:
        Non-overlapping runs in order, each of 1..G calls, covering all calls.
    """
    if granularity < 1:
        raise ValueError(
            f"granularity must be 1 or more. Received: {granularity}"
        )
    runs = []
    begin = 0
    count = len(graph.calls)
    while begin < count:
        end = min(begin + granularity, count)
        # SplitModel: a range that cannot be built yields its first call.
        if end - begin > 1 and not buildable(graph, begin, end):
            end = begin + 1
        runs.append((begin, end))
        begin = end
    return runs
