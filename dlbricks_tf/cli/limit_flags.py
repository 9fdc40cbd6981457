"""Flags of the limits on files from someone else (`dlbricks_tf.limits`).

The defaults are far above the largest keras.applications configs.
"""

from __future__ import annotations

from absl import flags

from dlbricks_tf import limits

MAX_FILE_MB = flags.DEFINE_integer(
    "max_file_mb",
    64,
    "Largest JSON document read from a file: a model config (.json, a "
    ".keras archive's config.json, an .h5 file's model_config), a suite's "
    "manifest, a recipe (MiB).",
    lower_bound=1,
)
MAX_MEMBER_MB = flags.DEFINE_integer(
    "max_member_mb",
    16384,
    "Largest uncompressed member of a .keras archive, checked before it "
    "is inflated (MiB).",
    lower_bound=1,
)
MAX_JSON_DEPTH = flags.DEFINE_integer(
    "max_json_depth",
    100,
    "Deepest nesting of JSON arrays and objects read from a file.",
    lower_bound=1,
)
MAX_LAYERS = flags.DEFINE_integer(
    "max_layers",
    100_000,
    "Most layers a model file may hold, nested models included.",
    lower_bound=1,
)
MAX_BRICKS = flags.DEFINE_integer(
    "max_bricks",
    100_000,
    "Most bricks a suite manifest or a recipe may list.",
    lower_bound=1,
)


def set_limits() -> None:
    """Puts the limits of the flags in force for this process."""

    limits.set_limits(
        limits.Limits(
            file_bytes=MAX_FILE_MB.value * limits.MIB,
            member_bytes=MAX_MEMBER_MB.value * limits.MIB,
            json_depth=MAX_JSON_DEPTH.value,
            layers=MAX_LAYERS.value,
            bricks=MAX_BRICKS.value,
        )
    )
