"""Flags of corpus, batch, threads and sampling, shared by the accuracy
benchmarks.

`benchmarks.accuracy` (TensorFlow) and `benchmarks.ort_accuracy` (ONNX
Runtime) time the same corpus the same way and take the same flags for it.
"""

from absl import flags

from dlbricks_tf import corpus

# One model per family (corpus.FAMILIES); --all for the 40.
MODELS = flags.DEFINE_list(
    "models", list(corpus.FAMILIES), "keras.applications model names."
)
ALL = flags.DEFINE_bool(
    "all", False, "Use all keras.applications models (overrides --models)."
)

BATCH = flags.DEFINE_integer("batch_size", 1, "Batch size.", lower_bound=1)
INTRA = flags.DEFINE_integer(
    "intra_op_threads", None, "Intra-op threads (default: physical cores).",
    lower_bound=1,
)  # fmt: skip
INTER = flags.DEFINE_integer(
    "inter_op_threads", 1, "Inter-op threads.", lower_bound=1
)
PRECISION = flags.DEFINE_float(
    "precision", 0.02, "Relative CI half-width to stop at.", lower_bound=0
)
MAX_SECONDS = flags.DEFINE_float(
    "max_seconds", 5.0, "Sampling cap per whole model (and per chain), seconds."
)
MAX_SAMPLES = flags.DEFINE_integer(
    "max_samples",
    100,
    "Sampling cap per whole model (and per chain).",
    lower_bound=1,
)
TARGET_MS = flags.DEFINE_float(
    "target_sample_ms", 1.0, "Duration of one sample (K calls), ms."
)
SAMPLES_PER_CALL = flags.DEFINE_integer(
    "samples_per_call", 20, "Samples timed in-graph per call.", lower_bound=1
)
BRICK_MAX_SAMPLES = flags.DEFINE_integer(
    "brick_max_samples",
    60,
    "Sampling cap per brick (a brick that never settles is flagged noisy).",
    lower_bound=1,
)
BRICK_MAX_SECONDS = flags.DEFINE_float(
    "brick_max_seconds", 1.0, "Sampling cap per brick, seconds."
)
COPIES = flags.DEFINE_integer(
    "input_copies",
    1,
    "Input copies the loop rotates through, bricks only: inside a whole "
    "model a brick's input was just written by another layer, not left "
    "in cache by the brick's previous call.",
    lower_bound=1,
)
WEIGHT_COPIES = flags.DEFINE_integer(
    "weight_copies",
    1,
    "Fresh copies of each brick the loop rotates through (cold weights).",
    lower_bound=1,
)
ABSOLUTE_MS = flags.DEFINE_float(
    "absolute_precision_ms",
    0.001,
    "Also stop once the median's CI half-width is below this, ms.",
    lower_bound=0,
)


def options(protocol: str, **bricks):
    """(whole-model, brick) `TimingOptions` from these flags.

    Args:
        protocol: How bricks are timed ("chain" or "loop"; ORT: "loop").
        **bricks: Other brick options (chain_links, chain_order).
    """
    from dlbricks_tf.measuring import sampling

    # Copies emulate what a brick sees inside a whole model (its weights
    # and input not left in cache by its previous call): bricks only.
    return sampling.model_and_brick_options(
        protocol,
        precision=PRECISION.value,
        max_samples=MAX_SAMPLES.value,
        max_seconds=MAX_SECONDS.value,
        target_sample_ms=TARGET_MS.value,
        samples_per_call=SAMPLES_PER_CALL.value,
        absolute_precision_ms=ABSOLUTE_MS.value,
        input_copies=COPIES.value,
        weight_copies=WEIGHT_COPIES.value,
        brick_max_samples=BRICK_MAX_SAMPLES.value,
        brick_max_seconds=BRICK_MAX_SECONDS.value,
        **bricks,
    )


def model_names() -> list[str]:
    """The keras.applications models named by --models, or all (--all)."""
    return list(corpus.APPLICATIONS if ALL.value else MODELS.value)
