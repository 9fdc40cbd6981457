"""benchmarks/profile_gap.py: an XLA kernel's durations by place in a call.

`modes` reads a list of event durations, a fixed number a call, as places
in a call: the fastest, the median and the share slower than 1.4x the
fastest, which tells an op that runs in two modes.
"""

import pytest

from benchmarks import profile_gap


def test_each_place_in_a_call_gets_its_fastest_median_and_slow_share():
    # Two events a call, three calls and a cut-off fourth: the first
    # place runs 4 or 8 ms, the second always 2.
    durations = [4.0, 2.0, 8.0, 2.0, 4.0, 2.0, 4.0]
    assert profile_gap.modes(durations, 2) == [
        (4.0, 4.0, pytest.approx(1 / 3)),
        (2.0, 2.0, 0.0),
    ]


def test_an_even_count_takes_the_middle_two_and_the_bound_is_exclusive():
    durations = [10.0, 14.0, 15.0, 20.0]  # One place, four calls.
    fastest, median, slow = profile_gap.modes(durations, 1)[0]
    assert (fastest, median) == (10.0, 14.5)
    assert slow == 0.5  # 14.0 is 1.4x 10.0, not slower than it.


def test_no_whole_call_gives_no_places():
    assert profile_gap.modes([1.0], 2) == []
    assert profile_gap.modes([], 0) == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
