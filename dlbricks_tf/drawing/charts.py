"""PNG charts of corpus figures: bars, heatmaps, measured vs estimated.

Bars come plain, grouped or stacked, and a plain bar may carry a range
(an error bar) and sit between band lines (e.g. the +-10% around 1.0);
`measured_vs_estimated` puts each model's estimate, with its range,
against its measurement, with the measurement's confidence interval.
Every chart function returns the bytes of a PNG; `bar_figure` and
`measured_vs_estimated_figure` return the matplotlib figure instead,
whose artists hold the plotted numbers (`to_png` draws it).

Figures are drawn on matplotlib's Agg canvas directly
(`matplotlib.figure.Figure` with `FigureCanvasAgg`), never through
`pyplot`: no global backend is switched, no window opens, and nothing
happens at import (matplotlib itself is imported on first use). Sizes
grow with the number of labels so that a 40-model corpus stays readable;
pass `size` (inches) to fix them, and the PNG is then exactly
`size * dpi` pixels. `font` sets the labels' size in points (titles are a
little larger): a chart shown scaled down, as TensorBoard shows an image
in its card, needs larger type than one shown at its size.

Example:
    png = bar_chart(["ResNet50", "VGG16"], [26.7, 40.5], title="% unique")
    Path("unique.png").write_bytes(png)
"""

from __future__ import annotations

import dataclasses
import io
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

_DPI = 100
_LABEL_FONT = 8
_PALETTE = "tab10"


@dataclasses.dataclass(frozen=True)
class Bars:
    """One panel of bars: one bar (or one group, or one stack) per label.

    Attributes:
        labels: The category of each bar, e.g. model names.
        series: (name, values) pairs, each with one value per label. One
            series draws plain bars; several draw groups or stacks.
        title: Panel title.
        value_label: Axis title of the values.
        stacked: Stack the series instead of grouping them.
        reference: Draw a line at this value (e.g. 1.0, or a corpus mean).
        reference_label: Legend entry of the reference line.
        annotations: A text per label written at the bar's end (beyond
            its error bar; at 0 for a bar without a value).
        errors: Per label, the (low, high) range of the bar's value, drawn
            as an error bar, or None for a bar without one. Needs exactly
            one series.
        error_label: Legend entry of the error bars.
        band: (low, high) values drawn as two dotted lines, e.g. (0.9,
            1.1) around a reference of 1.0.
        band_label: Legend entry of the band.
    """

    labels: tuple[str, ...]
    series: tuple[tuple[str, tuple[float, ...]], ...]
    title: str = ""
    value_label: str = ""
    stacked: bool = False
    reference: float | None = None
    reference_label: str = ""
    annotations: tuple[str, ...] | None = None
    errors: tuple[tuple[float, float] | None, ...] | None = None
    error_label: str = ""
    band: tuple[float, float] | None = None
    band_label: str = ""

    def __post_init__(self) -> None:
        for name, values in self.series:
            if len(values) != len(self.labels):
                raise ValueError(
                    f"Series {name!r} has {len(values)} values for "
                    f"{len(self.labels)} labels."
                )
        if self.annotations is not None and len(self.annotations) != len(
            self.labels
        ):
            raise ValueError(
                f"{len(self.annotations)} annotations for "
                f"{len(self.labels)} labels."
            )
        if self.errors is not None:
            if len(self.errors) != len(self.labels):
                raise ValueError(
                    f"{len(self.errors)} error ranges for "
                    f"{len(self.labels)} labels."
                )
            if len(self.series) != 1 or self.stacked:
                raise ValueError(
                    "Error ranges need exactly one unstacked series. "
                    f"Received: {len(self.series)} series, "
                    f"stacked={self.stacked}"
                )

    @property
    def legend_names(self) -> list[str]:
        """The panel's legend entries: series, lines and error bars."""
        names = [n for n, _ in self.series]
        extra = (self.reference_label, self.band_label, self.error_label)
        return names + [n for n in extra if n]


def _series(
    series: Mapping[str, Sequence[float]],
) -> tuple[tuple[str, tuple[float, ...]], ...]:
    return tuple((n, tuple(float(v) for v in vs)) for n, vs in series.items())


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    horizontal: bool = True,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
    font: float = _LABEL_FONT,
    **panel: object,
) -> bytes:
    """One bar per label; `panel` takes the other `Bars` fields."""
    name = str(panel.pop("value_label", ""))
    bars = Bars(
        tuple(labels), _series({name: values}), value_label=name, **panel
    )
    return bar_panels(
        [bars], horizontal=horizontal, size=size, dpi=dpi, font=font
    )


def grouped_bar_chart(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    horizontal: bool = True,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
    font: float = _LABEL_FONT,
    **panel: object,
) -> bytes:
    """A group of bars per label, one bar per series, with a legend."""
    bars = Bars(tuple(labels), _series(series), **panel)
    return bar_panels(
        [bars], horizontal=horizontal, size=size, dpi=dpi, font=font
    )


def stacked_bar_chart(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    horizontal: bool = True,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
    font: float = _LABEL_FONT,
    **panel: object,
) -> bytes:
    """A stack per label, one segment per series, with a legend."""
    bars = Bars(tuple(labels), _series(series), stacked=True, **panel)
    return bar_panels(
        [bars], horizontal=horizontal, size=size, dpi=dpi, font=font
    )


def bar_panels(
    panels: Sequence[Bars],
    *,
    horizontal: bool = True,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
    font: float = _LABEL_FONT,
) -> bytes:
    """Panels of bars side by side, one shared legend on top.

    Args:
        panels: The panels, left to right.
        horizontal: Bars along x with labels on y (readable for many
            labels), or vertical bars with labels on x.
        size: Figure (width, height) in inches; None sizes it to the
            labels.
        dpi: Pixels per inch.
        font: Size of the labels in points.

    Returns:
        The PNG bytes.
    """
    return to_png(
        bar_figure(panels, horizontal=horizontal, size=size, dpi=dpi, font=font)
    )


def bar_figure(
    panels: Sequence[Bars],
    *,
    horizontal: bool = True,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
    font: float = _LABEL_FONT,
):
    """`bar_panels`' matplotlib figure, before it is drawn to a PNG."""
    if not panels:
        raise ValueError("bar_panels needs at least one panel.")
    size = size or _bars_size(panels, horizontal, font)
    fig = _figure(size, dpi)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    legend: dict[str, object] = {}
    for ax, bars in zip(axes, panels, strict=True):
        _draw_bars(ax, bars, horizontal, legend, font)
    columns, _ = _legend_shape(panels, size[0], font)
    if columns:
        fig.legend(
            list(legend.values()),
            list(legend),
            loc="outside upper center",
            ncols=columns,
            fontsize=font,
            frameon=False,
        )
    return fig


def _legend_shape(
    panels: Sequence[Bars], width: float, font: float = _LABEL_FONT
) -> tuple[int, int]:
    """(columns, rows) of the legend that fits `width` inches; (0, 0): none."""
    names = {n for p in panels for n in p.legend_names}
    if len(names) < 2 and not any(
        p.reference_label or p.band_label or p.error_label for p in panels
    ):
        return 0, 0
    # An 8-point character is about 0.075 inch; the handle and gap 0.6.
    column = 0.6 + 0.075 * font / 8 * max(len(n) for n in names)
    columns = max(1, min(len(names), int((width - 0.2) // column)))
    return columns, -(-len(names) // columns)


def _bars_size(
    panels: Sequence[Bars], horizontal: bool, font: float = _LABEL_FONT
) -> tuple[float, float]:
    slots = max(
        len(p.labels) * (1 if p.stacked else max(1, len(p.series)))
        for p in panels
    )
    groups = max(len(p.labels) for p in panels)
    # The room a label needs grows with its type.
    scale = max(1.0, font / _LABEL_FONT)
    if horizontal:
        length = max(2.0, (0.18 * slots + 0.1 * groups) * scale)
        width, height = 3.5 + 4.0 * len(panels), length + 1.4 * scale
    else:
        length = max(2.5, (0.3 * slots + 0.15 * groups) * scale)
        width, height = 1.0 + length * len(panels), 4.5 * scale
    _, rows = _legend_shape(panels, width, font)
    return width, height + 0.2 * scale * rows


def _draw_bars(
    ax, bars: Bars, horizontal: bool, legend: dict, font: float
) -> None:
    import numpy as np

    n = len(bars.labels)
    positions = np.arange(n)
    colors = _colors(len(bars.series))
    k = len(bars.series)
    width = 0.8 if bars.stacked or k == 1 else 0.8 / k
    base = np.zeros(n)
    draw = ax.barh if horizontal else ax.bar
    last = None
    for i, (name, values) in enumerate(bars.series):
        offset = 0.0 if bars.stacked or k == 1 else (i - (k - 1) / 2) * width
        extra = (
            {"left" if horizontal else "bottom": base} if bars.stacked else {}
        )
        last = draw(
            positions + offset,
            values,
            width,
            color=colors[i],
            label=name,
            **extra,
        )
        legend.setdefault(name, last)
        if bars.stacked:
            base = base + np.asarray(values)
    ends = None
    if bars.errors is not None:
        ends = _draw_errors(ax, bars, positions, horizontal, legend)
    if bars.annotations is not None and last is not None:
        if ends is None:
            ax.bar_label(
                last,
                labels=list(bars.annotations),
                fontsize=font - 1,
                padding=2,
            )
        else:
            _annotate_ends(
                ax, bars.annotations, positions, ends, horizontal, font
            )
        ax.margins(**{"x" if horizontal else "y": 0.15})
    line = ax.axvline if horizontal else ax.axhline
    if bars.band is not None:
        for value in bars.band:
            band = line(value, color="0.35", linestyle=":", linewidth=1.2)
        if bars.band_label:
            legend.setdefault(bars.band_label, band)
    if bars.reference is not None:
        reference = line(
            bars.reference, color="black", linestyle="--", linewidth=1
        )
        if bars.reference_label:
            legend.setdefault(bars.reference_label, reference)
    label_axis = ax.yaxis if horizontal else ax.xaxis
    label_axis.set_ticks(positions)
    label_axis.set_ticklabels(list(bars.labels), fontsize=font)
    if horizontal:
        ax.set_ylim(n - 0.5, -0.5)  # First label on top.
        ax.set_xlabel(bars.value_label, fontsize=font + 1)
        ax.grid(axis="x", alpha=0.3)
    else:
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_ylabel(bars.value_label, fontsize=font + 1)
        ax.grid(axis="y", alpha=0.3)
        if n > 8 or max((len(s) for s in bars.labels), default=0) > 6:
            ax.tick_params(axis="x", labelrotation=90)
    ax.tick_params(axis="both", labelsize=font)
    ax.set_axisbelow(True)
    ax.set_title(bars.title, fontsize=font + 2)


def _draw_errors(ax, bars: Bars, positions, horizontal: bool, legend: dict):
    """Error bars of the labels with a range; returns each bar's far end."""
    import numpy as np

    values = bars.series[0][1]
    drawn, lower, upper = _offsets(values, bars.errors)
    ends = np.asarray(values, dtype=float).copy()
    for i, hi in zip(drawn, upper, strict=True):
        ends[i] = max(ends[i], values[i] + hi)
    if not drawn:
        return ends
    at, along = positions[drawn], [values[i] for i in drawn]
    container = ax.errorbar(
        *((along, at) if horizontal else (at, along)),
        **{"xerr" if horizontal else "yerr": [lower, upper]},
        fmt="none",
        ecolor="black",
        elinewidth=1.3,
        capsize=4,
        label=bars.error_label or None,
    )
    if bars.error_label:
        legend.setdefault(bars.error_label, container)
    return ends


def _offsets(
    values: Sequence[float],
    ranges: Sequence[tuple[float, float] | None],
) -> tuple[list[int], list[float], list[float]]:
    """(indices, below, above) of the finite ranges around finite values.

    A range that does not hold its value is drawn up to the value (no
    negative offset).
    """
    drawn, lower, upper = [], [], []
    for i, (value, bounds) in enumerate(zip(values, ranges, strict=True)):
        if bounds is None or not all(map(math.isfinite, (value, *bounds))):
            continue
        drawn.append(i)
        lower.append(max(0.0, value - bounds[0]))
        upper.append(max(0.0, bounds[1] - value))
    return drawn, lower, upper


def _annotate_ends(
    ax, texts, positions, ends, horizontal: bool, font: float
) -> None:
    for text, at, end in zip(texts, positions, ends, strict=True):
        if not math.isfinite(end):
            end = 0.0  # No bar: the text says why at its base.
        ax.annotate(
            text,
            (end, at) if horizontal else (at, end),
            xytext=(4, 0) if horizontal else (0, 4),
            textcoords="offset points",
            ha="left" if horizontal else "center",
            va="center" if horizontal else "bottom",
            fontsize=font - 1,
            # Readable where a reference or band line crosses it.
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.5},
        )


def measured_vs_estimated(
    labels: Sequence[str],
    measured: Sequence[float],
    estimated: Sequence[float],
    *,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
    font: float = _LABEL_FONT,
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
    dpi: int = _DPI,
    font: float = _LABEL_FONT,
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
    scale = max(1.0, font / _LABEL_FONT)
    if size is None:
        size = (8.0, 7.0 + 0.2 * scale * key_rows)
    fig = _figure(size, dpi)
    if numbered:
        ax, key = fig.subplots(
            2, 1, height_ratios=[7.0, max(0.4, 0.2 * scale * key_rows)]
        )
    else:
        ax, key = fig.add_subplot(), None
    shown = [math.isfinite(a + b) for a, b in zip(x, y, strict=True)]
    points = ax.scatter(x, y, s=36, color=_colors(1)[0], zorder=3)
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
            *_offsets(y if vertical else x, ranges), strict=True
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


def heatmap(
    labels: Sequence[str],
    matrix: Sequence[Sequence[float]],
    *,
    title: str = "",
    colorbar_label: str = "",
    vmin: float = 0.0,
    vmax: float = 1.0,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
) -> bytes:
    """A square matrix with `labels` on both axes and a colorbar.

    Cells hold their value as text when there are at most 15 labels.

    Raises:
        ValueError: If the matrix is not len(labels) x len(labels).
    """
    import numpy as np

    data = np.asarray(matrix, dtype=float)
    n = len(labels)
    if data.shape != (n, n):
        raise ValueError(
            f"Need a {n}x{n} matrix for {n} labels. Received: {data.shape}"
        )
    if size is None:
        side = max(3.0, 0.24 * n)
        size = (side + 2.8, side + 2.0)
    fig = _figure(size, dpi)
    ax = fig.add_subplot()
    image = ax.imshow(data, vmin=vmin, vmax=vmax, cmap="viridis")
    font = _LABEL_FONT if n <= 30 else 7
    ax.set_xticks(range(n), list(labels), rotation=90, fontsize=font)
    ax.set_yticks(range(n), list(labels), fontsize=font)
    ax.set_title(title, fontsize=11)
    if n <= 15:
        middle = (vmin + vmax) / 2
        for i in range(n):
            for j in range(n):
                ax.text(
                    j,
                    i,
                    f"{data[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="black" if data[i, j] > middle else "white",
                )
    bar = fig.colorbar(image, ax=ax, shrink=0.8)
    bar.set_label(colorbar_label, fontsize=9)
    return to_png(fig)


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) in pixels, read from a PNG's header.

    Raises:
        ValueError: If the bytes are not a PNG.
    """
    if png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        raise ValueError("Not a PNG: the signature or IHDR chunk is missing.")
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def _colors(k: int) -> list:
    from matplotlib import colormaps

    if k <= 10:
        return list(colormaps[_PALETTE].colors[:k])
    # tab20 holds pairs of a dark and a light shade: the dark ones first, so
    # neighbours in a stack differ in hue.
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return [colormaps["tab20"](order[i % 20]) for i in range(k)]


def _figure(size: tuple[float, float], dpi: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def to_png(fig) -> bytes:
    """The PNG of a figure of this module, at its size and dpi."""
    buffer = io.BytesIO()
    # No bbox_inches="tight": the PNG keeps the size asked for.
    fig.savefig(buffer, format="png", dpi=fig.dpi)
    return buffer.getvalue()
