"""Tests for dlbricks_tf/cutting/suite.py."""

from types import SimpleNamespace

import pytest

from dlbricks_tf.cutting import suite as suite_lib


def _decomposition(name, signatures):
    bricks = [SimpleNamespace(signature=s) for s in signatures]
    return SimpleNamespace(name=name, bricks=bricks)


def test_unique_bricks_with_counts_per_model():
    suite = suite_lib.build_suite(
        {
            "a": _decomposition("a", ["conv", "relu", "conv", "relu", "fc"]),
            "b": _decomposition("b", ["conv", "pool", "conv"]),
        }
    )
    assert suite.signatures == ("conv", "relu", "fc", "pool")
    assert suite.models == ("a", "b")
    conv = suite.entries[0]
    assert conv.counts == (("a", 2), ("b", 2))
    assert conv.total == 4
    assert conv.count("b") == 2 and suite.entries[2].count("b") == 0
    assert suite.total_bricks == 8
    assert len(suite) == 4


def test_representative_is_first_occurrence():
    d = _decomposition("a", ["x", "x"])
    suite = suite_lib.build_suite({"a": d})
    assert suite.entries[0].brick is d.bricks[0]


def test_chains_take_the_bricks_left_in_first_appearance():
    suite = suite_lib.build_suite(
        {"a": _decomposition("a", ["conv", "relu", "pool", "fc"])}
    )
    chained = suite.chain_order({"fc", "relu", "conv"})
    assert [e.signature for e in chained] == ["conv", "relu", "fc"]


def test_shards_are_disjoint_cover_and_deterministic():
    d = _decomposition("a", [f"s{i}" for i in range(11)])
    suite = suite_lib.build_suite({"a": d})
    shards = [suite.shard(i, 3) for i in range(3)]
    seen = [s for shard in shards for s in shard.signatures]
    assert sorted(seen) == sorted(suite.signatures)
    assert len(seen) == len(set(seen))
    assert suite.shard(1, 3) == suite_lib.build_suite({"a": d}).shard(1, 3)


@pytest.mark.parametrize("index,count", [(3, 3), (-1, 2), (0, 0)])
def test_bad_shard_raises(index, count):
    suite = suite_lib.build_suite({"a": _decomposition("a", ["x"])})
    with pytest.raises(ValueError):
        suite.shard(index, count)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
