"""`dlbricks bench`: times the unique bricks that --db does not hold.

The bricks of --models, or those of an exported --suite folder (no model
needed) on --backend=tf (its SavedModels) or onnxruntime (its ONNX
files); only one shard of them with --shard_index/--num_shards or under
Bazel sharding, a Slurm array or a Kubernetes Indexed Job. A brick that
cannot be loaded, built or timed is recorded as failed in --db and the
rest are timed (exit code 1; a rerun tries it again). SIGINT and SIGTERM
stop it after the chain (or brick) in flight, whose results are kept.
"""

from __future__ import annotations

import functools
import os
import time

from absl import app, flags

from dlbricks_tf.cli import (
    budget_flags,
    exits,
    outputs,
    progress,
    shared_flags,
    startup,
    timing_flags,
)
from dlbricks_tf.cutting import suite
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.models import probes
from dlbricks_tf.portable import suite_check, suite_dir
from dlbricks_tf.running import sharding

SUITE_BRICKS = flags.DEFINE_enum(
    "suite_bricks",
    "saved_model",
    ["saved_model", "keras"],
    "bench --suite on TF: load each brick's SavedModel (checked "
    "op by op, needs none of the author's code) or rebuild it from its "
    ".keras file (Keras safe mode; a custom layer needs --import).",
)
SHARD_INDEX = flags.DEFINE_integer(
    "shard_index",
    None,
    "bench: time only this shard (0-based) of the suite (default: from "
    "TEST_SHARD_INDEX, SLURM_ARRAY_TASK_ID or JOB_COMPLETION_INDEX).",
    lower_bound=0,
)
NUM_SHARDS = flags.DEFINE_integer(
    "num_shards",
    None,
    "bench: the number of shards the suite is cut into (default: from "
    "TEST_TOTAL_SHARDS or SLURM_ARRAY_TASK_COUNT; a Kubernetes Indexed "
    "Job must pass it).",
    lower_bound=1,
)
PROBES = flags.DEFINE_bool(
    "probes",
    False,
    "bench: time the bricks of the probe corpus (dlbricks_tf.models.probes: "
    f"{probes.COUNT} small networks of the blocks models use), "
    "which `estimate --predict` learns this machine's kernels from; "
    "with --models, theirs too.",
)
UNSAFE_SUITE = flags.DEFINE_bool(
    "unsafe_suite",
    False,
    "bench --suite: run the suite's SavedModels and ONNX files without "
    "first checking their graphs (only allow-listed ops, no external data "
    "or symlink leaving the suite folder). Only for a suite you trust: a "
    "SavedModel is a program, and running it can read or write files.",
)

flags.register_multi_flags_validator(
    ["budget", "probes", "suite"],
    lambda f: f["budget"] is None or not (f["probes"] or f["suite"]),
    message="--budget is for bench --models (it times the probes itself "
    "when --db lacks them); drop it, --probes or --suite",
)
flags.register_multi_flags_validator(
    ["budget", "shard_index", "num_shards"],
    lambda f: (
        f["budget"] is None
        or (f["shard_index"] is None and f["num_shards"] is None)
    ),
    message="--budget chooses bricks across the whole suite; it does not "
    "go with --shard_index or --num_shards",
)
flags.register_multi_flags_validator(
    ["shard_index", "num_shards"],
    lambda f: None in f.values() or f["shard_index"] < f["num_shards"],
    message="--shard_index must be below --num_shards (shards run from 0)",
)


def bench(sources, gs, safe_mode) -> None:
    """Times what the store lacks of --models' bricks (or of --suite)."""
    from dlbricks_tf.running import bench as bench_lib

    if shared_flags.SUITE.value:
        if PROBES.value:
            raise app.UsageError(
                "--probes times the probe corpus on TensorFlow here; it does "
                "not go with --suite."
            )
        _bench_suite_dir(shared_flags.SUITE.value)
        return
    probe_sources = []
    if PROBES.value:
        # The probes alone, or beside the models named.
        given = list(sources) if shared_flags.MODELS.value else []
        probe_sources = probes.sources(budget_flags.PROBE_COUNT.value)
        sources = given + probe_sources
    out, db, _ = outputs.paths()
    shard = _shard()
    budget = budget_flags.BUDGET.value
    if budget is not None and shard.count > 1:
        raise app.UsageError(
            f"--budget chooses bricks across the whole suite; this worker "
            f"times {shard} ({shard.source}): drop --budget or the sharding."
        )
    settings = startup.start_backend()
    _, brick_options = timing_flags.options(settings.protocol)
    fp = system_fingerprint()
    build = None
    if settings.backend == "onnxruntime":
        build = functools.partial(
            _onnx_brick, os.path.join(out, "onnx"), settings.batch_size
        )
    # SIGINT/SIGTERM: finish and commit the chain (or brick) in flight,
    # then stop.
    failed = []
    with outputs.open_store(db) as store, bench_lib.StopSignals() as stop:
        for g in gs:
            cut = {
                src.name: shared_flags.decompose(src, g, safe_mode)
                for src in sources
            }
            s = suite.build_suite(cut)
            if PROBES.value:
                _keep_probe_suite(store, g, cut, probe_sources)
            part = f"{len(s)} unique bricks of {s.total_bricks}"
            if budget is not None:
                failed += _time_budget(
                    f"G={g}",
                    part,
                    s,
                    g,
                    store,
                    settings,
                    fp,
                    brick_options,
                    stop,
                )
                continue
            if shard.count > 1:
                s, whole = s.shard(shard.index, shard.count), s
                part = f"{len(s)} of the {len(whole)} unique bricks"
            failed += _time_suite(
                f"G={g}",
                part,
                s,
                store,
                settings,
                fp,
                brick_options,
                stop,
                build=build,
            )
        if PROBES.value and budget is None and shard.count == 1:
            _keep_predictor(store, settings, fp)
    fail_if_any_failed(failed)


def _keep_probe_suite(store, g, cut, probe_sources) -> None:
    """Keeps what the probes cut into at G=`g`, so that a budgeted
    campaign on this store need not cut them again to see them stored."""
    from dlbricks_tf.running import budget as budget_lib

    key = probes.cut_key(
        budget_flags.PROBE_COUNT.value, g, shared_flags.FUSE.value
    )
    signatures = suite.build_suite(
        {p.name: cut[p.name] for p in probe_sources}
    ).signatures
    budget_lib.keep_probe_suite(
        store, key, signatures, lambda line: print(line, flush=True)
    )


def _keep_predictor(store, settings, fp) -> None:
    """Fits the predictor of the store's described bricks, once, and keeps
    it in the store: a budgeted campaign (`run --budget`) or `estimate
    --predict` on this store then reads it back instead of fitting it."""
    from dlbricks_tf.running import budget as budget_lib

    print(
        "Fitting and cross-validating the predictor of the store's bricks "
        "(tens of seconds for the probes), to keep it in the store",
        flush=True,
    )
    start = time.perf_counter()
    predictor, learnt = budget_lib.fit_predictor(
        store, settings, fp, log=lambda line: print(line, flush=True)
    )
    if predictor is not None:
        print(
            f"Predictor of the store's {learnt} described bricks kept in "
            f"{store.path} ({time.perf_counter() - start:.1f} s): run "
            "--budget and estimate --predict on this store read it back",
            flush=True,
        )


def _onnx_brick(folder: str, batch_size: int, entry):
    """A suite entry's brick as an ONNX file, converted once per signature."""
    from dlbricks_tf.measuring import brick_timing

    return brick_timing.brick_onnx_file(
        entry.brick.build, folder, entry.signature, batch_size
    )


def _bench_suite_dir(folder: str) -> None:
    """bench --suite: time an exported suite folder, no model needed."""
    from dlbricks_tf.portable import suite_bench, suite_bricks
    from dlbricks_tf.running import bench as bench_lib

    _, db, _ = outputs.paths()
    suite = suite_dir.load_suite(folder)  # Checks every file's hash.
    shard = _shard()
    settings = startup.start_backend()
    _, brick_options = timing_flags.options(settings.protocol)
    fp = system_fingerprint()
    part = f"{len(suite)} bricks"
    if shard.count > 1:
        suite = suite.shard(shard.index, shard.count)
        part = f"{len(suite)} of the suite's {part}"
    label = f"suite {folder} on {settings.backend}"
    unsafe = UNSAFE_SUITE.value
    if unsafe:
        print(f"{label}: not checked (--unsafe_suite)", flush=True)
    else:
        refused = suite_check.refusals(suite, settings.backend)
        print(
            f"{label}: checked {len(suite)} bricks, refused {len(refused)}"
            + (" (recorded as failed, not run)" if refused else ""),
            flush=True,
        )
    build = suite_bench.builder(
        settings,
        SUITE_BRICKS.value,
        suite_folder=suite.folder,
        unsafe=unsafe,
    )
    with outputs.open_store(db) as store, bench_lib.StopSignals() as stop:
        failed = _time_suite(
            label,
            part,
            suite,
            store,
            settings,
            fp,
            brick_options,
            stop,
            build=build,
            describe=suite_bricks.describe,
        )
    fail_if_any_failed(failed)


def _time_suite(
    label,
    part,
    s,
    store,
    settings,
    fp,
    options,
    stop,
    build=None,
    describe=None,
) -> tuple[tuple[str, str], ...]:
    """Times what the store lacks of suite `s`; returns the failed bricks."""
    from dlbricks_tf.running import bench as bench_lib

    todo = store.missing(s.signatures, settings, fp)
    print(f"{label}: {part}; {len(todo)} to time", flush=True)
    _, on_result, on_failure = _progress(label, len(todo))
    summary = bench_lib.time_suite(
        s,
        store,
        settings,
        fp,
        options,
        on_result=on_result,
        stop=stop,
        build=build,
        on_failure=on_failure,
        scale=timing_flags.reference_scale(store, settings, fp),
        describe=describe,
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
        unit = "chain" if settings.protocol == "chain" else "brick"
        raise exits.Fail(
            f"Stopped by {stop.name} after the {unit} in flight: "
            f"{len(summary.timed)} brick(s) timed and stored at {label}, "
            f"{len(todo) - len(summary.timed) - len(summary.failed)} left; "
            "run the same command "
            "again to resume.",
            128 + stop.received,
        )
    return summary.failed


def _time_budget(
    label, part, s, g, store, settings, fp, options, stop
) -> tuple[tuple[str, str], ...]:
    """bench --budget: the suite's most useful bricks within --budget
    seconds (`running.budget`); returns the failed bricks."""
    from dlbricks_tf.running import budget

    todo = store.missing(s.signatures, settings, fp, accept_noisy=True)
    print(
        f"{label}: {part}; {len(todo)} not stored, timed within "
        f"{budget_flags.BUDGET.value:g} s",
        flush=True,
    )
    bar, on_result, on_failure = _progress(label, len(todo))
    summary = budget.time_within_budget(
        s,
        store,
        settings,
        fp,
        options,
        budget_s=budget_flags.BUDGET.value,
        granularity=g,
        probe_count=budget_flags.PROBE_COUNT.value,
        fuse=shared_flags.FUSE.value,
        scale=timing_flags.reference_scale(store, settings, fp),
        stop=stop,
        on_result=on_result,
        on_failure=on_failure,
        log=bar.log,
    )
    bar.log(
        f"{label}: timed {len(summary.timed)}, predicted "
        f"{len(summary.predicted)}, failed {len(summary.failed)}; "
        f"{summary.spent_s:.1f} s of the {summary.budget_s:g} s budget "
        f"(stopped: {summary.stopped}); apart from it, probes "
        f"{summary.probes_s:.1f} s, first predictor "
        f"{summary.first_fit_s:.1f} s; store {store.path} ({settings.key()})"
    )
    if summary.stopped == budget.SIGNAL and stop.received:
        raise exits.Fail(
            f"Stopped by {stop.name} after the chain in flight: "
            f"{len(summary.timed)} brick(s) timed and stored at {label}; "
            "run the same command again to resume.",
            128 + stop.received,
        )
    return summary.failed


def fail_if_any_failed(failed) -> None:
    """Ends bench or run with exit code 1 if any brick failed (all were
    tried)."""
    if not failed:
        return
    shown = ", ".join(sig for sig, _ in failed[:5])
    more = len(failed) - 5
    raise exits.Fail(
        f"{len(failed)} brick(s) could not be loaded, built or timed: "
        f"{shown}{f' (+{more} more)' if more > 0 else ''}. They are recorded "
        "as failed in the store with their reasons (printed above); every "
        "other brick was timed. Run the same command again to retry them.",
        1,
    )


def _shard():
    """This worker's shard of the suite (a `running.sharding.Shard`).

    From --shard_index/--num_shards, else from the variables of the engine
    running the worker (Bazel, Slurm, a Kubernetes Indexed Job); printed
    when the suite is cut. Unpacks as (index, count): cut a suite with
    `suite.shard(*shard)` when `shard.count > 1`.

    Raises:
        ShardError: If the flags and variables do not fit together.
    """

    shard = sharding.resolve_shard(SHARD_INDEX.value, NUM_SHARDS.value)
    if shard.source != "default":
        print(f"Timing {shard}", flush=True)
    return shard


def _progress(label: str, total: int):
    """(bar, on_result, on_failure) of a campaign of `total` bricks: each
    result or failure advances the bar; a failure is logged above it."""
    bar = progress.Progress(f"{label}: ")
    done = iter(range(1, total + 1))

    def on_result(signature: str, timing) -> None:
        bar(signature, next(done), total)

    def on_failure(signature: str, reason: str) -> None:
        bar.log(f"{label}: brick {signature} failed: {reason}")
        bar(signature, next(done), total)

    return bar, on_result, on_failure
