r"""dlbricks: benchmark Keras models on this CPU from their unique bricks.

Usage: python -m tools.dlbricks [COMMAND] [--flags]   (or: dlbricks ...)

Commands:
  run        (default) the whole job: decompose --models, time the unique
             bricks not yet stored and every model end to end in
             interleaved rounds, estimate, print measured vs estimated
             latency, write the store, report.json and TensorBoard logs
             under --out. With no flags: MobileNetV2, ResNet50 and
             EfficientNetB0 at G=1, 2-4 minutes on two cores.
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
that module's code. See --helpfull for every flag.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import tempfile
import time

from absl import app, flags, logging

COMMANDS = (
    "run",
    "decompose",
    "bench",
    "measure",
    "estimate",
    "export",
    "merge",
    "report",
    "analyze",
)

# The package imports TensorFlow, so it is imported in main, with the
# start-up noise of TensorFlow's C++ runtime hidden (see _quiet_import).
_MODELS = flags.DEFINE_list(
    "models",
    None,
    "Comma list of keras.applications names or .keras/.h5/.json model "
    "files (default: dlbricks_tf.job.DEFAULT_MODELS, i.e. MobileNetV2, "
    "ResNet50, EfficientNetB0; for analyze, the 40 keras.applications).",
)
_GRANULARITY = flags.DEFINE_list(
    "granularity",
    ["1"],
    "G, the most layer calls per brick: one value or a comma list (a sweep).",
)
_FUSE = flags.DEFINE_bool(
    "fuse",
    False,
    "Cut models into fusion units: a convolution or dense layer stays with "
    "the BatchNormalization and activation TensorFlow fuses into it, and G "
    "counts such units. Bench and estimate with the same value.",
)
_BATCH = flags.DEFINE_integer("batch_size", 1, "Batch size.", lower_bound=1)
_INTRA = flags.DEFINE_integer(
    "intra_op_threads",
    None,
    "Threads one op may use (default: the physical cores).",
    lower_bound=1,
)
_INTER = flags.DEFINE_integer(
    "inter_op_threads", 1, "Ops that may run at once.", lower_bound=1
)
_OUT = flags.DEFINE_string(
    "out", "dlbricks_out", "Output folder (store, report.json, TensorBoard)."
)
_DB = flags.DEFINE_string(
    "db", None, "SQLite store of timings (default: <out>/store.sqlite)."
)
_LOGDIR = flags.DEFINE_string(
    "logdir", None, "TensorBoard log folder (default: <out>/tensorboard)."
)
_MODE = flags.DEFINE_enum(
    "mode",
    "sequential",
    ["sequential", "parallel"],
    "estimate: sum of all bricks, or longest path through the brick DAG.",
)
_PRECISION = flags.DEFINE_float(
    "precision",
    0.02,
    "Stop sampling once the median's 95% CI is within this fraction.",
    lower_bound=0.0,
    upper_bound=1.0,
)
_MIN_SAMPLES = flags.DEFINE_integer(
    "min_samples", 10, "Samples per brick or model, at least.", lower_bound=1
)
_MAX_SAMPLES = flags.DEFINE_integer(
    "max_samples", 100, "Samples per brick or model, at most.", lower_bound=1
)
_MAX_SECONDS = flags.DEFINE_float(
    "max_seconds",
    5.0,
    "Sampling time per brick or model, at most (s).",
    lower_bound=0.0,
)
_BRICK_MAX_SAMPLES = flags.DEFINE_integer(
    "brick_max_samples",
    60,
    "Samples per brick, at most, with --protocol=loop: a brick that has "
    "not settled by then is stored flagged noisy. Chains take "
    "--max_samples.",
    lower_bound=1,
)
_BRICK_MAX_SECONDS = flags.DEFINE_float(
    "brick_max_seconds",
    1.0,
    "Sampling time per brick, at most (s), with --protocol=loop. Chains "
    "take --max_seconds per chain.",
    lower_bound=0.0,
)
_PROTOCOL = flags.DEFINE_enum(
    "protocol",
    "chain",
    ["chain", "loop"],
    "How the TF backend times bricks: 'chain' runs up to --chain_links "
    "bricks in one traced function, timed link by link, until every "
    "model's estimate is known to --precision; 'loop' gives each brick "
    "its own traced loop, timed to --precision itself. Results of the two "
    "are stored apart. ONNX Runtime and --jit_compile always use 'loop'.",
)
_CHAIN_LINKS = flags.DEFINE_integer(
    "chain_links",
    128,
    "Bricks in one chain, at most (--protocol=chain): more bricks share "
    "one trace; fewer bound the memory of a chain.",
    lower_bound=1,
)
_SUITE_BRICKS = flags.DEFINE_enum(
    "suite_bricks",
    "saved_model",
    ["saved_model", "keras"],
    "bench --suite on TF with chains: load each brick's SavedModel (checked "
    "op by op, needs none of the author's code) or rebuild it from its "
    ".keras file (Keras safe mode; a custom layer needs --import).",
)
_CHAIN_ORDER = flags.DEFINE_enum(
    "chain_order",
    "model",
    ["model", "shuffled"],
    "Order of the bricks in chains: as the models run them, or shuffled "
    "(seeded).",
)
_TARGET_MS = flags.DEFINE_float(
    "target_sample_ms",
    1.0,
    "Duration of one sample (K calls in one graph), ms.",
    lower_bound=0.01,
)
_WEIGHT_COPIES = flags.DEFINE_integer(
    "weight_copies",
    1,
    "Fresh copies of each brick the timing loop rotates through "
    "(--protocol=loop; in a chain every brick runs once per iteration).",
    lower_bound=1,
)
_INPUT_COPIES = flags.DEFINE_integer(
    "input_copies",
    1,
    "Random inputs each brick's timing loop rotates through, so a call "
    "does not find its input left in cache by the previous one (inside a "
    "whole model it was just written by another layer). --protocol=loop; "
    "a chain writes each brick's input afresh before its link.",
    lower_bound=1,
)
_RETIME = flags.DEFINE_bool(
    "retime", False, "Time every brick again, even those already stored."
)
_SHARD_INDEX = flags.DEFINE_integer(
    "shard_index",
    None,
    "bench: time only this shard (0-based) of the suite (default: from "
    "TEST_SHARD_INDEX, SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX).",
    lower_bound=0,
)
_NUM_SHARDS = flags.DEFINE_integer(
    "num_shards",
    None,
    "bench: the number of shards the suite is cut into (default: from "
    "TEST_TOTAL_SHARDS or SLURM_ARRAY_TASK_COUNT; a Kubernetes Indexed "
    "Job must pass it).",
    lower_bound=1,
)
_GRAPHS = flags.DEFINE_integer(
    "graphs",
    3,
    "run: bricks whose layer-level graph goes to TensorBoard.",
    lower_bound=0,
)
_LIST_BRICKS = flags.DEFINE_bool(
    "list_bricks", True, "decompose: list every brick, not only counts."
)
_IMPORT = flags.DEFINE_multi_string(
    "import",
    [],
    "Python module to import before any model is read, e.g. "
    "--import=mypkg.layers (repeat the flag for several), so that the "
    "layers it registers with @keras.saving.register_keras_serializable "
    "load from .keras, .h5 and .json files. This RUNS THAT MODULE'S CODE: "
    "name only modules you trust. Searched on PYTHONPATH, then in the "
    "working folder.",
)
_INPUT_SHAPE = flags.DEFINE_multi_string(
    "input_shape",
    [],
    "NAME:DIMS, the shape (batch left out) of a model input whose "
    "dimensions are open, e.g. --input_shape=token_ids:128 (repeatable); "
    "NAME * stands for every input not named: --input_shape=*:128 sets a "
    "transformer's sequence length. For decompose, bench, estimate, export "
    "and report --compare; the shape is part of every brick's signature.",
)
_UNSAFE = flags.DEFINE_bool(
    "unsafe_deserialization",
    False,
    "Allow Lambda layers from model files (runs code from the file).",
)
# Limits on files from someone else (dlbricks_tf.limits); the defaults are
# far above the largest keras.applications configs.
_MAX_FILE_MB = flags.DEFINE_integer(
    "max_file_mb",
    64,
    "Largest JSON document read from a file: a model config (.json, a "
    ".keras archive's config.json, an .h5 file's model_config), a suite's "
    "manifest, a recipe (MiB).",
    lower_bound=1,
)
_MAX_MEMBER_MB = flags.DEFINE_integer(
    "max_member_mb",
    16384,
    "Largest uncompressed member of a .keras archive, checked before it "
    "is inflated (MiB).",
    lower_bound=1,
)
_MAX_JSON_DEPTH = flags.DEFINE_integer(
    "max_json_depth",
    100,
    "Deepest nesting of JSON arrays and objects read from a file.",
    lower_bound=1,
)
_MAX_LAYERS = flags.DEFINE_integer(
    "max_layers",
    100_000,
    "Most layers a model file may hold, nested models included.",
    lower_bound=1,
)
_MAX_BRICKS = flags.DEFINE_integer(
    "max_bricks",
    100_000,
    "Most bricks a suite manifest or a recipe may list.",
    lower_bound=1,
)
_UNSAFE_SUITE = flags.DEFINE_bool(
    "unsafe_suite",
    False,
    "bench --suite: run the suite's SavedModels and ONNX files without "
    "first checking their graphs (only allow-listed ops, no external data "
    "or symlink leaving the suite folder). Only for a suite you trust: a "
    "SavedModel is a program, and running it can read or write files.",
)
_SUITE = flags.DEFINE_string(
    "suite",
    None,
    "Suite folder of unique bricks: export writes it (default: "
    "<out>/suite). It holds no model name or weight: it can be shared.",
)
_RECIPES = flags.DEFINE_string(
    "recipes",
    None,
    "export: folder of the per-model recipes, <model>.recipe.json "
    "(default: <out>/recipes). They name the models: keep them private.",
)
_RECIPE = flags.DEFINE_list(
    "recipe",
    None,
    "estimate: comma list of recipe files written by export, estimated "
    "instead of --models (no model is read).",
)
_COMPARE = flags.DEFINE_bool(
    "compare",
    False,
    "report: compare the estimates of each model on every machine "
    "(fingerprint) and backend the store holds.",
)
_COVER = flags.DEFINE_bool(
    "cover",
    False,
    "estimate: cover each model by the stored bricks of any G up to "
    "--granularity (fewest bricks), not only those of its cut at G.",
)
_PREDICT = flags.DEFINE_bool(
    "predict",
    False,
    "estimate: predict the bricks the store lacks with a latency model "
    "fitted on the store's bricks of these settings and this machine "
    "(those of --models and of the keras.applications models the store "
    "timed); without it a missing brick is an error.",
)
_BACKEND = flags.DEFINE_enum(
    "backend",
    "tf",
    ["tf", "onnxruntime"],
    "Backend: bench --suite times the suite's SavedModels (tf) or ONNX "
    "files (onnxruntime); estimate uses the results timed with it.",
)


def _granularities(values: list[str]) -> list[int]:
    return [int(v) for v in values]


def _valid_granularity(values: list[str]) -> bool:
    try:
        return bool(values) and all(g >= 1 for g in _granularities(values))
    except ValueError:
        return False


flags.register_validator(
    "granularity",
    _valid_granularity,
    message="--granularity must be integers of 1 or more, e.g. 1 or 1,2,3.",
)


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity), at least 1."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


for _name in ("intra_op_threads", "inter_op_threads"):
    flags.register_validator(
        _name,
        lambda v: v is None or v <= _usable_cpus(),
        message=f"--{_name} must be at most the {_usable_cpus()} CPUs this "
        "process may use",
    )
flags.register_multi_flags_validator(
    ["min_samples", "max_samples"],
    lambda f: f["min_samples"] <= f["max_samples"],
    message="--min_samples must not exceed --max_samples.",
)
flags.register_multi_flags_validator(
    ["shard_index", "num_shards"],
    lambda f: None in f.values() or f["shard_index"] < f["num_shards"],
    message="--shard_index must be below --num_shards (shards run from 0)",
)


class _Fail(Exception):
    """Ends the program with one line on stderr and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _one_line(message: object) -> str:
    return " ".join(str(message).split())


@contextlib.contextmanager
def _native_logs_hidden(hidden: bool):
    """Hides what TensorFlow's C++ start-up writes to fd 2 (CUDA, oneDNN).

    TF_CPP_MIN_LOG_LEVEL does not silence messages logged before absl's
    C++ logging is initialised. They are replayed if start-up fails.
    """
    if not hidden:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _protocol(backend: str) -> str | None:
    """--protocol for the TF backend; ONNX Runtime times each brick alone."""
    return _PROTOCOL.value if backend == "tf" else None


def _start_tensorflow(intra: int | None, inter: int, batch_size: int):
    """Fixes the thread pools before TensorFlow's first op; returns settings."""
    quiet = _quiet()
    with _native_logs_hidden(quiet):
        import tensorflow as tf

        from dlbricks_tf import settings as settings_lib

        settings = settings_lib.RunSettings.default(
            batch_size,
            intra_op_threads=intra,
            inter_op_threads=inter,
            protocol=_protocol("tf"),
        )
        settings_lib.configure_threads(
            settings.intra_op_threads, settings.inter_op_threads
        )
        tf.constant(0.0).numpy()  # Initialises the runtime (and its logs).
    if quiet:
        tf.get_logger().setLevel("ERROR")
    return settings


class _Progress:
    """One progress line per G: timings done, rate and ETA.

    On a terminal the line is redrawn in place; otherwise (a log file) a
    line is printed at most every 30 s and at the end.
    """

    def __init__(self, label: str = "", verb: str = "timed") -> None:
        self._label = label
        self._verb = verb
        self._tty = sys.stdout.isatty()
        self._start = 0.0
        self._last = 0.0
        self._open = False  # A tty line is drawn and not yet ended.

    def __call__(self, model: str, done: int, total: int) -> None:
        now = time.perf_counter()
        if done == 0 or not self._start:
            self._start, self._last = now, 0.0
        finished = done >= total
        if not self._tty and now - self._last < 30.0 and not finished:
            return
        self._last = now
        elapsed = now - self._start
        eta = _duration(elapsed / done * (total - done)) if done else "-"
        line = (
            f"{self._label}{done}/{total} {self._verb} ({model}), "
            f"{_duration(elapsed)} elapsed, ETA {eta}"
        )
        if self._tty:
            sys.stdout.write(f"\r\033[K{line}")
            self._open = not finished
            if finished:
                sys.stdout.write("\n")
        else:
            sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def log(self, line: str) -> None:
        """Prints a line without breaking the progress line."""
        if self._open:
            sys.stdout.write("\r\033[K")
        print(line, flush=True)


def _duration(seconds: float) -> str:
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes}m{s:02d}s" if minutes else f"{s}s"


def _timing_options():
    import dataclasses

    from dlbricks_tf import timing

    options = timing.TimingOptions(
        precision=_PRECISION.value,
        min_samples=_MIN_SAMPLES.value,
        max_samples=_MAX_SAMPLES.value,
        max_seconds=_MAX_SECONDS.value,
        target_sample_ms=_TARGET_MS.value,
    )
    bricks = dataclasses.replace(
        options,
        weight_copies=_WEIGHT_COPIES.value,
        input_copies=_INPUT_COPIES.value,
        chain_links=_CHAIN_LINKS.value,
        chain_order=_CHAIN_ORDER.value,
    )
    if _PROTOCOL.value == "loop":  # Caps per brick; a chain's are a model's.
        bricks = dataclasses.replace(
            bricks,
            max_samples=min(_BRICK_MAX_SAMPLES.value, _MAX_SAMPLES.value),
            max_seconds=min(_BRICK_MAX_SECONDS.value, _MAX_SECONDS.value),
        )
    return options, bricks


def _paths() -> tuple[str, str, str]:
    out = _OUT.value
    db = _DB.value or os.path.join(out, "store.sqlite")
    logdir = _LOGDIR.value or os.path.join(out, "tensorboard")
    return out, db, logdir


def _make_dirs(*paths: str) -> None:
    for p in paths:
        if not p:
            continue
        reason = ""
        try:
            os.makedirs(p, exist_ok=True)
        except OSError as e:
            reason = e.strerror
            up = p
            while up and not os.path.exists(up):
                up = os.path.dirname(up.rstrip(os.sep))
            if up and not os.path.isdir(up):
                reason = f"{up!r} is a file, not a folder"
        if not reason and not os.access(p, os.W_OK | os.X_OK):
            reason = "it is not writable"
        if reason:
            raise _Fail(
                f"Cannot create folder {p!r}: {reason}; choose another "
                "--out, --db or --logdir.",
                1,
            )


def _open_store(db: str, must_exist: bool = False):
    from dlbricks_tf.store import Store

    if must_exist and not os.path.isfile(db):
        raise _Fail(
            f"Store {db!r} does not exist: run `dlbricks bench` (or `run`) "
            "first, or pass --db.",
            1,
        )
    _make_dirs(os.path.dirname(db))
    return Store(db)


def _input_shapes() -> dict[str, tuple[int, ...]] | None:
    """--input_shape as {name: shape}; app.UsageError if malformed."""
    shapes = {}
    for value in _INPUT_SHAPE.value:
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


def _decompose(source, granularity: int, safe_mode: bool):
    """Decomposes a model source as the flags say (--fuse, --input_shape)."""
    return source.decompose(
        granularity, safe_mode, _FUSE.value, input_shapes=_input_shapes()
    )


def _cmd_run(sources, gs, safe_mode) -> None:
    from dlbricks_tf import board, job, report
    from dlbricks_tf.fingerprint import system_fingerprint

    out, db, logdir = _paths()
    _make_dirs(out, logdir)
    settings = _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    options, brick_options = _timing_options()
    names = ", ".join(s.name for s in sources)
    print(
        f"dlbricks run: {names} at G={','.join(map(str, gs))}, batch "
        f"{settings.batch_size}, threads {settings.intra_op_threads}x"
        f"{settings.inter_op_threads}; store {db}",
        flush=True,
    )
    start = time.perf_counter()
    progress = _Progress()
    with _open_store(db) as store:
        rep, details = job.run_job(
            sources,
            gs,
            settings,
            store,
            options,
            brick_options,
            fingerprint=system_fingerprint(),
            report_path=os.path.join(out, "report.json"),
            reuse_stored=not _RETIME.value,
            safe_mode=safe_mode,
            progress=progress,
            log=progress.log,
            fuse=_FUSE.value,
        )
    board.write_board(logdir, rep, details, graphs=_GRAPHS.value)
    print()
    print(report.format_report(rep))
    if noisy := report.format_noisy(rep["runs"]):
        print(f"\n{noisy}")
    print(f"\nWall time: {time.perf_counter() - start:.0f} s")
    print(f"Store:  {db}")
    print(f"Report: {os.path.join(out, 'report.json')}")
    print(f"TensorBoard: tensorboard --logdir {logdir}", flush=True)


def _cmd_decompose(sources, gs, safe_mode) -> None:
    from dlbricks_tf import report

    _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    for g in gs:
        ds = {s.name: _decompose(s, g, safe_mode) for s in sources}
        print(f"# G={g}\n")
        print(report.format_decompositions(ds, bricks=_LIST_BRICKS.value))
        print()


def _cmd_bench(sources, gs, safe_mode) -> None:
    from dlbricks_tf import bench, suite
    from dlbricks_tf.fingerprint import system_fingerprint

    if _SUITE.value:
        _bench_suite_dir(_SUITE.value)
        return
    if _BACKEND.value != "tf":
        raise app.UsageError(
            "--backend=onnxruntime times an exported suite: export it with "
            "`dlbricks export`, then `dlbricks bench --suite=DIR "
            "--backend=onnxruntime`."
        )
    _, db, _ = _paths()
    shard = _shard()
    settings = _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    _, brick_options = _timing_options()
    fp = system_fingerprint()
    # SIGINT/SIGTERM: finish and commit the chain (or brick) in flight,
    # then stop.
    failed = []
    with _open_store(db) as store, bench.StopSignals() as stop:
        for g in gs:
            s = suite.build_suite(
                {src.name: _decompose(src, g, safe_mode) for src in sources}
            )
            part = f"{len(s)} unique bricks of {s.total_bricks}"
            if shard.count > 1:
                s, whole = s.shard(shard.index, shard.count), s
                part = f"{len(s)} of the {len(whole)} unique bricks"
            failed += _time_suite(
                f"G={g}", part, s, store, settings, fp, brick_options, stop
            )
    _fail_if_any_failed(failed)


def _bench_suite_dir(folder: str) -> None:
    """bench --suite: time an exported suite folder, no model needed."""
    import dataclasses

    from dlbricks_tf import bench, suite_bench, suite_check, suite_dir
    from dlbricks_tf.fingerprint import system_fingerprint

    _, db, _ = _paths()
    suite = suite_dir.load_suite(folder)  # Checks every file's hash.
    shard = _shard()
    settings = _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    settings = dataclasses.replace(
        settings, backend=_BACKEND.value, protocol=_protocol(_BACKEND.value)
    )
    if settings.backend == "onnxruntime":
        from dlbricks_tf import ort_timing

        ort_timing.require_onnxruntime()  # One line if ONNX Runtime is missing.
    _, brick_options = _timing_options()
    fp = system_fingerprint()
    part = f"{len(suite)} bricks"
    if shard.count > 1:
        suite = suite.shard(shard.index, shard.count)
        part = f"{len(suite)} of the suite's {part}"
    label = f"suite {folder} on {settings.backend}"
    if _UNSAFE_SUITE.value:
        print(f"{label}: not checked (--unsafe_suite)", flush=True)
    else:
        refused = suite_check.refusals(suite, settings.backend)
        print(
            f"{label}: checked {len(suite)} bricks, refused {len(refused)}"
            + (" (recorded as failed, not run)" if refused else ""),
            flush=True,
        )
    measure = build = None
    if settings.protocol == "chain":
        build = suite_bench.builder(
            settings,
            _SUITE_BRICKS.value,
            suite_folder=suite.folder,
            unsafe=_UNSAFE_SUITE.value,
        )
    else:
        measure = suite_bench.measurer(
            settings,
            brick_options,
            suite_folder=suite.folder,
            unsafe=_UNSAFE_SUITE.value,
        )
    with _open_store(db) as store, bench.StopSignals() as stop:
        failed = _time_suite(
            label,
            part,
            suite,
            store,
            settings,
            fp,
            brick_options,
            stop,
            measure=measure,
            build=build,
        )
    _fail_if_any_failed(failed)


def _time_suite(
    label, part, s, store, settings, fp, options, stop, measure=None, build=None
) -> tuple[tuple[str, str], ...]:
    """Times what the store lacks of suite `s`; returns the failed bricks."""
    from dlbricks_tf import bench

    todo = store.missing(s.signatures, settings, fp)
    print(f"{label}: {part}; {len(todo)} to time", flush=True)
    bar = _Progress(f"{label}: ")
    done = iter(range(1, len(todo) + 1))
    on_result = functools.partial(_bench_result, bar, done, len(todo))

    def on_failure(signature: str, reason: str) -> None:
        bar.log(f"{label}: brick {signature} failed: {reason}")
        bar(signature, next(done), len(todo))

    summary = bench.time_suite(
        s,
        store,
        settings,
        fp,
        options,
        on_result=on_result,
        stop=stop,
        measure=measure,
        build=build,
        on_failure=on_failure,
    )
    print(
        f"{label}: timed {len(summary.timed)}, already stored "
        f"{len(summary.skipped)}, failed {len(summary.failed)}, "
        f"noisy {len(summary.noisy)} "
        f"(re-measured {len(summary.remeasured)}), "
        f"{summary.wall_s:.1f} s; store {store.path} ({settings.key()})",
        flush=True,
    )
    if summary.stopped:
        chained = settings.protocol == "chain" and measure is None
        unit = "chain" if chained else "brick"
        raise _Fail(
            f"Stopped by {stop.name} after the {unit} in flight: "
            f"{len(summary.timed)} brick(s) timed and stored at {label}, "
            f"{len(todo) - len(summary.timed) - len(summary.failed)} left; "
            "run the same command "
            "again to resume.",
            128 + stop.received,
        )
    return summary.failed


def _fail_if_any_failed(failed) -> None:
    """Ends bench with exit code 1 if any brick failed (all were tried)."""
    if not failed:
        return
    shown = ", ".join(sig for sig, _ in failed[:5])
    more = len(failed) - 5
    raise _Fail(
        f"{len(failed)} brick(s) could not be loaded, built or timed: "
        f"{shown}{f' (+{more} more)' if more > 0 else ''}. They are recorded "
        "as failed in the store with their reasons (printed above); every "
        "other brick was timed. Run the same command again to retry them.",
        1,
    )


def _shard():
    """This worker's shard of the suite (a `dlbricks_tf.sharding.Shard`).

    From --shard_index/--num_shards, else from the variables of the engine
    running the worker (Bazel, Slurm, a Kubernetes Indexed Job); printed
    when the suite is cut. Unpacks as (index, count): cut a suite with
    `suite.shard(*shard)` when `shard.count > 1`.

    Raises:
        ShardError: If the flags and variables do not fit together.
    """
    from dlbricks_tf import sharding

    shard = sharding.resolve_shard(_SHARD_INDEX.value, _NUM_SHARDS.value)
    if shard.source != "default":
        print(f"Timing {shard}", flush=True)
    return shard


def _bench_result(bar, done, total, signature, timing) -> None:
    bar(signature, next(done), total)


def _cmd_measure(sources, gs, safe_mode) -> None:
    from dlbricks_tf import job
    from dlbricks_tf.fingerprint import system_fingerprint

    _, db, _ = _paths()
    settings = _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    options, _ = _timing_options()
    with _open_store(db) as store:
        measured = job.measure_models(
            sources,
            settings,
            system_fingerprint(),
            store,
            options,
            safe_mode=safe_mode,
            progress=_Progress(),
        )
    print("| model | median ms | min ms | 95% CI ms | samples | noisy |")
    print("|---|---:|---:|---|---:|---|")
    for name, t in measured.items():
        print(
            f"| {name} | {t.median_ms:.3f} | {t.min_ms:.3f} "
            f"| {t.ci_low_ms:.3f}-{t.ci_high_ms:.3f} | {t.samples} "
            f"| {'yes' if t.noisy else 'no'} |"
        )
    print(f"\nStore: {db}")


def _cmd_estimate(sources, gs, safe_mode) -> None:
    import dataclasses

    from dlbricks_tf import job, report
    from dlbricks_tf.fingerprint import system_fingerprint

    if _RECIPE.value:
        if _COVER.value or _PREDICT.value:
            raise app.UsageError(
                "--cover and --predict need the models (--models): a recipe "
                "holds only the signatures of its bricks."
            )
        _estimate_recipes(_RECIPE.value)
        return
    _, db, logdir = _paths()
    settings = _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    settings = dataclasses.replace(
        settings, backend=_BACKEND.value, protocol=_protocol(_BACKEND.value)
    )
    fp = system_fingerprint()
    with _open_store(db, must_exist=True) as store:
        rows = []
        for g in gs:
            if _COVER.value or _PREDICT.value:
                rows += _estimate_beyond(sources, g, settings, fp, store,
                                         safe_mode)  # fmt: skip
                continue
            rows += job.estimate_models(
                sources, g, settings, fp, store, _MODE.value,
                safe_mode=safe_mode, fuse=_FUSE.value,
            )  # fmt: skip
    print(report.format_estimates(rows))
    if _COVER.value or _PREDICT.value:
        from dlbricks_tf import board

        _make_dirs(logdir)
        board.write_estimates(logdir, rows)
        print(f"\nTensorBoard: tensorboard --logdir {logdir}", flush=True)
    if noisy := report.format_noisy(rows):
        print(f"\n{noisy}")


def _estimate_beyond(sources, g, settings, fp, store, safe_mode) -> list:
    """estimate --cover/--predict: rows that say where each estimate is from."""
    from dlbricks_tf import beyond, corpus, job

    training = []
    if _PREDICT.value:  # The models the store timed teach the predictor too.
        timed = {
            r["model"]
            for r in store.rows("model")
            if r["fingerprint_id"] == fp.id
            and r["settings"] == settings.to_dict()
        }
        names = sorted(timed & set(corpus.APPLICATIONS))
        training = job.resolve_models(names) if names else []
    return beyond.estimate_models(
        sources, g, settings, fp, store, _MODE.value,
        cover=_COVER.value, predict=_PREDICT.value, training=training,
        safe_mode=safe_mode, fuse=_FUSE.value,
        log=lambda line: print(line, flush=True),
    )  # fmt: skip


def _estimate_recipes(paths: list[str]) -> None:
    """estimate --recipe: models rebuilt from recipes and the store alone."""
    from dlbricks_tf import estimate as estimate_lib
    from dlbricks_tf import recipe as recipe_lib
    from dlbricks_tf import report
    from dlbricks_tf import settings as settings_lib
    from dlbricks_tf.fingerprint import system_fingerprint

    if _MODELS.value:
        raise app.UsageError("estimate takes --models or --recipe, not both.")
    _, db, _ = _paths()
    recipes = [recipe_lib.load(p) for p in paths]
    # Nothing runs here: the settings only pick the stored timings.
    settings = settings_lib.RunSettings.default(
        _BATCH.value,
        intra_op_threads=_INTRA.value,
        inter_op_threads=_INTER.value,
        backend=_BACKEND.value,
        protocol=_protocol(_BACKEND.value),
    )
    fp = system_fingerprint()
    rows = []
    with _open_store(db, must_exist=True) as store:
        results = store.results(settings, fp)
        failures = store.failures(settings, fp)
        for r in recipes:
            est = estimate_lib.estimate(
                r, results, _MODE.value, failures=failures
            )
            measured = store.get_model(r.name, settings, fp)
            m = measured.median_ms if measured else None
            rows.append(
                {
                    "model": r.name,
                    "granularity": r.granularity,
                    "mode": _MODE.value,
                    "estimated_ms": est.ms,
                    "low_ms": est.low_ms,
                    "high_ms": est.high_ms,
                    "bricks": est.bricks,
                    "noisy_bricks": len(est.noisy_signatures),
                    "measured_ms": m,
                    "measured_noisy": measured.noisy if measured else None,
                    "normalized": est.ms / m if m else None,
                }
            )
    print(report.format_estimates(rows))
    if noisy := report.format_noisy(rows):
        print(f"\n{noisy}")
    print(f"\nStore: {db} ({settings.key()})")


def _cmd_report(sources, gs, safe_mode) -> None:
    from dlbricks_tf import report

    out, db, logdir = _paths()
    if _COMPARE.value:
        _compare(sources, gs, safe_mode, db, logdir)
        return
    path = os.path.join(out, "report.json")
    if not os.path.isfile(path):
        raise _Fail(
            f"No report at {path!r}: run `dlbricks run` first, or pass --out "
            "(or --compare to compare machines in --db).",
            1,
        )
    import json

    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        text = report.format_report(data)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _Fail(f"Cannot read report {path!r}: {e}", 1) from e
    print(text)


def _compare(sources, gs, safe_mode, db, logdir) -> None:
    """report --compare: each model's estimate per machine and backend."""
    from dlbricks_tf import board, compare
    from dlbricks_tf import recipe as recipe_lib

    if len(gs) > 1:
        raise app.UsageError("report --compare takes one --granularity.")
    if _RECIPE.value and _MODELS.value:
        raise app.UsageError("report takes --models or --recipe, not both.")
    if _RECIPE.value:
        plans = {r.name: r for r in map(recipe_lib.load, _RECIPE.value)}
    else:
        _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
        plans = {s.name: _decompose(s, gs[0], safe_mode) for s in sources}
    with _open_store(db, must_exist=True) as store:
        table = compare.compare(
            plans, store, mode=_MODE.value, batch_size=_BATCH.value
        )
    if not table.configurations:
        raise _Fail(
            f"Store {db!r} holds no brick timing at batch size "
            f"{_BATCH.value}: run `dlbricks bench` first.",
            1,
        )
    print(compare.format_comparison(table))
    _make_dirs(logdir)
    board.write_comparison(logdir, table)
    print(f"\nTensorBoard: tensorboard --logdir {logdir}", flush=True)


def _cmd_export(sources, gs, safe_mode) -> None:
    from dlbricks_tf import export, recipe, suite
    from dlbricks_tf import split as split_lib

    if len(gs) > 1:
        raise app.UsageError("export takes one --granularity.")
    out = _OUT.value
    folder = _SUITE.value or os.path.join(out, "suite")
    recipes_dir = _RECIPES.value or os.path.join(out, "recipes")
    inside = os.path.relpath(
        os.path.abspath(recipes_dir), os.path.abspath(folder)
    )
    if inside == os.curdir or not inside.startswith(os.pardir):
        raise app.UsageError(
            "--recipes must not be inside --suite: the suite is meant to be "
            "shared and recipes name the models."
        )
    _make_dirs(folder, recipes_dir)
    _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    if _quiet():  # TensorFlow's SavedModel writer logs INFO lines per file.
        logging.set_verbosity(logging.WARNING)
    g = gs[0]
    decompositions = {s.name: _decompose(s, g, safe_mode) for s in sources}
    unique = suite.build_suite(decompositions)
    print(
        f"G={g}: {len(unique)} unique bricks of {unique.total_bricks} in "
        f"{len(decompositions)} model(s); suite {folder}",
        flush=True,
    )
    bar = _Progress(f"G={g}: ", verb="exported")
    summary = export.export_suite(
        unique,
        folder,
        granularity=g,
        split=split_lib.split_name(_FUSE.value),
        progress=lambda done, total: bar("suite", done, total),
    )
    paths = []
    for name, d in decompositions.items():
        path = os.path.join(recipes_dir, f"{name}{recipe.SUFFIX}")
        recipe.from_decomposition(name, d).save(path)
        paths.append(path)
    print(
        f"Suite: {summary.folder}: {summary.total} bricks, "
        f"{len(summary.written)} written, {len(summary.skipped)} already "
        f"there ({summary.wall_s:.1f} s); manifest {summary.manifest}"
    )
    if summary.no_onnx:
        print(
            f"Without ONNX (written with onnx null; --backend=onnxruntime "
            f"records them as failed): {len(summary.no_onnx)} brick(s):"
        )
        pairs = list(zip(summary.no_onnx, summary.no_onnx_reasons, strict=True))
        for signature, reason in pairs[:10]:
            print(f"  {signature}: {reason}")
        if len(pairs) > 10:
            print(f"  ... and {len(pairs) - 10} more (see the manifest)")
    print(f"Recipes (private): {len(paths)} in {recipes_dir}")
    for path in paths:
        print(f"  {path}")


def _cmd_merge(stores: list[str]) -> None:
    _, db, _ = _paths()
    if not stores:
        raise app.UsageError(
            "merge needs the store files to copy from: "
            "`dlbricks merge --db=all.sqlite a.sqlite b.sqlite`."
        )
    for path in stores:
        if not os.path.isfile(path):
            raise _Fail(f"Store {path!r} does not exist: check the path.", 1)
        if os.path.abspath(path) == os.path.abspath(db):
            raise app.UsageError(f"Cannot merge {path!r} into itself (--db).")
    with _open_store(db) as store:
        for path in stores:
            added = store.merge_from(path)
            print(f"{path}: {added} result(s) added")
    print(f"Store: {db}")


def _cmd_analyze(sources, gs, safe_mode) -> None:
    from dlbricks_tf import analyze, corpus

    if _FUSE.value:
        raise app.UsageError(
            "analyze cuts models by layer calls; --fuse is for run, "
            "decompose, bench, estimate, export and report --compare."
        )
    out, db, _ = _paths()
    _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    models = {
        s.name: s.path or functools.partial(corpus.application, s.name)
        for s in sources
    }
    target = os.path.join(out, "analysis")
    result = analyze.run_analysis(
        models,
        target,
        granularity=gs[0],
        store_path=db if os.path.isfile(db) else None,
    )
    print(f"\n{len(result.files)} files written under {target}")
    tb = os.path.join(target, "tensorboard")
    print(f"TensorBoard: tensorboard --logdir {tb}", flush=True)


def _set_limits() -> None:
    from dlbricks_tf import limits

    limits.set_limits(
        limits.Limits(
            file_bytes=_MAX_FILE_MB.value * limits.MIB,
            member_bytes=_MAX_MEMBER_MB.value * limits.MIB,
            json_depth=_MAX_JSON_DEPTH.value,
            layers=_MAX_LAYERS.value,
            bricks=_MAX_BRICKS.value,
        )
    )


def _main(argv: list[str]) -> None:
    from dlbricks_tf import job, user_modules

    # Before any model is read: the modules register the user's layers.
    user_modules.import_modules(_IMPORT.value)

    _set_limits()

    command, *rest = argv[1:] or ["run"]
    if command not in COMMANDS:
        raise app.UsageError(
            f"Unknown command {command!r}: use one of {', '.join(COMMANDS)}."
        )
    if command == "merge":
        _cmd_merge(rest)
        return
    if rest:
        raise app.UsageError(
            f"Unexpected arguments {rest} after {command!r}: give models "
            "with --models=a,b."
        )
    if _SUITE.value and command == "bench" and _MODELS.value:
        raise app.UsageError(
            "bench takes --models or --suite (an exported suite), not both."
        )
    # Names and files are checked before TensorFlow runs its first op.
    default = job.DEFAULT_MODELS
    if command == "analyze":  # It only decomposes: the whole corpus.
        from dlbricks_tf import corpus

        default = list(corpus.APPLICATIONS)
    sources = job.resolve_models(_MODELS.value or default)
    if _input_shapes() and command in ("run", "measure", "analyze"):
        raise app.UsageError(
            f"{command} times or reads whole models, whose input shapes "
            "--input_shape does not change yet; use decompose, bench, "
            "export and estimate with it."
        )
    gs = _granularities(_GRANULARITY.value)
    if command == "analyze" and len(gs) > 1:
        raise app.UsageError("analyze takes one --granularity.")
    handler = globals()[f"_cmd_{command}"]
    handler(sources, gs, not _UNSAFE.value)


def _quiet() -> bool:
    return logging.get_verbosity() < logging.DEBUG


class _Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt (past `except Exception`)."""


def _raise_terminated(signum, frame) -> None:
    del signum, frame  # Unused.
    raise _Terminated()


@contextlib.contextmanager
def _exit_on_signals():
    """Ends SIGINT and SIGTERM in one line and exit code 130 or 143."""
    try:
        yield
    except KeyboardInterrupt:
        _exit(
            "Interrupted (SIGINT): the results stored so far are kept; run "
            "the same command again to resume.",
            130,
        )
    except _Terminated:
        _exit(
            "Terminated (SIGTERM): the results stored so far are kept; run "
            "the same command again to resume.",
            143,
        )


def main(argv: list[str]) -> None:
    """Runs a command; bad input ends in one line on stderr, exit 1 or 2.

    SIGINT and SIGTERM end it with one line and exit code 130 or 143; every
    result committed to the store before is kept (`bench` first finishes
    the brick in flight).
    """
    signal.signal(signal.SIGTERM, _raise_terminated)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with _exit_on_signals():
        with _native_logs_hidden(_quiet()):
            # Importing TensorFlow runs no op: the thread pools stay free.
            from dlbricks_tf import errors
        try:
            _main(argv)
        except app.UsageError as e:
            _exit(f"{e} See --helpfull.", 2)
        except _Fail as e:
            _exit(str(e), e.code)
        except errors.Error as e:
            _exit(str(e), 1)
        except OSError as e:  # The machine's, not a bug: disk full, access.
            _exit(f"{e.filename or ''} {e.strerror or e}".strip(), 1)
        except MemoryError as e:  # numpy's allocation errors derive from it.
            _exit(f"Out of memory: {_first_line(e)}; {_SMALLER}", 1)
        except Exception as e:
            if not _is_resource_exhausted(e):
                raise
            _exit(
                f"Out of memory in TensorFlow: {_first_line(e)}; {_SMALLER}", 1
            )


_SMALLER = "use a smaller --batch_size, or fewer copies (--input_copies)."


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _is_resource_exhausted(e: BaseException) -> bool:
    """Whether `e` is TensorFlow's out-of-memory error (if TF is loaded)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(e, tf.errors.ResourceExhaustedError)


def _exit(message: str, code: int) -> None:
    sys.stdout.flush()
    print(f"dlbricks: error: {_one_line(message)}", file=sys.stderr)
    sys.exit(code)


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses flags; a bad flag is one line on stderr and exit code 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        _exit(f"{str(e).rstrip('.')}. See --helpfull.", 2)
        raise  # Unreachable: _exit exits.


def run() -> None:
    """Entry point of the `dlbricks` console script."""
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
