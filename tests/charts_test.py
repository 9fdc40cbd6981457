"""Tests of dlbricks_tf/drawing/charts.py and bar_charts.py: PNGs that
decode at their size, bars and their ranges."""

import math

import numpy as np
import pytest

from dlbricks_tf.drawing import bar_charts, charts
from tests import chart_images

NAMES = [f"Model{i}" for i in range(6)]


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: bar_charts.bar_chart(
            NAMES, range(6), title="t", value_label="v", reference=2.0,
            reference_label="mean", annotations=tuple(NAMES), **kw,
        ),
        lambda **kw: bar_charts.grouped_bar_chart(
            NAMES, {"a": range(6), "b": range(6, 0, -1)}, **kw
        ),
        lambda **kw: bar_charts.stacked_bar_chart(
            NAMES, {"a": [0.5] * 6, "b": [0.5] * 6}, horizontal=False, **kw
        ),
        lambda **kw: charts.heatmap(
            NAMES, np.eye(6), title="t", colorbar_label="c", **kw
        ),
    ],
    ids=["bar", "grouped", "stacked", "heatmap"],
)  # fmt: skip
def test_png_has_the_size_asked_for(make):
    png = make(size=(6.4, 4.8), dpi=100)
    image = chart_images.decode(png)
    assert image.shape[:2] == (480, 640)
    assert image.shape[2] in (3, 4)
    assert charts.png_size(png) == (640, 480)
    assert image.std() > 0  # Something was drawn.


def test_dpi_scales_the_png():
    png = bar_charts.bar_chart(["a", "b"], [1, 2], size=(3.0, 2.0), dpi=50)
    assert chart_images.decode(png).shape[:2] == (100, 150)


def test_default_size_grows_with_the_labels():
    few = bar_charts.bar_chart(NAMES[:3], [1, 2, 3])
    many_names = [f"LongModelName{i}" for i in range(40)]
    many = bar_charts.bar_chart(many_names, range(40))
    (w_few, h_few), (w_many, h_many) = map(charts.png_size, (few, many))
    assert w_few == w_many
    assert h_many > h_few
    # About 0.3 inch (30 px) or more per label, so 8-point labels fit.
    assert h_many / 40 >= 28
    big = charts.png_size(charts.heatmap(many_names, np.ones((40, 40))))
    assert min(big) / 40 >= 24


def test_panels_side_by_side():
    bars = bar_charts.Bars(
        ("G=1", "G=2"), (("sys", (1.0, 0.9)),), reference=1.0
    )
    png = bar_charts.bar_panels([bars, bars], horizontal=False, size=(8, 4))
    assert chart_images.decode(png).shape[:2] == (400, 800)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="3 values for 2 labels"):
        bar_charts.grouped_bar_chart(["a", "b"], {"s": [1, 2, 3]})
    with pytest.raises(ValueError, match="annotations"):
        bar_charts.bar_chart(["a", "b"], [1, 2], annotations=("x",))
    with pytest.raises(ValueError, match="2x2 matrix"):
        charts.heatmap(["a", "b"], np.ones((3, 3)))
    with pytest.raises(ValueError, match="at least one panel"):
        bar_charts.bar_panels([])
    with pytest.raises(ValueError, match="Not a PNG"):
        charts.png_size(b"GIF89a" + bytes(30))


RANGED = bar_charts.Bars(
    ("a", "b", "c", "d", "e"),
    (("normalized", (0.9, 1.0, 1.2, math.nan, 1.0)),),
    reference=1.0,
    reference_label="estimate = measured",
    band=(0.9, 1.1),
    band_label="+-10%",
    errors=((0.8, 1.05), None, (1.1, 1.3), (0.5, 0.6), (1.1, 1.2)),
    error_label="range",
    annotations=("0.9", "1.0", "1.2", "nan", "1.0"),
)


@pytest.mark.parametrize("horizontal", [True, False])
def test_error_bars_span_each_labelled_range(horizontal):
    fig = bar_charts.bar_figure([RANGED], horizontal=horizontal)
    (ax,) = fig.axes
    # (value, position) of each end; b has no range, d no value, and e's
    # range (1.1, 1.2) misses its value 1.0: drawn from the value up.
    ends = [
        [(0.8, 0), (1.05, 0)],
        [(1.1, 2), (1.3, 2)],
        [(1.0, 4), (1.2, 4)],
    ]
    if not horizontal:
        ends = [[(p, v) for v, p in segment] for segment in ends]
    got = chart_images.error_segments(ax)
    assert set(got) == {"range"}
    np.testing.assert_allclose(got["range"], ends)
    # The reference and band lines (not the error bars' caps).
    lines = [line for line in ax.lines if line.get_linestyle() != "None"]
    line_at = [
        (line.get_xdata() if horizontal else line.get_ydata())[0]
        for line in lines
    ]
    assert sorted(line_at) == [0.9, 1.0, 1.1]
    (legend,) = fig.legends
    assert {t.get_text() for t in legend.get_texts()} == {
        "normalized",
        "range",
        "+-10%",
        "estimate = measured",
    }
    # Each value is written beyond its error bar, never inside it.
    texts = {t.get_text(): t.xy for t in ax.texts}
    assert texts["0.9"] == ((1.05, 0) if horizontal else (0, 1.05))
    # d has no bar: its text sits at the base.
    assert texts["nan"] == ((0.0, 3) if horizontal else (3, 0.0))
    png = charts.to_png(fig)
    assert charts.png_size(png) == tuple(
        round(v * fig.dpi) for v in fig.get_size_inches()
    )


def test_bars_without_ranges_draw_no_error_bar():
    bars = bar_charts.Bars(
        ("a", "b"), (("n", (1.0, 2.0)),), errors=(None, None)
    )
    assert (
        chart_images.error_segments(bar_charts.bar_figure([bars]).axes[0]) == {}
    )


def test_error_ranges_are_checked():
    with pytest.raises(ValueError, match="1 error ranges for 2 labels"):
        bar_charts.Bars(("a", "b"), (("n", (1.0, 2.0)),), errors=((0, 1),))
    with pytest.raises(ValueError, match="exactly one unstacked series"):
        bar_charts.Bars(
            ("a",), (("n", (1.0,)), ("m", (2.0,))), errors=((0.5, 1.5),)
        )


def test_large_type_keeps_rows_apart():
    names = [f"LongModelName{i}" for i in range(40)]
    small = charts.png_size(bar_charts.bar_chart(names, range(40), dpi=150))
    large = charts.png_size(
        bar_charts.bar_chart(names, range(40), dpi=150, font=12)
    )
    assert small[0] == large[0] == 1125  # 7.5 inches at 150 dpi.
    # A 12-point label is 25 px at 150 dpi: each row has two of them.
    assert large[1] / 40 >= 2 * 12 * 150 / 72
    assert large[1] > small[1]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
