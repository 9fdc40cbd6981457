"""What the chart tests read back of a chart: its pixels, its error bars."""

import io

import matplotlib.image
import numpy as np
from matplotlib.container import ErrorbarContainer


def decode(png: bytes) -> np.ndarray:
    """The pixels of a PNG chart."""
    return matplotlib.image.imread(io.BytesIO(png), format="png")


def error_segments(ax) -> dict[str, np.ndarray]:
    """{label: [((x0, y0), (x1, y1)), ...]} of the error bars drawn."""
    found = {}
    for container in ax.containers:
        if isinstance(container, ErrorbarContainer):
            (segments,) = container.lines[2]
            found[container.get_label()] = np.asarray(segments.get_segments())
    return found
