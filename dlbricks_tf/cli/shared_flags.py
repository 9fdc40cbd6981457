"""Flags that several commands share: how models are read and cut, files.

What a flag means for one command only is defined in that command's
module; the timing flags are in `timing_flags`, the limits on files read
in `limit_flags`. --models and --granularity are defined in `model_flags`,
the batch size and thread pools in `settings_flags` (the benchmark scripts
take those without this module's other flags); they are readable here too.
"""

from __future__ import annotations

from absl import app, flags

from dlbricks_tf.cli.model_flags import GRANULARITY as GRANULARITY
from dlbricks_tf.cli.model_flags import MODELS as MODELS
from dlbricks_tf.cli.model_flags import granularities as granularities
from dlbricks_tf.cli.settings_flags import BATCH as BATCH
from dlbricks_tf.cli.settings_flags import INTER as INTER
from dlbricks_tf.cli.settings_flags import INTRA as INTRA

FUSE = flags.DEFINE_bool(
    "fuse",
    False,
    "Cut models into fusion units: a convolution or dense layer stays with "
    "the BatchNormalization and activation TensorFlow fuses into it, and G "
    "counts such units. Bench and estimate with the same value.",
)
OUT = flags.DEFINE_string(
    "out", "dlbricks_out", "Output folder (store, report.json, TensorBoard)."
)
DB = flags.DEFINE_string(
    "db", None, "SQLite store of timings (default: <out>/store.sqlite)."
)
LOGDIR = flags.DEFINE_string(
    "logdir", None, "TensorBoard log folder (default: <out>/tensorboard)."
)
MODE = flags.DEFINE_enum(
    "mode",
    "sequential",
    ["sequential", "parallel"],
    "estimate: sum of all bricks, or longest path through the brick DAG.",
)
IMPORT = flags.DEFINE_multi_string(
    "import",
    [],
    "Python module to import before any model is read, e.g. "
    "--import=mypkg.layers (repeat the flag for several), so that the "
    "layers it registers with @keras.saving.register_keras_serializable "
    "load from .keras, .h5 and .json files. This RUNS THAT MODULE'S CODE: "
    "name only modules you trust. Searched on PYTHONPATH, then in the "
    "working folder.",
)
INPUT_SHAPE = flags.DEFINE_multi_string(
    "input_shape",
    [],
    "NAME:DIMS, the shape (batch left out) of a model input whose "
    "dimensions are open, e.g. --input_shape=token_ids:128 (repeatable); "
    "NAME * stands for every input not named: --input_shape=*:128 sets a "
    "transformer's sequence length. For every command but analyze: models "
    "are cut, and run and measure time them, at these shapes. The shape is "
    "part of every brick's signature and of each model's name in reports "
    "and the store (bert@128).",
)
UNSAFE = flags.DEFINE_bool(
    "unsafe_deserialization",
    False,
    "Allow Lambda layers from model files (runs code from the file).",
)
SUITE = flags.DEFINE_string(
    "suite",
    None,
    "Suite folder of unique bricks: export writes it (default: "
    "<out>/suite). It holds no model name or weight: it can be shared.",
)
RECIPE = flags.DEFINE_list(
    "recipe",
    None,
    "estimate: comma list of recipe files written by export, estimated "
    "instead of --models (no model is read).",
)
BACKEND = flags.DEFINE_enum(
    "backend",
    "tf",
    ["tf", "onnxruntime"],
    "Backend that times: TensorFlow (tf) or ONNX Runtime (onnxruntime, "
    "each brick and model converted to ONNX under --out/onnx, bricks once "
    "per signature); run, measure and bench time on it (bench --suite runs "
    "the suite's SavedModels or ONNX files), estimate and report read the "
    "results timed with it.",
)


def input_shapes() -> dict[str, tuple[int, ...]] | None:
    """--input_shape as {name: shape}; app.UsageError if malformed."""
    shapes = {}
    for value in INPUT_SHAPE.value:
        name, _, dims = value.partition(":")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        except ValueError:
            shape = ()
        if not name or not shape or min(shape) < 1:
            raise app.UsageError(
                f"--input_shape takes NAME:DIMS, e.g. token_ids:128 or "
                f"image:224,224,3 (positive sizes). Received: {value!r}"
            )
        shapes[name] = shape
    return shapes or None


def decompose(source, granularity: int, safe_mode: bool):
    """Decomposes a model source as the flags say (--fuse; --input_shape
    is the source's own, see `job.resolve_models`)."""
    return source.decompose(granularity, safe_mode, FUSE.value)
