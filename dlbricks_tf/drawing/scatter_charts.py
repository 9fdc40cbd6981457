"""PNG charts of each model's estimate against its measurement.

`measured_vs_estimated` puts each model's estimate, with its range,
against its measurement, with the measurement's confidence interval, on
log axes around the diagonal; `measured_vs_estimated_figure` returns the
matplotlib figure instead, whose artists hold the plotted numbers
(`charts.to_png` draws it). Sizes and fonts as in
`dlbricks_tf.drawing.charts`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dlbricks_tf.drawing.charts import (
    DPI,
    LABEL_FONT,
    error_offsets,
    new_figure,
    palette,
    to_png,
)


def measured_vs_estimated(
    labels: Sequence[str],
    measured: Sequence[float],
    estimated: Sequence[float],
    *,
    size: tuple[float, float] | None = None,
    dpi: int = DPI,
    font: float = LABEL_FONT,
    **options: Any,
) -> bytes:
    """Each model's estimate against its measurement, as a PNG.

    Takes the arguments of `measured_vs_estimated_figure`.
    """
    return to_png(
        measured_vs_estimated_figure(
            labels,
            measured,
            estimated,
            size=size,
            dpi=dpi,
            font=font,
            **options,
        )
    )


def measured_vs_estimated_figure(
    labels: Sequence[str],
    measured: Sequence[float],
    estimated: Sequence[float],
    *,
    estimated_ranges: Sequence[tuple[float, float] | None] | None = None,
    measured_ranges: Sequence[tuple[float, float] | None] | None = None,
    parallel: Sequence[float] | None = None,
    band: float = 0.1,
    title: str = "",
    unit: str = "ms",
    size: tuple[float, float] | None = None,
    dpi: int = DPI,
    font: float = LABEL_FONT,
):
    """A point per model: measured on x, estimated on y.

    The estimate's range is a vertical error bar, the measurement's
    confidence interval a horizontal one; a model without one has no
    bar. The diagonal (estimate = measured) and the lines at 1 - band and
    1 + band times it frame the points; both axes are logarithmic when
    the values span more than a factor of 4 (the band is then as wide
    for a fast model as for a slow one). Up to 12 models are named
    beside their points; more are numbered, with a key under the chart.

    Args:
        labels: The models.
        measured: Each model's measured latency.
        estimated: Each model's estimate (nan: not drawn).
        estimated_ranges: Per model, the estimate's (low, high) or None.
        measured_ranges: Per model, the measurement's (low, high) or None.
        parallel: Each model's parallel estimate, drawn as a cross.
        band: Relative half-width of the band around the diagonal.
        title: The chart's title.
        unit: The values' unit, for the axis titles.
        size: Figure (width, height) in inches; None sizes it to the
            models.
        dpi: Pixels per inch.
        font: Size of the labels in points.

    Returns:
        The figure. Its first axes holds the error bars as containers
        labelled "estimate's range" and "measured CI".

    Raises:
        ValueError: If a sequence's length differs from the labels'.
    """
    n = len(labels)
    given = {
        "measured": measured,
        "estimated": estimated,
        "estimated_ranges": estimated_ranges,
        "measured_ranges": measured_ranges,
        "parallel": parallel,
    }
    for name, values in given.items():
        if values is not None and len(values) != n:
            raise ValueError(f"{name} has {len(values)} values for {n} labels.")
    x = [float(v) for v in measured]
    y = [float(v) for v in estimated]
    numbered = n > _NAMED_POINTS
    key_rows = -(-n // _KEY_COLUMNS) if numbered else 0
    scale = max(1.0, font / LABEL_FONT)
    if size is None:
        size = (8.0, 7.0 + 0.2 * scale * key_rows)
    fig = new_figure(size, dpi)
    if numbered:
        ax, key = fig.subplots(
            2, 1, height_ratios=[7.0, max(0.4, 0.2 * scale * key_rows)]
        )
    else:
        ax, key = fig.add_subplot(), None
    shown = [math.isfinite(a + b) for a, b in zip(x, y, strict=True)]
    points = ax.scatter(x, y, s=36, color=palette(1)[0], zorder=3)
    handles = [(points, "sequential estimate")]
    for ranges, vertical, color, name in (
        (estimated_ranges, True, "black", "estimate's range"),
        (measured_ranges, False, "tab:orange", "measured CI"),
    ):
        if ranges is not None:
            handles += _point_ranges(
                ax, x, y, shown, ranges, vertical, color, name
            )
    if parallel is not None:
        crosses = ax.scatter(
            x, [float(v) for v in parallel], marker="x", s=30, color="0.45"
        )
        handles.append((crosses, "parallel estimate"))
    low, high, log = _square_limits(x, y, given)
    if log:
        _log_axes(ax)
    handles += _diagonal(ax, low, high, band)
    for i, label in enumerate(labels):
        if shown[i]:
            ax.annotate(
                str(i + 1) if numbered else label,
                (x[i], y[i]),
                xytext=(5, 4),
                textcoords="offset points",
                fontsize=font,
            )
    if key is not None:
        _key(key, labels, shown, font)
    ax.set_xlabel(f"measured ({unit})", fontsize=font + 1)
    ax.set_ylabel(f"estimated ({unit})", fontsize=font + 1)
    ax.set_title(title, fontsize=font + 2)
    ax.tick_params(axis="both", labelsize=font)
    ax.grid(alpha=0.3, which="both" if log else "major")
    ax.legend(
        [h for h, _ in handles],
        [name for _, name in handles],
        loc="upper left",
        fontsize=font - 1,
    )
    return fig


def _point_ranges(
    ax,
    x: Sequence[float],
    y: Sequence[float],
    shown: Sequence[bool],
    ranges: Sequence[tuple[float, float] | None],
    vertical: bool,
    color: str,
    name: str,
) -> list[tuple[object, str]]:
    """Error bars of the shown points' ranges; [(handle, name)] or []."""
    kept = [
        (i, lo, hi)
        for i, lo, hi in zip(
            *error_offsets(y if vertical else x, ranges), strict=True
        )
        if shown[i]
    ]
    if not kept:
        return []
    drawn, lower, upper = (list(c) for c in zip(*kept, strict=True))
    container = ax.errorbar(
        [x[i] for i in drawn],
        [y[i] for i in drawn],
        **{"yerr" if vertical else "xerr": [lower, upper]},
        fmt="none",
        ecolor=color,
        elinewidth=1.3,
        capsize=4,
        label=name,
        zorder=2,
    )
    return [(container, name)]


def _diagonal(
    ax, low: float, high: float, band: float
) -> list[tuple[object, str]]:
    """estimate = measured and the band around it, over [low, high]."""
    ends = [low, high]
    (diagonal,) = ax.plot(ends, ends, color="black", linewidth=1, zorder=1)
    for factor in (1 - band, 1 + band):
        (edge,) = ax.plot(
            ends,
            [factor * low, factor * high],
            color="0.35",
            linestyle=":",
            linewidth=1.2,
            zorder=1,
        )
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_box_aspect(1)  # Square: the diagonal at 45 degrees.
    return [(diagonal, "estimate = measured"), (edge, f"\u00b1{100 * band:g}%")]


# Up to this many points are named on the chart; more are numbered.
_NAMED_POINTS = 12
_KEY_COLUMNS = 3


def _square_limits(
    x: Sequence[float], y: Sequence[float], given: Mapping[str, Any]
) -> tuple[float, float, bool]:
    """(low, high, log) shared by both axes, holding every finite value."""
    values = [*x, *y, *(given["parallel"] or ())]
    for name in ("estimated_ranges", "measured_ranges"):
        values += [v for r in given[name] or () if r for v in r]
    values = [v for v in values if math.isfinite(v) and v > 0]
    if not values:
        return 0.0, 1.0, False
    lo, hi = min(values), max(values)
    if hi / lo > 4:
        return lo / 1.3, hi * 1.3, True
    return 0.0, hi * 1.1, False


def _log_axes(ax) -> None:
    """Logarithmic axes ticked 1, 2, 5, 10, 20, ... in plain numbers."""
    from matplotlib import ticker

    plain = ticker.FuncFormatter(lambda v, _: f"{v:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(ticker.NullFormatter())


def _key(ax, labels: Sequence[str], drawn: Sequence[bool], font: float) -> None:
    """Numbers and names of the points, in columns, on an empty axes."""
    ax.set_axis_off()
    rows = -(-len(labels) // _KEY_COLUMNS)
    for i, label in enumerate(labels):
        column, row = divmod(i, rows)
        ax.text(
            column / _KEY_COLUMNS,
            1 - (row + 0.5) / rows,
            f"{i + 1}  {label}" + ("" if drawn[i] else " (not drawn)"),
            transform=ax.transAxes,
            va="center",
            fontsize=font,
        )
