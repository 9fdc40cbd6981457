"""Flags of what is cut: --models and G (--granularity).

Apart from `shared_flags` so that the benchmark scripts can take these
two without the command line's files, suite and backend flags.
"""

from __future__ import annotations

from absl import app, flags

MODELS = flags.DEFINE_list(
    "models",
    None,
    "Comma list of keras.applications names or .keras/.h5/.json model "
    "files. Without it, dlbricks commands take "
    "dlbricks_tf.running.job.DEFAULT_MODELS (MobileNetV2, ResNet50, "
    "EfficientNetB0; analyze: the 40 keras.applications).",
)
GRANULARITY = flags.DEFINE_list(
    "granularity",
    ["1"],
    "G, the most layer calls per brick: one value or a comma list (a sweep).",
)


def granularities(values: list[str] | None = None) -> list[int]:
    """--granularity as integers (or `values`, a list of strings)."""
    return [int(v) for v in (GRANULARITY.value if values is None else values)]


def one_granularity() -> int:
    """The one G of --granularity; app.UsageError if it lists several."""
    gs = granularities()
    if len(gs) > 1:
        raise app.UsageError(
            "--granularity takes one G here, not a sweep. Received: "
            + ",".join(map(str, gs))
        )
    return gs[0]


def _valid_granularity(values: list[str]) -> bool:
    try:
        return bool(values) and all(g >= 1 for g in granularities(values))
    except ValueError:
        return False


flags.register_validator(
    "granularity",
    _valid_granularity,
    message="--granularity must be integers of 1 or more, e.g. 1 or 1,2,3.",
)
