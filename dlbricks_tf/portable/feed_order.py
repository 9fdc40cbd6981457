"""The order a suite folder's bricks are chained in: each fed by the one before.

`run` and `bench --models` chain a model's bricks in the model's order, so
most bricks read what the brick before them has just written, hot in
cache, as in the model (`chain_graph.feed_plan`). A suite folder lists its
bricks by signature, which hides the models' order; chained in that order,
4 of a four-model suite's 477 neighbours could feed one another, against
393 in the models' order, and the bricks read 2-18% higher per model than
the same bricks cut in memory (bricks cut in memory and chained in
signature order read as high: the order, not the files, is the cause;
docs/history/2026-12-05-intel-xeon.md).

`ordered` rebuilds feeding neighbours from the manifest's specs alone:
starting from the first brick by signature, each next brick is the first
(by signature) that one of the last brick's outputs can feed, as
`feed_plan` matches them (a floating input of the same shape and dtype);
where none can, the first brick left. It reads nothing the manifest does
not already show, and the same suite always gives the same order.

Example:
    suite = suite_dir.load_suite(folder)
    for entry in feed_order.ordered(suite.entries):
        ...
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Floating dtypes a brick's output can feed (`chain_graph.feed_plan` feeds
# floating inputs only: integer inputs are ids or indices with bounds).
_FLOATING = frozenset({"float16", "bfloat16", "float32", "float64"})


def _spec(shape: Sequence[int | None], dtype: str) -> tuple:
    """The part of a spec that decides feeding: shape without the batch."""
    return tuple(shape[1:]), str(dtype)


def ordered(entries: Sequence[Any]) -> list[Any]:
    """`entries` (with `inputs` and `outputs` specs) in a feeding order.

    Args:
        entries: Suite entries (`suite_dir.SuiteDirEntry`), in signature
            order; any objects with `inputs` and `outputs` sequences of
            specs that have `shape` (batch first) and `dtype`.

    Returns:
        The same entries, each followed where it can be by one that its
        outputs feed.
    """
    entries = list(entries)
    # Per floating input spec, the entries that take one, in given order.
    takers: dict[tuple, list[int]] = {}
    for i, entry in enumerate(entries):
        for spec in {
            _spec(x.shape, x.dtype)
            for x in entry.inputs
            if str(x.dtype) in _FLOATING
        }:
            takers.setdefault(spec, []).append(i)
    heads = dict.fromkeys(takers, 0)  # First index not yet skipped.
    used = [False] * len(entries)
    order: list[int] = []
    first = 0  # The first entry not yet placed.

    def fed_by(index: int) -> int | None:
        """The first unplaced entry that an output of `index` can feed."""
        best = None
        for y in entries[index].outputs:
            spec = _spec(y.shape, y.dtype)
            queue = takers.get(spec)
            if queue is None:
                continue
            k = heads[spec]
            while k < len(queue) and used[queue[k]]:
                k += 1
            heads[spec] = k
            if k < len(queue) and (best is None or queue[k] < best):
                best = queue[k]
        return best

    while len(order) < len(entries):
        nxt = fed_by(order[-1]) if order else None
        if nxt is None:
            while used[first]:
                first += 1
            nxt = first
        used[nxt] = True
        order.append(nxt)
    return [entries[i] for i in order]
