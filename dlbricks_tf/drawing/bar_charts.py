"""PNG bar charts of corpus figures: plain, grouped or stacked.

A plain bar may carry a range (an error bar) and sit between band lines
(e.g. the +-10% around 1.0). Every chart function returns the bytes of a
PNG; `bar_figure` returns the matplotlib figure instead, whose artists hold
the plotted numbers (`charts.to_png` draws it). Sizes and fonts as in
`dlbricks_tf.drawing.charts`.

Example:
    png = bar_chart(["ResNet50", "VGG16"], [26.7, 40.5], title="% unique")
    Path("unique.png").write_bytes(png)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from dlbricks_tf.drawing.charts import (
    DPI,
    LABEL_FONT,
    error_offsets,
    new_figure,
    palette,
    to_png,
)


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
    dpi: int = DPI,
    font: float = LABEL_FONT,
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
    dpi: int = DPI,
    font: float = LABEL_FONT,
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
    dpi: int = DPI,
    font: float = LABEL_FONT,
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
    dpi: int = DPI,
    font: float = LABEL_FONT,
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
    dpi: int = DPI,
    font: float = LABEL_FONT,
):
    """`bar_panels`' matplotlib figure, before it is drawn to a PNG."""
    if not panels:
        raise ValueError("bar_panels needs at least one panel.")
    size = size or _bars_size(panels, horizontal, font)
    fig = new_figure(size, dpi)
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
    panels: Sequence[Bars], width: float, font: float = LABEL_FONT
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
    panels: Sequence[Bars], horizontal: bool, font: float = LABEL_FONT
) -> tuple[float, float]:
    slots = max(
        len(p.labels) * (1 if p.stacked else max(1, len(p.series)))
        for p in panels
    )
    groups = max(len(p.labels) for p in panels)
    # The room a label needs grows with its type.
    scale = max(1.0, font / LABEL_FONT)
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
    colors = palette(len(bars.series))
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
    drawn, lower, upper = error_offsets(values, bars.errors)
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
