"""benchmarks/onednn_creates.py: oneDNN's creation lines counted by phase.

The census is fed lines as the child writes them (marks and oneDNN's log)
and must put each creation in the phase of the outermost timer around it.
"""

import pytest

from benchmarks import onednn_creates

_CONV = (
    "onednn_verbose,v1,primitive,create:cache_miss,cpu,convolution,"
    "brg_conv_fwd:avx512_core,forward_training,src:f32,,"
    "alg:convolution_direct,mb1_ic8oc8,0.21"
)
_SWISH = (
    "onednn_verbose,v1,primitive,create:cache_hit,cpu,eltwise,"
    "jit:avx512_core,forward_training,data:f32::blocked:abcd::f0,,"
    "alg:eltwise_swish alpha:1 beta:0,1x7x7x1152,0.003"
)
_EXEC = (
    "onednn_verbose,v1,primitive,exec,cpu,eltwise,jit:avx512_core,"
    "forward_training,data:f32,,alg:eltwise_swish alpha:1 beta:0,1x7,0.01"
)


def _census(lines):
    census = onednn_creates.Census()
    passed = [line for line in lines if not census.feed(line + "\n")]
    return census, passed


def test_creations_fall_in_the_outermost_timers_phase():
    census, passed = _census(
        [
            _CONV,  # Before any timer: elsewhere.
            "=== begin preparation|chain:1",
            _CONV,
            _SWISH,
            "=== end",
            "=== begin chain samples|chain:1",
            _SWISH,
            _EXEC,  # Not a creation.
            "=== end",
            "=== begin chain samples|chain:1",
            _SWISH,
            "=== end",
            "=== begin model samples|model:2",
            "=== begin reference readings|reference:3",
            _SWISH,  # Read inside the model's call: the model's.
            "=== end",
            "=== end",
            "=== begin reference readings|reference:3",
            _CONV,
            "=== end",
            "| a table row of the benchmark |",
        ]
    )
    assert dict(census.by_phase) == {
        "elsewhere": 1,
        "preparation": 2,
        "chain samples": 2,
        "model samples": 1,
        "reference readings": 1,
    }
    assert census.per_sample == {"chain:1": [1, 1], "model:2": [1]}
    assert census.kinds == {
        ("chain samples", "eltwise", "alg:eltwise_swish"): 2,
        ("model samples", "eltwise", "alg:eltwise_swish"): 1,
    }
    # Only the benchmark's own lines are passed on.
    assert passed == ["| a table row of the benchmark |"]


def test_the_table_says_which_timers_created_in_every_sample():
    census, _ = _census(
        [
            "=== begin chain samples|chain:1",
            _SWISH,
            _SWISH,
            "=== end",
            "=== begin chain samples|chain:1",
            _SWISH,
            _SWISH,
            "=== end",
            "=== begin model samples|model:2",
            _SWISH,
            "=== end",
            "=== begin model samples|model:2",
            "=== end",
            "=== begin model samples|model:3",
            "=== end",
        ]
    )
    table = census.table()
    assert "| chain samples | 4 |" in table
    assert "| model samples | 1 |" in table
    assert "| chain samples | eltwise | eltwise_swish | 4 |" in table
    # 3 timers, 5 later samples, 3 of them created, 1-2 each; only the
    # chain made the same count every time.
    assert "| 3 | 5 | 3 | 1-2 | 1 of 2 |" in table


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
