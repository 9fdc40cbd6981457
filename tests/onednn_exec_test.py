"""benchmarks/onednn_exec.py: oneDNN's execution lines, model against bricks.

Each child's lines are read only after its mark, and the comparison weighs
every problem both ways ran by the model's executions of it.
"""

import pytest

from benchmarks import onednn_exec


def _line(kind: str, problem: str, ms: float, what: str = "exec") -> str:
    return (
        f"onednn_verbose,v1,primitive,{what},cpu,{kind},jit:avx512_core,"
        f"forward_training,src:f32::blocked:acdb::f0,,alg:x,{problem},{ms}\n"
    )


def _tally(lines, calls):
    tally = onednn_exec.Tally()
    passed = [line for line in lines if not tally.feed(line)]
    assert tally.feed(f"=== calls {calls}\n")
    return tally, passed


def test_lines_before_the_mark_and_creations_are_not_read():
    tally, passed = _tally(
        [
            _line("reorder", "8x3x3", 1.0),  # Warm-up: before the mark.
            "=== begin\n",
            _line("reorder", "8x3x3", 0.002),
            _line("reorder", "8x3x3", 0.004, what="create:cache_hit"),
            _line("convolution", "mb1_ic8oc8", 0.010),
            "| a line of the child's own |\n",
        ],
        calls=1,
    )
    assert dict(tally.durations) == {
        ("reorder", "8x3x3"): [0.002],
        ("convolution", "mb1_ic8oc8"): [0.010],
    }
    assert tally.calls == 1
    assert passed == ["| a line of the child's own |\n"]


def test_the_model_weighs_each_problem_both_ways_ran():
    model, _ = _tally(
        ["=== begin\n"]
        # Per call: the convolution 3 times (10 and 20 us), the reorder once,
        # and a pooling the bricks never ran.
        + [_line("convolution", "a", 0.010)] * 4
        + [_line("convolution", "a", 0.020)] * 2
        + [_line("reorder", "r", 0.002)] * 2
        + [_line("pooling", "p", 0.006)] * 2,
        calls=2,
    )
    bricks, _ = _tally(
        ["=== begin\n"]
        + [_line("convolution", "a", 0.030)]
        + [_line("reorder", "r", 0.004)]
        + [_line("softmax", "s", 0.5)],
        calls=1,
    )
    rows, share = onednn_exec.compare(model, bricks)
    by_kind = {r.kind: r for r in rows}
    assert [r.kind for r in rows] == ["convolution", "reorder", "all"]
    conv = by_kind["convolution"]
    assert conv.per_call == pytest.approx(3.0)
    assert conv.model_us == pytest.approx(40 / 3)
    assert conv.bricks_us == pytest.approx(30.0)
    assert by_kind["reorder"].bricks_us == pytest.approx(4.0)
    every = by_kind["all"]
    assert every.per_call == pytest.approx(4.0)
    assert every.model_us == pytest.approx((40 + 2) / 4)
    assert every.bricks_us == pytest.approx((90 + 4) / 4)
    # The pooling (6 us of the call's 48) has no counterpart.
    assert share == pytest.approx(42 / 48)


def test_a_way_without_calls_is_refused():
    with pytest.raises(ValueError, match="one call"):
        onednn_exec.compare(onednn_exec.Tally(), onednn_exec.Tally(calls=1))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
