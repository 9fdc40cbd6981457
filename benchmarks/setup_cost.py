r"""Where a brick campaign's setup goes, per unique brick.

The setup of a campaign is what no sampling cap shortens: building each
brick (a `BrickProgram` on its model's own layers, as `run` does, or on
fresh layers from its configs with --nolive_layers, as `bench --models`
does), its synthetic inputs, the memory check, tracing its chain
(`dlbricks_tf.measuring.chain`), and the chain's first call (grappler,
instantiation, oneDNN primitives) and warm-up call.
This script runs `dlbricks_tf.measuring.campaign.time_chains` on the unique
bricks of the given models, with three samples per chain, and prints the
seconds of each part per unique brick (wall-clock, this process alone).
Chains are prepared two at a time (`chain.prepare_together`): a chain's
first call runs on a worker thread while the next one is traced, so
those two parts overlap, and the parts can add up to more than the whole.

--models, --granularity (one G) and --intra_op_threads (1 by default
here) are the command line's flags.

Usage:
    python -m benchmarks.setup_cost --models=MobileNetV2,EfficientNetB0 \
        --granularity=1 --intra_op_threads=1
"""

from __future__ import annotations

import collections
import contextlib
import functools
import threading
import time

from absl import app, flags

from dlbricks_tf.cli import model_flags, settings_flags
from dlbricks_tf.machine import process as process_lib

# Shown by --helpshort.
for _name in ("models", "granularity", "intra_op_threads"):
    flags.declare_key_flag(_name)

_BARE = flags.DEFINE_bool(
    "bare",
    False,
    "Trace and first-call the bricks without the chain's link harness "
    "(no stamps, slices or feeding): the floor of their setup.",
)
# The parts of a campaign's setup the table prints, in order.
PARTS = (
    "build",
    "synthetic inputs",
    "memory check",
    "trace",
    "first call",
    "warm-up calls",
)
_LIVE = flags.DEFINE_bool(
    "live_layers",
    True,
    "Build bricks on their model's own layers, as `run` does (False: "
    "fresh layers from the configs, as `bench --models` does).",
)


_LOCK = threading.Lock()


@contextlib.contextmanager
def _timed(owner, name: str, seconds: collections.Counter, part: str):
    """Adds the wall-clock of every call of owner.name to seconds[part]."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            with _LOCK:  # First calls run on a worker thread.
                seconds[part] += time.perf_counter() - start

    setattr(owner, name, wrapper)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _summed(group, specs):
    """f(inputs): every brick of `group` on its own inputs, outputs summed."""
    import tensorflow as tf

    def run(inputs):
        flat = iter(inputs)
        sums = []
        for model, sp in zip(group, specs, strict=True):
            x = [next(flat) for _ in sp]
            y = model(x[0] if len(x) == 1 else x, training=False)
            sums += [
                tf.reduce_sum(tf.cast(v, tf.float32))
                for v in tf.nest.flatten(y)
            ]
        return tf.add_n(sums)

    return run


def _bare(bricks, sources, program, synthetic, g, intra) -> None:
    """Traces and first-calls the bricks without the chain's harness.

    The bricks go as a chain would hold them (at most `chain_links` a
    function), each on placeholders of its own, with no stamp, slice or
    fed input between them; each output is summed
    into the result so that nothing is pruned. What is left is the cost
    of the bricks' own ops: the floor of tracing them in Python.
    """
    import tensorflow as tf

    from dlbricks_tf.measuring.sampling import TimingOptions

    built = [
        (key, program.program(b, 1, sources[key])) for key, b in bricks.items()
    ]
    links = TimingOptions().chain_links
    seconds: collections.Counter = collections.Counter()
    for first in range(0, len(built), links):
        group = [m for _, m in built[first : first + links]]
        specs = [synthetic.input_specs(m, 1) for m in group]
        signature = [
            tf.TensorSpec(shape, dtype) for sp in specs for shape, dtype in sp
        ]

        function = tf.function(
            _summed(group, specs), input_signature=[signature], autograph=False
        )
        values = [tf.zeros(t.shape, t.dtype) for t in signature]
        with process_lib.collector_paused():  # As a chain's.
            start = time.perf_counter()
            concrete = function.get_concrete_function()
            seconds["trace"] += time.perf_counter() - start
            start = time.perf_counter()
            concrete(values)
            seconds["first call"] += time.perf_counter() - start
    n = len(built)
    print(
        f"{n} unique bricks of {', '.join(model_flags.MODELS.value)} at "
        f"G={g}, {intra} intra-op thread(s), traced bare (no link harness)\n"
    )
    print("| part | ms per unique brick |")
    print("|---|---:|")
    for part in ("trace", "first call"):
        print(f"| {part} | {1e3 * seconds[part] / n:.1f} |")


def main(argv: list[str]) -> None:
    del argv
    g = model_flags.one_granularity()
    intra = settings_flags.INTRA.value
    from dlbricks_tf.machine import settings as settings_lib

    settings = settings_lib.RunSettings(
        batch_size=1, intra_op_threads=intra, inter_op_threads=1
    )
    process_lib.configure_threads(intra, 1)

    from dlbricks_tf.cutting import program, synthetic
    from dlbricks_tf.cutting.decompose import decompose
    from dlbricks_tf.measuring import campaign, chain, memory
    from dlbricks_tf.measuring.timing import TimingOptions
    from dlbricks_tf.models import corpus

    bricks, sources = {}, {}
    for name in model_flags.MODELS.value:
        model = corpus.application(name)
        for b in decompose(model, g).bricks:
            bricks.setdefault(b.signature, b)
            sources.setdefault(b.signature, model if _LIVE.value else None)
        del model
    if _BARE.value:
        _bare(bricks, sources, program, synthetic, g, intra)
        return
    seconds: collections.Counter = collections.Counter()
    with contextlib.ExitStack() as stack:
        for owner, name, part in [
            # `program` builds a keras.Model itself where it must.
            (program, "program", "build"),
            (memory, "check", "memory check"),
            (synthetic, "synthetic_inputs", "synthetic inputs"),
            # A chain prepared beside another (`chain.prepare_together`)
            # has its first call on a worker thread while the next chain
            # is traced: those two parts overlap in time.
            (chain.ChainTimer, "trace", "trace"),
            (chain.ChainTimer, "instantiate", "first call"),
            (chain.ChainTimer, "warm", "warm-up calls"),
        ]:
            stack.enter_context(_timed(owner, name, seconds, part))
        chained = [  # After the patches: each build is timed. As `run`
            # and `bench --models` do: a program, on the model's own layers
            # or on fresh ones.
            campaign.ChainedBrick(
                key, functools.partial(program.program, b, 1, sources[key])
            )
            for key, b in bricks.items()
        ]
        start = time.perf_counter()
        summary = campaign.time_chains(
            chained,
            settings,
            TimingOptions(min_samples=3, max_samples=3),
            check_settings=False,
        )
        total = time.perf_counter() - start
    n = len(chained)
    print(
        f"{n} unique bricks of {', '.join(model_flags.MODELS.value)} at "
        f"G={g}, {intra} intra-op thread(s), {summary.chains} chain(s)\n"
    )
    print("| part | ms per unique brick |")
    print("|---|---:|")
    for part in PARTS:
        print(f"| {part} | {1e3 * seconds[part] / n:.1f} |")
    sampling = summary.sampling_s
    print(f"| (sampling, 3 samples) | {1e3 * sampling / n:.1f} |")
    print(f"| all of time_chains | {1e3 * total / n:.1f} |")


if __name__ == "__main__":
    flags.FLAGS.set_default(
        "models", ["MobileNetV2", "ResNet50", "EfficientNetB0"]
    )
    flags.FLAGS.set_default("intra_op_threads", 1)
    app.run(main)
