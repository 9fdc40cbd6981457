"""Tests of dlbricks_tf/reporting/charts.py: PNGs that decode at their size."""

import io

import matplotlib.image
import numpy as np
import pytest

from dlbricks_tf.reporting import charts

NAMES = [f"Model{i}" for i in range(6)]


def decode(png: bytes) -> np.ndarray:
    return matplotlib.image.imread(io.BytesIO(png), format="png")


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: charts.bar_chart(
            NAMES, range(6), title="t", value_label="v", reference=2.0,
            reference_label="mean", annotations=tuple(NAMES), **kw,
        ),
        lambda **kw: charts.grouped_bar_chart(
            NAMES, {"a": range(6), "b": range(6, 0, -1)}, **kw
        ),
        lambda **kw: charts.stacked_bar_chart(
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
    image = decode(png)
    assert image.shape[:2] == (480, 640)
    assert image.shape[2] in (3, 4)
    assert charts.png_size(png) == (640, 480)
    assert image.std() > 0  # Something was drawn.


def test_dpi_scales_the_png():
    png = charts.bar_chart(["a", "b"], [1, 2], size=(3.0, 2.0), dpi=50)
    assert decode(png).shape[:2] == (100, 150)


def test_default_size_grows_with_the_labels():
    few = charts.bar_chart(NAMES[:3], [1, 2, 3])
    many_names = [f"LongModelName{i}" for i in range(40)]
    many = charts.bar_chart(many_names, range(40))
    (w_few, h_few), (w_many, h_many) = map(charts.png_size, (few, many))
    assert w_few == w_many
    assert h_many > h_few
    # About 0.3 inch (30 px) or more per label, so 8-point labels fit.
    assert h_many / 40 >= 28
    big = charts.png_size(charts.heatmap(many_names, np.ones((40, 40))))
    assert min(big) / 40 >= 24


def test_panels_side_by_side():
    bars = charts.Bars(("G=1", "G=2"), (("sys", (1.0, 0.9)),), reference=1.0)
    png = charts.bar_panels([bars, bars], horizontal=False, size=(8, 4))
    assert decode(png).shape[:2] == (400, 800)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="3 values for 2 labels"):
        charts.grouped_bar_chart(["a", "b"], {"s": [1, 2, 3]})
    with pytest.raises(ValueError, match="annotations"):
        charts.bar_chart(["a", "b"], [1, 2], annotations=("x",))
    with pytest.raises(ValueError, match="2x2 matrix"):
        charts.heatmap(["a", "b"], np.ones((3, 3)))
    with pytest.raises(ValueError, match="at least one panel"):
        charts.bar_panels([])
    with pytest.raises(ValueError, match="Not a PNG"):
        charts.png_size(b"GIF89a" + bytes(30))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
