"""PNG charts of corpus figures: bars (plain, grouped, stacked), heatmaps.

Every function returns the bytes of a PNG. Figures are drawn on
matplotlib's Agg canvas directly (`matplotlib.figure.Figure` with
`FigureCanvasAgg`), never through `pyplot`: no global backend is switched,
no window opens, and nothing happens at import (matplotlib itself is
imported on first use). Sizes grow with the number of labels so that a
40-model corpus stays readable; pass `size` (inches) to fix them, and the
PNG is then exactly `size * dpi` pixels.

Example:
    png = bar_chart(["ResNet50", "VGG16"], [26.7, 40.5], title="% unique")
    Path("unique.png").write_bytes(png)
"""

from __future__ import annotations

import dataclasses
import io
import struct
from collections.abc import Mapping, Sequence

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
        annotations: A text per label written at the bar's end.
    """

    labels: tuple[str, ...]
    series: tuple[tuple[str, tuple[float, ...]], ...]
    title: str = ""
    value_label: str = ""
    stacked: bool = False
    reference: float | None = None
    reference_label: str = ""
    annotations: tuple[str, ...] | None = None

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
    **panel: object,
) -> bytes:
    """One bar per label; `panel` takes the other `Bars` fields."""
    name = str(panel.pop("value_label", ""))
    bars = Bars(
        tuple(labels), _series({name: values}), value_label=name, **panel
    )
    return bar_panels([bars], horizontal=horizontal, size=size, dpi=dpi)


def grouped_bar_chart(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    horizontal: bool = True,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
    **panel: object,
) -> bytes:
    """A group of bars per label, one bar per series, with a legend."""
    bars = Bars(tuple(labels), _series(series), **panel)
    return bar_panels([bars], horizontal=horizontal, size=size, dpi=dpi)


def stacked_bar_chart(
    labels: Sequence[str],
    series: Mapping[str, Sequence[float]],
    *,
    horizontal: bool = True,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
    **panel: object,
) -> bytes:
    """A stack per label, one segment per series, with a legend."""
    bars = Bars(tuple(labels), _series(series), stacked=True, **panel)
    return bar_panels([bars], horizontal=horizontal, size=size, dpi=dpi)


def bar_panels(
    panels: Sequence[Bars],
    *,
    horizontal: bool = True,
    size: tuple[float, float] | None = None,
    dpi: int = _DPI,
) -> bytes:
    """Panels of bars side by side, one shared legend on top.

    Args:
        panels: The panels, left to right.
        horizontal: Bars along x with labels on y (readable for many
            labels), or vertical bars with labels on x.
        size: Figure (width, height) in inches; None sizes it to the
            labels.
        dpi: Pixels per inch.

    Returns:
        The PNG bytes.
    """
    if not panels:
        raise ValueError("bar_panels needs at least one panel.")
    size = size or _bars_size(panels, horizontal)
    fig = _figure(size, dpi)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    legend: dict[str, object] = {}
    for ax, bars in zip(axes, panels, strict=True):
        _draw_bars(ax, bars, horizontal, legend)
    columns, _ = _legend_shape(panels, size[0])
    if columns:
        fig.legend(
            list(legend.values()),
            list(legend),
            loc="outside upper center",
            ncols=columns,
            fontsize=_LABEL_FONT,
            frameon=False,
        )
    return _png(fig)


def _legend_shape(panels: Sequence[Bars], width: float) -> tuple[int, int]:
    """(columns, rows) of the legend that fits `width` inches; (0, 0): none."""
    names = {n for p in panels for n, _ in p.series}
    names |= {p.reference_label for p in panels if p.reference_label}
    if len(names) < 2 and not any(p.reference_label for p in panels):
        return 0, 0
    # An 8-point character is about 0.075 inch; the handle and gap 0.6.
    column = 0.6 + 0.075 * max(len(n) for n in names)
    columns = max(1, min(len(names), int((width - 0.2) // column)))
    return columns, -(-len(names) // columns)


def _bars_size(panels: Sequence[Bars], horizontal: bool) -> tuple[float, float]:
    slots = max(
        len(p.labels) * (1 if p.stacked else max(1, len(p.series)))
        for p in panels
    )
    groups = max(len(p.labels) for p in panels)
    if horizontal:
        length = max(2.0, 0.18 * slots + 0.1 * groups)
        width, height = 3.5 + 4.0 * len(panels), length + 1.4
    else:
        length = max(2.5, 0.3 * slots + 0.15 * groups)
        width, height = 1.0 + length * len(panels), 4.5
    _, rows = _legend_shape(panels, width)
    return width, height + 0.2 * rows


def _draw_bars(ax, bars: Bars, horizontal: bool, legend: dict) -> None:
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
    if bars.annotations is not None and last is not None:
        ax.bar_label(last, labels=list(bars.annotations), fontsize=7, padding=2)
        ax.margins(**{"x" if horizontal else "y": 0.15})
    if bars.reference is not None:
        line = (ax.axvline if horizontal else ax.axhline)(
            bars.reference, color="black", linestyle="--", linewidth=1
        )
        if bars.reference_label:
            legend.setdefault(bars.reference_label, line)
    label_axis = ax.yaxis if horizontal else ax.xaxis
    label_axis.set_ticks(positions)
    label_axis.set_ticklabels(list(bars.labels), fontsize=_LABEL_FONT)
    if horizontal:
        ax.set_ylim(n - 0.5, -0.5)  # First label on top.
        ax.set_xlabel(bars.value_label, fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    else:
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_ylabel(bars.value_label, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        if n > 8 or max((len(s) for s in bars.labels), default=0) > 6:
            ax.tick_params(axis="x", labelrotation=90)
    ax.tick_params(axis="both", labelsize=_LABEL_FONT)
    ax.set_axisbelow(True)
    ax.set_title(bars.title, fontsize=10)


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
    return _png(fig)


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


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    # No bbox_inches="tight": the PNG keeps the size asked for.
    fig.savefig(buffer, format="png", dpi=fig.dpi)
    return buffer.getvalue()
