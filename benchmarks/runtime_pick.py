r"""Which runtime the estimates pick for each model, against the measurements.

A user compares TensorFlow and ONNX Runtime per model from their
estimates (`report --compare`). This benchmark checks that choice, in one
process and one store (`--out/store.sqlite`):

1. every model and its bricks on TensorFlow, through `run`'s path
   (`job.run_granularity`, chains, the reference scale);
2. the same on ONNX Runtime (bricks in chains, ONNX files kept in
   `--out/onnx`), its reference state set to TensorFlow's first, so that
   both runtimes' milliseconds are at one state of the machine (the
   reference is the same TensorFlow workload, read by the same process);
3. each model whole, on both runtimes, in alternating rounds
   (`sampling.time_interleaved`), each sample on its runtime's scale:
   the measured pick.

A pick is wrong when the runtime the estimates pick measured more than
10% slower than the other (`compare.PICK_GAP`); a model that either
runtime cannot convert or time has no pick and is listed. Prints a
Markdown table and writes `--out/runtime_pick.json`.

Usage:
    python -m benchmarks.runtime_pick --models=MobileNetV2,ResNet50 \
        --intra_op_threads=1 --fuse
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from absl import app, flags, logging

from benchmarks import sampling_flags
from dlbricks_tf.cli import model_flags, shared_flags, timing_flags

flags.adopt_module_key_flags(sampling_flags)  # Shown by --helpshort.
flags.declare_key_flag("granularity")
flags.declare_key_flag("fuse")
flags.declare_key_flag("out")

RUNTIMES = ("tf", "onnxruntime")


def pick(estimated: Mapping[str, float], measured: Mapping[str, float]):
    """The estimates' and the measurements' runtime, and the gap.

    Args:
        estimated: {runtime: estimated ms}.
        measured: {runtime: measured ms}, the same runtimes.

    Returns:
        {"estimated": runtime, "measured": runtime, "gap": how much slower
        the estimates' pick measured than the measured fastest, "apart":
        how much slower the slower runtime measured, "wrong": the picks
        differ and the gap is over `compare.PICK_GAP`}.
    """
    from dlbricks_tf.reporting import compare

    by_estimate = min(estimated, key=estimated.__getitem__)
    by_measurement = min(measured, key=measured.__getitem__)
    fastest = measured[by_measurement]
    gap = measured[by_estimate] / fastest - 1
    return {
        "estimated": by_estimate,
        "measured": by_measurement,
        "gap": gap,
        "apart": max(measured.values()) / fastest - 1,
        "wrong": by_estimate != by_measurement and gap > compare.PICK_GAP,
    }


def _jobs(sources, g, settings, fp, store, options, brick_options, out):
    """Runs every model on both runtimes; returns ({runtime: {model: row}},
    {model: reason it has no pick})."""
    import dataclasses

    from dlbricks_tf import errors
    from dlbricks_tf.running import job

    rows: dict[str, dict[str, dict]] = {r: {} for r in RUNTIMES}
    skipped: dict[str, str] = {}
    ort = dataclasses.replace(settings, backend="onnxruntime", protocol=None)
    for backend, run in (("tf", settings), ("onnxruntime", ort)):
        if backend == "onnxruntime":
            state = store.reference_state(settings, fp)
            workload = store.reference_workload(settings, fp)
            if state is not None and workload is not None:
                store.put_reference_state(ort, fp, state, workload)
        for source in sources:
            if source.name in skipped:
                continue
            try:
                result = job.run_granularity(
                    [source],
                    g,
                    run,
                    fp,
                    store,
                    options,
                    brick_options,
                    fuse=shared_flags.FUSE.value,
                    reference=timing_flags.REFERENCE.value,
                    onnx_folder=out / "onnx",
                    log=lambda line: logging.info("%s", line),
                )
            except errors.Error as e:
                skipped[source.name] = f"{backend}: {str(e).splitlines()[0]}"
                logging.warning("%s %s: %s", backend, source.name, e)
                continue
            (row,) = result.runs
            rows[backend][source.name] = row
    return rows, skipped


def _measure(sources, settings, fp, store, options, out, names):
    """{model: {runtime: ms}}: each model whole on both runtimes, in
    alternating rounds, on their scales."""
    import dataclasses

    import keras

    from dlbricks_tf.measuring import brick_timing
    from dlbricks_tf.measuring import reference as reference_lib
    from dlbricks_tf.measuring.sampling import time_interleaved

    ort = dataclasses.replace(settings, backend="onnxruntime", protocol=None)
    scales = {}
    if timing_flags.REFERENCE.value:
        reference = reference_lib.Reference()
        scales = {
            r: reference_lib.ReferenceScale.for_store(reference, store, s, fp)
            for r, s in (("tf", settings), ("onnxruntime", ort))
        }
    measured = {}
    for source in sources:
        if source.name not in names:
            continue
        keras.backend.clear_session()
        model = source.build(True)
        onnx = brick_timing.model_onnx_file(
            model, out / "onnx", source.name, settings.batch_size
        )
        timers = {
            "tf": brick_timing.model_timer(
                model, settings, options, scale=scales.get("tf")
            ),
            "onnxruntime": brick_timing.model_timer(
                onnx, ort, options, scale=scales.get("onnxruntime")
            ),
        }
        results = time_interleaved(list(timers.values()))
        measured[source.name] = {
            r: t.center_ms for r, t in zip(timers, results, strict=True)
        }
        logging.info("%s measured %s", source.name, measured[source.name])
    return measured


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.running import job
    from dlbricks_tf.storing.store import Store

    try:
        sources = job.resolve_models(sampling_flags.model_names())
    except job.ModelSourceError as e:
        raise app.UsageError(str(e)) from None
    settings = settings_lib.RunSettings.default(
        sampling_flags.BATCH.value,
        intra_op_threads=sampling_flags.INTRA.value,
        inter_op_threads=sampling_flags.INTER.value,
    )
    process_lib.configure_threads(
        settings.intra_op_threads, settings.inter_op_threads
    )
    options, brick_options = sampling_flags.options(settings.protocol)
    g = model_flags.one_granularity()
    out = Path(shared_flags.OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    fp = system_fingerprint()
    with Store(out / "store.sqlite") as store:
        rows, skipped = _jobs(
            sources, g, settings, fp, store, options, brick_options, out
        )
        both = [
            s.name for s in sources if all(s.name in rows[r] for r in RUNTIMES)
        ]
        measured = _measure(sources, settings, fp, store, options, out, both)
    report = []
    for name in both:
        estimated = {r: rows[r][name]["estimated_ms"] for r in RUNTIMES}
        entry = {
            "model": name,
            "estimated_ms": estimated,
            "measured_ms": measured[name],
            "normalized": {r: rows[r][name]["normalized"] for r in RUNTIMES},
            **pick(estimated, measured[name]),
        }
        report.append(entry)
    summary = {
        "settings": settings.to_dict(),
        "granularity": g,
        "fuse": shared_flags.FUSE.value,
        "fingerprint": fp.to_dict(),
        "models": report,
        "skipped": skipped,
    }
    (out / "runtime_pick.json").write_text(json.dumps(summary, indent=1))
    _print(report, skipped)
    print(f"\nRows: {out / 'runtime_pick.json'}")


def _print(report, skipped) -> None:
    print(
        "| model | estimated ms tf / ort | measured ms tf / ort "
        "(same rounds) | normalized tf / ort | estimates pick | "
        "measurements pick | apart | wrong |"
    )
    print("|---|---:|---:|---:|---|---|---:|---|")
    for r in report:
        e, m, n = r["estimated_ms"], r["measured_ms"], r["normalized"]
        print(
            f"| {r['model']} | {e['tf']:.3f} / {e['onnxruntime']:.3f} "
            f"| {m['tf']:.3f} / {m['onnxruntime']:.3f} "
            f"| {n['tf']:.3f} / {n['onnxruntime']:.3f} | {r['estimated']} "
            f"| {r['measured']} | {r['apart']:.1%} "
            f"| {'**yes**' if r['wrong'] else 'no'} |"
        )
    apart = [r for r in report if r["apart"] > 0.10]
    wrong = [r for r in report if r["wrong"]]
    print(
        f"\n{len(wrong)} wrong pick(s) of {len(report)} models; "
        f"{len(apart)} of them measured more than 10% apart."
    )
    for name, reason in skipped.items():
        print(f"no pick for {name}: {reason}")


if __name__ == "__main__":
    flags.FLAGS.set_default("out", "dlbricks_out/runtime_pick")
    flags.FLAGS.set_default("intra_op_threads", 1)
    app.run(main)
