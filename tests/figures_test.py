"""Tests of benchmarks/figures.py: the evaluation scripts' figures."""

import pytest

from benchmarks import figures


def test_within_counts_the_band_edges_in():
    assert figures.within([0.89, 0.9, 1.0, 1.1, 1.11]) == 3
    assert figures.within([]) == 0


def test_summary_row_gives_count_geomean_and_range():
    # Geometric mean of 0.8, 1.0 and 1.25: (0.8 * 1.25) ** (1/3) = 1.
    assert figures.summary_row("fewest", [0.8, 1.0, 1.25]) == (
        "| fewest | 1/3 | 1.000 | 0.800-1.250 |"
    )
    assert figures.summary_row("G=2", [0.5, 2.0]) == (
        "| G=2 | 0/2 | 1.000 | 0.500-2.000 |"
    )


def test_seconds_summary_takes_the_middle_two_of_an_even_count():
    # The upper median would be 30 ms.
    assert figures.seconds_summary([0.05, 0.01, 0.03, 0.02]) == (
        "median 25 ms, max 50 ms"
    )
    assert figures.seconds_summary([0.0124]) == "median 12 ms, max 12 ms"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
