"""A physical first guess of a brick's latency, from its features.

`cost_ms` prices a brick as a CPU would run it if every kernel reached a
round, typical rate: a constant per layer call, plus the larger of its
arithmetic time (matrix FLOPs, stencil FLOPs and vector FLOPs each at its
own rate) and its memory time (`bytes` at one bandwidth). It is not
fitted: it only needs the right *form*, growing as a brick's work grows,
so that a learnt correction, the ratio latency / cost (a brick's
efficiency), is bounded and carries over to bricks larger than any it was
learnt from (`dlbricks_tf.estimating.predict`, method "efficiency").

The rates are orders of magnitude, not this machine's: a convolution's
or dense layer's products reach about 100 GFLOP/s on a few cores, a
per-channel window (depthwise convolution, pooling) a tenth of that,
elementwise work a few GFLOP/s, memory about 10 GB/s.

Example:
    cost_ms(features.brick_features(brick, graph.specs))
"""

from __future__ import annotations

from collections.abc import Mapping

# Rates, in FLOPs (or bytes) per millisecond.
MATRIX_PER_MS = 100e6
STENCIL_PER_MS = 10e6
VECTOR_PER_MS = 3e6
BYTES_PER_MS = 10e6
# What a layer call costs beyond its work (launching a kernel).
CALL_MS = 0.01


def cost_ms(
    calls: float,
    matrix_flops: float,
    stencil_flops: float,
    vector_flops: float,
    bytes_moved: float,
) -> float:
    """The physical first guess of a brick's latency, ms.

    Args:
        calls: Layer calls of the brick.
        matrix_flops: FLOPs of products across channels (convolutions,
            dense layers).
        stencil_flops: FLOPs of per-channel windows (depthwise
            convolutions, pooling).
        vector_flops: Elementwise and normalization FLOPs.
        bytes_moved: Weights and activations read and written.

    Returns:
        CALL_MS per call plus the larger of the arithmetic and memory
        times; positive whenever the brick has a call.
    """
    arithmetic = (
        matrix_flops / MATRIX_PER_MS
        + stencil_flops / STENCIL_PER_MS
        + vector_flops / VECTOR_PER_MS
    )
    return CALL_MS * calls + max(arithmetic, bytes_moved / BYTES_PER_MS)


def brick_cost_ms(features: Mapping[str, float]) -> float:
    """`cost_ms` of a brick given by `features.brick_features`."""
    return cost_ms(
        features["calls"],
        features["matrix_flops"],
        features["stencil_flops"],
        features["vector_flops"],
        features["bytes"],
    )
