"""PNG charts: the canvas every chart is drawn on, and heatmaps.

Figures are drawn on matplotlib's Agg canvas directly
(`matplotlib.figure.Figure` with `FigureCanvasAgg`), never through
`pyplot`: no global backend is switched, no window opens, and nothing
happens at import (matplotlib itself is imported on first use). Sizes
grow with the number of labels so that a 40-model corpus stays readable;
pass `size` (inches) to fix them, and the PNG is then exactly
`size * dpi` pixels. `font` sets the labels' size in points (titles are a
little larger): a chart shown scaled down, as TensorBoard shows an image
in its card, needs larger type than one shown at its size.

Bars are drawn by `dlbricks_tf.drawing.bar_charts`, each model's estimate
against its measurement by `dlbricks_tf.drawing.scatter_charts`; this
module holds what they share (`new_figure`, `palette`, `error_offsets`,
`to_png`) and `heatmap`.

Example:
    png = heatmap(matrix, labels, title="Similarity")
    Path("similarity.png").write_bytes(png)
"""

from __future__ import annotations

import io
import math
import struct
from collections.abc import Sequence

DPI = 100
LABEL_FONT = 8
_PALETTE = "tab10"


def heatmap(
    labels: Sequence[str],
    matrix: Sequence[Sequence[float]],
    *,
    title: str = "",
    colorbar_label: str = "",
    vmin: float = 0.0,
    vmax: float = 1.0,
    size: tuple[float, float] | None = None,
    dpi: int = DPI,
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
    fig = new_figure(size, dpi)
    ax = fig.add_subplot()
    image = ax.imshow(data, vmin=vmin, vmax=vmax, cmap="viridis")
    font = LABEL_FONT if n <= 30 else 7
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


def palette(k: int) -> list:
    """`k` colors of the palette, distinct neighbours first."""
    from matplotlib import colormaps

    if k <= 10:
        return list(colormaps[_PALETTE].colors[:k])
    # tab20 holds pairs of a dark and a light shade: the dark ones first, so
    # neighbours in a stack differ in hue.
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return [colormaps["tab20"](order[i % 20]) for i in range(k)]


def new_figure(size: tuple[float, float], dpi: int):
    """An empty figure on its own Agg canvas (no pyplot)."""
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


def error_offsets(
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
