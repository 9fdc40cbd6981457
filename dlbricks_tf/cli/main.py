r"""dlbricks: benchmark Keras models on this CPU from their unique bricks.

Usage: python -m tools.dlbricks [COMMAND] [--flags]   (or: dlbricks ...)

Commands:
  run        (default) the whole job: decompose --models, time the unique
             bricks not yet stored and every model end to end in
             interleaved rounds, estimate, print measured vs estimated
             latency, write the store, report.json and TensorBoard logs
             under --out. With no flags: MobileNetV2, ResNet50 and
             EfficientNetB0 at G=1, 2-4 minutes on two cores. A brick
             that cannot be built or timed is recorded as failed in the
             store, the models using it get no estimate, the rest is
             timed (exit code 1; a rerun tries it again). --budget=SECONDS
             times the bricks that narrow the estimates most within that
             time and predicts the others.
  decompose  print each model's bricks (layers, classes, input shapes,
             signature) and the unique counts.
  bench      time the unique bricks of --models missing from --db, or
             those of an exported --suite folder (no model needed) on
             --backend=tf (SavedModels) or onnxruntime (ONNX files); only
             one shard of them with --shard_index/--num_shards or under
             Bazel sharding, a Slurm array or a Kubernetes Indexed Job.
             A brick that cannot be loaded, built or timed is recorded
             as failed in --db and the rest are timed (exit code 1; a
             rerun tries it again).
  measure    time --models end to end into --db.
  estimate   estimate --models from the brick timings in --db
             (--mode=sequential or parallel); with --recipe=FILE,...
             estimate from recipe files instead, without the models
             (the timings of --backend). --cover covers each model by
             stored bricks of every G up to --granularity; --predict
             predicts the bricks the store lacks (a latency model of
             the store's bricks); each row says how much of its estimate
             came from where.
  export     write the unique bricks of --models at one G to --suite
             (SavedModel, .keras and ONNX each, fresh weights, no names:
             shareable) and one private recipe per model to --recipes.
  merge      copy the results of the store files given as arguments into
             --db: `dlbricks merge --db=all.sqlite a.sqlite b.sqlite`.
  report     print <out>/report.json; with --compare, estimate --models
             (or --recipe files) on every machine and backend in --db,
             name the fastest, and log it to TensorBoard (--logdir).
  analyze    corpus figures (repeatability, layer types, similarity,
             reuse; the trade-off over G when --db has timings) under
             <out>/analysis.

--models takes keras.applications names (weights=None, nothing is
downloaded) and paths of .keras, .h5 or config .json files. --granularity
takes one G or a list (a sweep). --fuse never cuts a convolution or dense
layer from the BatchNormalization and activation TensorFlow fuses into it
(G then counts such units); bench and estimate with the same --fuse.
--import=mypkg.layers (repeatable) imports a module of yours before any
model is read, so the layers it registers load from model files; it runs
that module's code. --input_shape=*:128 fixes open input dimensions (a
transformer's sequence length) for cutting and timing alike; the models are
then named after it (bert@128). See --helpfull for every flag.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from absl import app, flags

from dlbricks_tf.cli import (
    analyze_command,
    bench_command,
    decompose_command,
    estimate_command,
    exits,
    export_command,
    limit_flags,
    measure_command,
    merge_command,
    report_command,
    run_command,
    shared_flags,
    startup,
)
from dlbricks_tf.cutting import user_modules
from dlbricks_tf.models import corpus
from dlbricks_tf.running import job

# Every command, in the order the usage lists them. `merge` takes the
# paths given after it; every other command takes the models (sources),
# the values of G and whether files are read in safe mode.
COMMANDS: dict[str, Callable[..., None]] = {
    "run": run_command.run,
    "decompose": decompose_command.decompose,
    "bench": bench_command.bench,
    "measure": measure_command.measure,
    "estimate": estimate_command.estimate,
    "export": export_command.export,
    "merge": merge_command.merge,
    "report": report_command.report,
    "analyze": analyze_command.analyze,
}
_TAKE_PATHS = frozenset({"merge"})


# The commands that time read every timing flag (`timing_flags`); estimate
# reads --protocol alone, to pick the stored timings it adds up.
_TIMING_COMMANDS = ("run", "bench", "measure")
_TIMING_FLAGS_READ = {"estimate": ("protocol",)}
# The commands that read the budget's flags (`budget_flags`).
_BUDGET_COMMANDS = ("run", "bench")


def _refuse_unused_flags(command: str) -> None:
    """One line for a flag the command does not read.

    A flag defined in a command's own module (`run_command`'s --retime,
    `bench_command`'s --shard_index) is that command's alone; a timing
    flag (`timing_flags`) is for the commands that time, a budget's flag
    (`budget_flags`) for run and bench.

    Raises:
        app.UsageError: For the first such flag.
    """
    timers = f"{', '.join(_TIMING_COMMANDS[:-1])} and {_TIMING_COMMANDS[-1]}"
    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        name = module.rsplit(".", 1)[-1]
        owner = name.removesuffix("_command")
        for flag in defined:
            if not flag.present:
                continue
            if name.endswith("_command") and command != owner:
                raise app.UsageError(
                    f"{command} does not use --{flag.name} (a flag of "
                    f"{owner}); drop it."
                )
            if (
                name == "timing_flags"
                and command not in _TIMING_COMMANDS
                and flag.name not in _TIMING_FLAGS_READ.get(command, ())
            ):
                raise app.UsageError(
                    f"{command} does not use --{flag.name} (a timing flag "
                    f"of {timers}); drop it."
                )
            if name == "budget_flags" and command not in _BUDGET_COMMANDS:
                raise app.UsageError(
                    f"{command} does not use --{flag.name} (a flag of "
                    f"{' and '.join(_BUDGET_COMMANDS)}); drop it."
                )


def _main(argv: list[str]) -> None:

    # Before any model is read: the modules register the user's layers.
    user_modules.import_modules(shared_flags.IMPORT.value)

    limit_flags.set_limits()

    command, *rest = argv[1:] or ["run"]
    if command not in COMMANDS:
        raise app.UsageError(
            f"Unknown command {command!r}: use one of {', '.join(COMMANDS)}."
        )
    _refuse_unused_flags(command)
    if command in _TAKE_PATHS:
        COMMANDS[command](rest)
        return
    if rest:
        raise app.UsageError(
            f"Unexpected arguments {rest} after {command!r}: give models "
            "with --models=a,b."
        )
    models = shared_flags.MODELS.value
    if shared_flags.SUITE.value and command == "bench" and models:
        raise app.UsageError(
            "bench takes --models or --suite (an exported suite), not both."
        )
    # Names and files are checked before TensorFlow runs its first op.
    default = job.DEFAULT_MODELS
    if command == "analyze":  # It only decomposes: the whole corpus.
        default = list(corpus.APPLICATIONS)
    shapes = shared_flags.input_shapes()
    if shapes and command == "analyze":
        raise app.UsageError(
            "analyze reads models as they are saved; --input_shape is for "
            "run, decompose, bench, measure, estimate, export and report "
            "--compare."
        )
    sources = job.resolve_models(models or default, shapes)
    gs = shared_flags.granularities()
    if command == "analyze" and len(gs) > 1:
        raise app.UsageError("analyze takes one --granularity.")
    COMMANDS[command](sources, gs, not shared_flags.UNSAFE.value)


def main(argv: list[str]) -> None:
    """Runs a command; bad input ends in one line on stderr, exit 1 or 2.

    SIGINT and SIGTERM end it with one line and exit code 130 or 143; every
    result committed to the store before is kept (`bench` first finishes
    the brick in flight).
    """
    signal.signal(signal.SIGTERM, exits.raise_terminated)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with exits.exit_on_signals():
        with startup.native_logs_hidden(startup.quiet()):
            # Importing TensorFlow runs no op: the thread pools stay free.
            import keras  # noqa: F401 (imports TensorFlow, start-up hidden)
        with exits.exit_on_errors():
            _main(argv)


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses flags; a bad flag is one line on stderr and exit code 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        exits.exit_with(f"{str(e).rstrip('.')}. See --helpfull.", 2)
        raise  # Unreachable: exit_with exits.


def run() -> None:
    """Entry point of the `dlbricks` console script (and the tools shim)."""
    # absl prints the main module's docstring as the usage (--help),
    # whichever file started the program.
    sys.modules["__main__"].__doc__ = __doc__
    app.run(main, flags_parser=_parse_flags)
