"""`dlbricks run` (the default): the whole job on --models.

Decomposes every model, times the unique bricks not yet stored and every
model end to end in interleaved rounds, estimates, prints measured vs
estimated latency, and writes the store, report.json and TensorBoard logs
under --out (`dlbricks_tf.running.job.run_job`). With --budget=SECONDS,
the bricks are timed within that many seconds per G, those that narrow the
estimates most per second first, and the others predicted
(`dlbricks_tf.running.budget`); every model is still timed end to end.
"""

from __future__ import annotations

import os
import time

from absl import flags

from dlbricks_tf.cli import (
    bench_command,
    budget_flags,
    outputs,
    progress,
    shared_flags,
    startup,
    timing_flags,
)
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.reporting import board, report
from dlbricks_tf.running import job

RETIME = flags.DEFINE_bool(
    "retime", False, "Time every brick again, even those already stored."
)
ANCHORS = flags.DEFINE_bool(
    "anchors",
    False,
    "A model whose brick calls are mostly stored already (timed beside "
    "other models, or in an earlier run) gets its heaviest stored bricks "
    "timed again beside it, not stored: their drift since they were "
    "stored carries its stored bricks half-way (in logs) to the moment of "
    "its own measurement, and its range widens by what the two estimates "
    "disagree. Off by default: runs of the 40 models with it read fewer "
    "models within +-10% than runs without it, and cost more "
    "(docs/measuring.md).",
)
GRAPHS = flags.DEFINE_integer(
    "graphs",
    3,
    "run: bricks whose layer-level graph goes to TensorBoard.",
    lower_bound=0,
)

flags.register_multi_flags_validator(
    ["budget", "retime"],
    lambda f: f["budget"] is None or not f["retime"],
    message="--budget keeps the stored timings and predicts what it does "
    "not time; --retime times every brick again: drop one",
)


def run(sources, gs, safe_mode) -> None:
    """Runs the job at every G of `gs` and prints its tables."""

    out, db, logdir = outputs.paths()
    outputs.make_dirs(out, logdir)
    settings = startup.start_backend()
    options, brick_options = timing_flags.options(settings.protocol)
    names = ", ".join(s.name for s in sources)
    print(
        f"dlbricks run: {names} at G={','.join(map(str, gs))}, batch "
        f"{settings.batch_size}, threads {settings.intra_op_threads}x"
        f"{settings.inter_op_threads} on {settings.backend}; store {db}",
        flush=True,
    )
    budget = budget_flags.BUDGET.value
    if budget is not None:
        print(
            f"Budget: {budget:g} s of brick timing per G, the bricks that "
            "narrow the estimates most per second first, the others "
            "predicted; every model is still timed end to end",
            flush=True,
        )
    start = time.perf_counter()
    bar = progress.Progress()
    with outputs.open_store(db) as store:
        rep, details = job.run_job(
            sources,
            gs,
            settings,
            store,
            options,
            brick_options,
            fingerprint=system_fingerprint(),
            report_path=os.path.join(out, "report.json"),
            reuse_stored=not RETIME.value,
            safe_mode=safe_mode,
            progress=bar,
            log=bar.log,
            fuse=shared_flags.FUSE.value,
            onnx_folder=os.path.join(out, "onnx"),
            reference=timing_flags.REFERENCE.value,
            budget_s=budget,
            probe_count=budget_flags.PROBE_COUNT.value,
            anchors=ANCHORS.value,
        )
    board.write_board(logdir, rep, details, graphs=GRAPHS.value)
    print()
    print(report.format_report(rep))
    if noisy := report.format_noisy(rep["runs"]):
        print(f"\n{noisy}")
    print(f"\nWall time: {time.perf_counter() - start:.0f} s")
    print(f"Store:  {db}")
    print(f"Report: {os.path.join(out, 'report.json')}")
    print(f"TensorBoard: tensorboard --logdir {logdir}", flush=True)
    failed = {}
    for detail in details.values():
        failed.update(detail.failed)
    if failed:
        print(f"\n{report.format_failed(rep['runs'])}", flush=True)
    bench_command.fail_if_any_failed(list(failed.items()))
