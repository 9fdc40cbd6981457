"""Tests of dlbricks_tf.drawing.scatter_charts: estimate vs measurement."""

import math

import numpy as np
import pytest

from dlbricks_tf.drawing import charts, scatter_charts
from tests import chart_images


def test_measured_vs_estimated_draws_both_ranges_and_the_band():
    fig = scatter_charts.measured_vs_estimated_figure(
        ["a", "b", "c"],
        [10.0, 20.0, 40.0],
        [9.0, 22.0, math.nan],
        estimated_ranges=[(8.0, 10.0), None, (30.0, 50.0)],
        measured_ranges=[(9.5, 10.5), (19.0, 21.5), None],
        parallel=[8.0, 20.0, 30.0],
        band=0.1,
    )
    ax = fig.axes[0]
    got = chart_images.error_segments(ax)
    # Vertical at the measurement; c has no estimate, so no bar.
    np.testing.assert_allclose(got["estimate's range"], [[(10, 8), (10, 10)]])
    # Horizontal at the estimate.
    np.testing.assert_allclose(
        got["measured CI"], [[(9.5, 9), (10.5, 9)], [(19, 22), (21.5, 22)]]
    )
    ratios = sorted(
        round(float(line.get_ydata()[1] / line.get_xdata()[1]), 9)
        for line in ax.lines
        if line.get_linestyle() != "None"  # Not an error bar's caps.
    )
    assert ratios == [0.9, 1.0, 1.1]  # The band around the diagonal.
    # 8..50 ms spans more than a factor of 4: logarithmic, holding all.
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert ax.get_xlim() == ax.get_ylim()
    assert ax.get_xlim()[0] < 8.0 and ax.get_xlim()[1] > 50.0
    assert {t.get_text() for t in ax.texts} == {"a", "b"}
    assert charts.png_size(charts.to_png(fig)) == (800, 700)


def test_measured_vs_estimated_numbers_many_models_with_a_key():
    names = [f"m{i}" for i in range(13)]
    estimated = [11.0 + i for i in range(13)]
    estimated[4] = math.nan  # No estimate: listed, not drawn.
    fig = scatter_charts.measured_vs_estimated_figure(
        names, [10.0 + i for i in range(13)], estimated
    )
    ax, key = fig.axes
    assert ax.get_xscale() == "linear"  # 10..23 ms: a factor under 4.
    assert ax.get_xlim() == ax.get_ylim() == (0.0, pytest.approx(23 * 1.1))
    numbers = sorted(int(t.get_text()) for t in ax.texts)
    assert numbers == [i for i in range(1, 14) if i != 5]
    listed = {t.get_text() for t in key.texts}
    assert {"1  m0", "5  m4 (not drawn)", "13  m12"} <= listed
    assert len(listed) == 13
    assert chart_images.error_segments(ax) == {}


def test_measured_vs_estimated_refuses_mismatched_lengths():
    with pytest.raises(ValueError, match="estimated has 1 values for 2"):
        scatter_charts.measured_vs_estimated(["a", "b"], [1.0, 2.0], [1.0])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
