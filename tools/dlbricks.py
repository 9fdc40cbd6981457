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
  bench      time the unique bricks of --models missing from --db.
  measure    time --models end to end into --db.
  estimate   estimate --models from the brick timings in --db
             (--mode=sequential or parallel).
  merge      copy the results of the store files given as arguments into
             --db: `dlbricks merge --db=all.sqlite a.sqlite b.sqlite`.
  analyze    corpus figures (repeatability, layer types, similarity,
             reuse; the trade-off over G when --db has timings) under
             <out>/analysis.

--models takes keras.applications names (weights=None, nothing is
downloaded) and paths of .keras, .h5 or config .json files. --granularity
takes one G or a list (a sweep). See --helpfull for every flag.
"""

from __future__ import annotations

import contextlib
import functools
import os
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
    "merge",
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
    "Samples per brick, at most: a brick that has not settled by then is "
    "stored flagged noisy.",
    lower_bound=1,
)
_BRICK_MAX_SECONDS = flags.DEFINE_float(
    "brick_max_seconds",
    1.0,
    "Sampling time per brick, at most (s).",
    lower_bound=0.0,
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
    "Fresh copies of each brick the timing loop rotates through.",
    lower_bound=1,
)
_RETIME = flags.DEFINE_bool(
    "retime", False, "Time every brick again, even those already stored."
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
_UNSAFE = flags.DEFINE_bool(
    "unsafe_deserialization",
    False,
    "Allow Lambda layers from model files (runs code from the file).",
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
flags.register_validator(
    "intra_op_threads",
    lambda v: v is None or v <= (os.cpu_count() or 1),
    message=f"--intra_op_threads must be at most the {os.cpu_count()} CPUs "
    "of this machine.",
)
flags.register_multi_flags_validator(
    ["min_samples", "max_samples"],
    lambda f: f["min_samples"] <= f["max_samples"],
    message="--min_samples must not exceed --max_samples.",
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


def _start_tensorflow(intra: int | None, inter: int, batch_size: int):
    """Fixes the thread pools before TensorFlow's first op; returns settings."""
    quiet = _quiet()
    with _native_logs_hidden(quiet):
        import tensorflow as tf

        from dlbricks_tf import settings as settings_lib

        settings = settings_lib.RunSettings.default(
            batch_size, intra_op_threads=intra, inter_op_threads=inter
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

    def __init__(self, label: str = "") -> None:
        self._label = label
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
            f"{self._label}{done}/{total} timed ({model}), "
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
        if p:
            try:
                os.makedirs(p, exist_ok=True)
            except OSError as e:
                raise _Fail(
                    f"Cannot create folder {p!r}: {e.strerror}; choose "
                    "another --out, --db or --logdir.",
                    1,
                ) from e


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
        )
    board.write_board(logdir, rep, details, graphs=_GRAPHS.value)
    print()
    print(report.format_report(rep))
    print(f"\nWall time: {time.perf_counter() - start:.0f} s")
    print(f"Store:  {db}")
    print(f"Report: {os.path.join(out, 'report.json')}")
    print(f"TensorBoard: tensorboard --logdir {logdir}", flush=True)


def _cmd_decompose(sources, gs, safe_mode) -> None:
    from dlbricks_tf import report

    _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    for g in gs:
        ds = {s.name: s.decompose(g, safe_mode) for s in sources}
        print(f"# G={g}\n")
        print(report.format_decompositions(ds, bricks=_LIST_BRICKS.value))
        print()


def _cmd_bench(sources, gs, safe_mode) -> None:
    from dlbricks_tf import bench, suite
    from dlbricks_tf.fingerprint import system_fingerprint

    _, db, _ = _paths()
    settings = _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    _, brick_options = _timing_options()
    fp = system_fingerprint()
    with _open_store(db) as store:
        for g in gs:
            s = suite.build_suite(
                {src.name: src.decompose(g, safe_mode) for src in sources}
            )
            todo = store.missing(s.signatures, settings, fp)
            print(
                f"G={g}: {len(s)} unique bricks of {s.total_bricks}; "
                f"{len(todo)} to time",
                flush=True,
            )
            bar = _Progress(f"G={g}: ")
            done = iter(range(1, len(todo) + 1))
            on_result = functools.partial(_bench_result, bar, done, len(todo))
            summary = bench.time_suite(
                s, store, settings, fp, brick_options, on_result=on_result
            )
            print(
                f"G={g}: timed {len(summary.timed)}, already stored "
                f"{len(summary.skipped)}, noisy {len(summary.noisy)}, "
                f"{summary.wall_s:.1f} s; store {db}",
                flush=True,
            )


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
    from dlbricks_tf import job, report
    from dlbricks_tf.fingerprint import system_fingerprint

    _, db, _ = _paths()
    settings = _start_tensorflow(_INTRA.value, _INTER.value, _BATCH.value)
    fp = system_fingerprint()
    with _open_store(db, must_exist=True) as store:
        rows = []
        for g in gs:
            rows += job.estimate_models(
                sources, g, settings, fp, store, _MODE.value,
                safe_mode=safe_mode,
            )  # fmt: skip
    print(report.format_estimates(rows))


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


def _main(argv: list[str]) -> None:
    from dlbricks_tf import job

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
    # Names and files are checked before TensorFlow runs its first op.
    default = job.DEFAULT_MODELS
    if command == "analyze":  # It only decomposes: the whole corpus.
        from dlbricks_tf import corpus

        default = list(corpus.APPLICATIONS)
    sources = job.resolve_models(_MODELS.value or default)
    gs = _granularities(_GRANULARITY.value)
    if command == "analyze" and len(gs) > 1:
        raise app.UsageError("analyze takes one --granularity.")
    handler = globals()[f"_cmd_{command}"]
    handler(sources, gs, not _UNSAFE.value)


def _quiet() -> bool:
    return logging.get_verbosity() < logging.DEBUG


def main(argv: list[str]) -> None:
    """Runs a command; bad input ends in one line on stderr, exit 1 or 2."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
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
    except KeyboardInterrupt:
        _exit("Interrupted: the results stored so far are kept.", 130)


def _exit(message: str, code: int) -> None:
    sys.stdout.flush()
    print(f"dlbricks: error: {_one_line(message)}", file=sys.stderr)
    sys.exit(code)


def _parse_flags(argv: list[str]) -> list[str]:
    """Parses flags; a bad flag is one line on stderr and exit code 2."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        _exit(f"{e}. See --helpfull.", 2)
        raise  # Unreachable: _exit exits.


def run() -> None:
    """Entry point of the `dlbricks` console script."""
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
