"""Tests of dlbricks_tf/portable/feed_order.py: a suite's chain order.

Example:
    python -m pytest tests/feed_order_test.py -p no:cacheprovider
"""

import dataclasses

import pytest

from dlbricks_tf.portable import feed_order
from dlbricks_tf.portable.suite_dir import InputSpec, OutputSpec


@dataclasses.dataclass(frozen=True)
class Entry:
    signature: str
    inputs: tuple
    outputs: tuple


def _entry(signature, inputs, outputs, dtype="float32"):
    return Entry(
        signature,
        tuple(
            InputSpec(f"input_{i}", (None, *s), dtype)
            for i, s in enumerate(inputs)
        ),
        tuple(
            OutputSpec(f"output_{i}", (None, *s), dtype)
            for i, s in enumerate(outputs)
        ),
    )


def _fed_neighbours(entries):
    return sum(
        any(
            (tuple(x.shape[1:]), x.dtype)
            in {(tuple(y.shape[1:]), y.dtype) for y in a.outputs}
            for x in b.inputs
        )
        for a, b in zip(entries, entries[1:], strict=False)
    )


def test_a_model_order_is_rebuilt_from_signature_order():
    # A 3-brick model a -> b -> c, listed by signature as a suite is.
    a = _entry("1a", [(8, 8, 3)], [(8, 8, 16)])
    b = _entry("7b", [(8, 8, 16)], [(4, 4, 32)])
    c = _entry("4c", [(4, 4, 32)], [(10,)])
    by_signature = sorted([a, b, c], key=lambda e: e.signature)
    assert _fed_neighbours(by_signature) == 0
    order = feed_order.ordered(by_signature)
    assert [e.signature for e in order] == ["1a", "7b", "4c"]
    assert _fed_neighbours(order) == 2


def test_each_brick_is_placed_once_and_the_order_is_the_same_every_time():
    entries = [
        _entry(f"{i:02d}", [(4, 4, 1 + i % 3)], [(4, 4, 1 + (i + 1) % 3)])
        for i in range(12)
    ]
    first = feed_order.ordered(entries)
    assert sorted(e.signature for e in first) == [e.signature for e in entries]
    assert first == feed_order.ordered(entries)
    assert _fed_neighbours(first) == len(entries) - 1


def test_the_first_fed_brick_by_signature_is_taken():
    a = _entry("0a", [(2,)], [(5,)])
    fed_late = _entry("9z", [(5,)], [(1,)])
    fed_early = _entry("3m", [(5,)], [(1,)])
    other = _entry("1q", [(7,)], [(7,)])
    order = feed_order.ordered([a, other, fed_early, fed_late])
    assert [e.signature for e in order][:2] == ["0a", "3m"]


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_integer_and_mask_inputs_are_never_fed(dtype):
    # chain_graph.feed_plan feeds floating inputs only.
    a = _entry("0a", [(6,)], [(6,)], dtype=dtype)
    b = _entry("5b", [(1,)], [(1,)])
    c = _entry("9c", [(6,)], [(2,)], dtype=dtype)
    order = feed_order.ordered([a, b, c])
    assert [e.signature for e in order] == ["0a", "5b", "9c"]


def test_an_empty_suite_has_an_empty_order():
    assert feed_order.ordered([]) == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
