"""Flags of how bricks and models are timed (run, bench, measure).

`options()` turns them into `TimingOptions` of whole models and of bricks
(`dlbricks_tf.measuring.sampling.model_and_brick_options`). The accuracy
benchmarks take the same flags (`benchmarks.sampling_flags`).
"""

from __future__ import annotations

from absl import flags

from dlbricks_tf.measuring import reference, sampling

PRECISION = flags.DEFINE_float(
    "precision",
    0.02,
    "Stop sampling once the median's 95% CI is within this fraction.",
    lower_bound=0.0,
    upper_bound=1.0,
)
MIN_SAMPLES = flags.DEFINE_integer(
    "min_samples",
    10,
    "Samples per whole model, at least (bricks: --brick_min_samples).",
    lower_bound=1,
)
MAX_SAMPLES = flags.DEFINE_integer(
    "max_samples", 100, "Samples per brick or model, at most.", lower_bound=1
)
MAX_SECONDS = flags.DEFINE_float(
    "max_seconds",
    5.0,
    "Sampling time per brick or model, at most (s).",
    lower_bound=0.0,
)
BRICK_MIN_SAMPLES = flags.DEFINE_integer(
    "brick_min_samples",
    sampling.BRICK_MIN_SAMPLES,
    "Samples per brick, at least (in a chain: passes over it) before its "
    "models' precision is judged; whole models take --min_samples.",
    lower_bound=2,
)
BRICK_MAX_SAMPLES = flags.DEFINE_integer(
    "brick_max_samples",
    60,
    "Samples per brick, at most, with --protocol=loop: a brick that has "
    "not settled by then is stored flagged noisy. Chains take "
    "--max_samples.",
    lower_bound=1,
)
BRICK_MAX_SECONDS = flags.DEFINE_float(
    "brick_max_seconds",
    1.0,
    "Sampling time per brick, at most (s), with --protocol=loop. Chains "
    "take --max_seconds per chain.",
    lower_bound=0.0,
)
PROTOCOL = flags.DEFINE_enum(
    "protocol",
    "chain",
    ["chain", "loop"],
    "How bricks are timed: 'chain' runs up to --chain_links bricks in one "
    "traced function, timed link by link, until every model's estimate is "
    "known to --precision (on ONNX Runtime: in one merged graph, timed "
    "whole and split among its bricks by ORT's profiler); 'loop' gives "
    "each brick its own traced loop or ORT session, timed to --precision "
    "itself. Results of the two are stored apart. --jit_compile always "
    "uses 'loop'.",
)
CHAIN_LINKS = flags.DEFINE_integer(
    "chain_links",
    128,
    "Bricks in one chain, at most (--protocol=chain): more bricks share "
    "one trace; fewer bound the memory of a chain.",
    lower_bound=1,
)
CHAIN_ORDER = flags.DEFINE_enum(
    "chain_order",
    "model",
    ["model", "shuffled"],
    "Order of the bricks in chains: as the models run them, or shuffled "
    "(seeded).",
)
KEEP_PACE = flags.DEFINE_bool(
    "keep_pace",
    False,
    "Chains sampled beside their whole model keep sampling (to their caps) "
    "until the model's own timing is done, so that both cover the same "
    "rounds of a noisy machine (--protocol=chain). Off: a chain stops as "
    "soon as its bricks are precise. Beside a neighbour it cost 1.3-1.5x "
    "the campaign for about one model in 13 more within +-10% "
    "(docs/measuring.md).",
)
TARGET_MS = flags.DEFINE_float(
    "target_sample_ms",
    1.0,
    "Duration of one sample (K calls in one graph), ms.",
    lower_bound=0.01,
)
SAMPLES_PER_CALL = flags.DEFINE_integer(
    "samples_per_call",
    20,
    "Samples one call of a traced timing loop takes (whole models; bricks "
    "with --protocol=loop), at most; fewer when they would last over 40 "
    "ms, so that interleaved timers take turns.",
    lower_bound=1,
)
ABSOLUTE_MS = flags.DEFINE_float(
    "absolute_precision_ms",
    0.001,
    "Also stop sampling once the median's 95% CI half-width is within "
    "this many ms (a tiny brick need not be known to --precision).",
    lower_bound=0.0,
)
WEIGHT_COPIES = flags.DEFINE_integer(
    "weight_copies",
    1,
    "Fresh copies of each brick the timing loop rotates through "
    "(--protocol=loop; in a chain every brick runs once per iteration).",
    lower_bound=1,
)
INPUT_COPIES = flags.DEFINE_integer(
    "input_copies",
    1,
    "Random inputs each brick's timing loop rotates through, so a call "
    "does not find its input left in cache by the previous one (inside a "
    "whole model it was just written by another layer). --protocol=loop; "
    "a chain writes each brick's input afresh before its link.",
    lower_bound=1,
)

REFERENCE = flags.DEFINE_bool(
    "reference",
    True,
    "Read a fixed reference workload (compute- and memory-bound) right "
    "before the batches of samples (at most every 0.5 s) and scale them "
    "to this machine's reference state, kept in --db: a slowdown of the "
    "host that hits a sample and its reference alike cancels, so timings "
    "taken in other processes, minutes or days apart, share one scale "
    "(docs/measuring.md). --noreference stores raw times.",
)

flags.register_multi_flags_validator(
    ["min_samples", "max_samples"],
    lambda f: f["min_samples"] <= f["max_samples"],
    message="--min_samples must not exceed --max_samples.",
)


def options(protocol: str | None = None):
    """(options of whole models, options of bricks) from the flags.

    Args:
        protocol: How bricks are timed, "chain" or "loop" (None:
            --protocol).
    """

    return sampling.model_and_brick_options(
        protocol or PROTOCOL.value,
        precision=PRECISION.value,
        absolute_precision_ms=ABSOLUTE_MS.value,
        min_samples=MIN_SAMPLES.value,
        max_samples=MAX_SAMPLES.value,
        max_seconds=MAX_SECONDS.value,
        target_sample_ms=TARGET_MS.value,
        samples_per_call=SAMPLES_PER_CALL.value,
        weight_copies=WEIGHT_COPIES.value,
        input_copies=INPUT_COPIES.value,
        chain_links=CHAIN_LINKS.value,
        chain_order=CHAIN_ORDER.value,
        keep_pace=KEEP_PACE.value,
        brick_max_samples=BRICK_MAX_SAMPLES.value,
        brick_max_seconds=BRICK_MAX_SECONDS.value,
        brick_min_samples=BRICK_MIN_SAMPLES.value,
    )


def reference_scale(store, settings, fingerprint):
    """The reference scale of --reference (None without it)."""
    if not REFERENCE.value:
        return None

    return reference.ReferenceScale.for_store(
        reference.Reference(), store, settings, fingerprint
    )
