"""Suite: the unique bricks of a set of models, with occurrence counts.

Bricks are the same iff their signatures are equal, so the suite keeps one
representative brick per signature and counts how often each model uses
it. Only the suite is timed; the counts rebuild every model's latency and
give the paper's speed-up. A suite can be cut into deterministic shards, one
per machine.

Example:
    suite = build_suite({name: dlbricks_tf.decompose(m) for name, m in ...})
    len(suite), suite.entries[0].counts
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol, TypeVar


class _Entry(Protocol):
    signature: str


_E = TypeVar("_E", bound=_Entry)


def shard_of(entries: Iterable[_E], index: int, count: int) -> tuple[_E, ...]:
    """The entries of shard `index` of `count`, round robin by signature.

    Entries are sorted by signature and every `count`-th is taken from
    `index`: shards are disjoint, cover the entries and depend only on the
    signatures, so every worker computes the same split, whether it was
    given the models or the suite folder exported from them.

    Raises:
        ValueError: If not 0 <= index < count.
    """
    if count < 1 or not 0 <= index < count:
        raise ValueError(
            f"Need 0 <= index < count. Received: index={index}, count={count}"
        )
    ordered = sorted(entries, key=lambda e: e.signature)
    return tuple(ordered[index::count])


class _Brick(Protocol):
    signature: str


class _Decomposition(Protocol):
    bricks: list[Any]


@dataclasses.dataclass(frozen=True)
class SuiteEntry:
    """One unique brick and where it occurs.

    Attributes:
        signature: The brick's signature.
        brick: A representative brick (the first occurrence); build it to
            time it.
        counts: (model name, occurrences) pairs, in model order.
    """

    signature: str
    brick: Any = dataclasses.field(compare=False, hash=False, repr=False)
    counts: tuple[tuple[str, int], ...] = ()

    @property
    def total(self) -> int:
        """Occurrences across all models."""
        return sum(n for _, n in self.counts)

    def count(self, model: str) -> int:
        """Occurrences in one model (0 if it does not use the brick)."""
        return dict(self.counts).get(model, 0)


@dataclasses.dataclass(frozen=True)
class Suite:
    """The unique bricks of several models, in order of first appearance.

    Attributes:
        entries: One entry per unique signature.
        models: The model names, in the order given.
    """

    entries: tuple[SuiteEntry, ...]
    models: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def signatures(self) -> tuple[str, ...]:
        """The unique signatures, in order of first appearance."""
        return tuple(e.signature for e in self.entries)

    def chain_order(
        self, signatures: Collection[str]
    ) -> tuple[SuiteEntry, ...]:
        """The entries of `signatures` in the order chains take them:
        first appearance, so that a brick follows the one before it in
        its model."""
        return tuple(e for e in self.entries if e.signature in signatures)

    @property
    def total_bricks(self) -> int:
        """Bricks across all models, repeats included."""
        return sum(e.total for e in self.entries)

    def shard(self, index: int, count: int) -> Suite:
        """Returns the entries of shard `index` of `count` (round robin).

        Shards are disjoint, cover the suite and depend only on the
        signatures, so every worker computes the same split (see
        `shard_of`).

        Raises:
            ValueError: If not 0 <= index < count.
        """
        return Suite(shard_of(self.entries, index, count), self.models)


def build_suite(decompositions: Mapping[str, _Decomposition]) -> Suite:
    """Collects the unique bricks of several decomposed models.

    Args:
        decompositions: {model name: decomposition}; each decomposition has
            `bricks`, each brick a `signature`.

    Returns:
        The suite, entries in order of first appearance (models in the
        mapping's order, bricks in topological order).
    """
    first: dict[str, Any] = {}
    counts: dict[str, dict[str, int]] = {}
    for model, decomposition in decompositions.items():
        for brick in decomposition.bricks:
            sig = brick.signature
            first.setdefault(sig, brick)
            per_model = counts.setdefault(sig, {})
            per_model[model] = per_model.get(model, 0) + 1
    entries = tuple(
        SuiteEntry(sig, brick, tuple(counts[sig].items()))
        for sig, brick in first.items()
    )
    return Suite(entries, tuple(decompositions))
