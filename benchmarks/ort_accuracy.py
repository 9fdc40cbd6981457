r"""Accuracy and speed-up of DLBricks on ONNX Runtime.

The ONNX Runtime counterpart of benchmarks/accuracy.py, through the same
path as `dlbricks run --backend=onnxruntime` (`job.run_granularity`): for
each granularity G and each model, decompose it, convert the bricks not
yet stored and the whole model to ONNX (tf2onnx; brick files kept per
signature in `--out/onnx/`), then time the whole model and its bricks with
ONNX Runtime in interleaved rounds (bricks in chains split by ORT's
profiler, or with --protocol=loop one session each; samples on the
reference scale unless --noreference), every result stored as it finishes
(`--out/store.sqlite`, settings with `backend="onnxruntime"`), so a
stopped run resumes (`--fresh` re-times every brick). Writes `report.json`
in the shape of benchmarks/accuracy.py and prints a Markdown table. A model
that cannot be converted or timed is listed under `errors` and left out of
the figures.

Usage:
    python -m benchmarks.ort_accuracy --models=ResNet50,MobileNetV2 \
        --granularities=1 --out=dlbricks_out/ort_accuracy
"""

from __future__ import annotations

import os
from pathlib import Path

from absl import app, flags, logging

from benchmarks import sampling_flags, sweep_flags
from dlbricks_tf.cli import model_flags, shared_flags, timing_flags
from dlbricks_tf.running import report_json

flags.adopt_module_key_flags(sampling_flags)  # Shown by --helpshort.
flags.adopt_module_key_flags(sweep_flags)
_FUSE = shared_flags.FUSE
_OUT = shared_flags.OUT
_FRESH = flags.DEFINE_bool(
    "fresh", False, "Re-time every brick and model, even if stored."
)


def _run_granularity(
    g, sources, settings, fp, options, brick_options, store, converted
):
    """Measures every model at one G on ORT; returns (runs, corpus, errors).

    Each model goes through the job's own path (`job.run_granularity`),
    one model at a time so that one that cannot be converted or timed is
    listed under `errors` and the others still count; the corpus row is
    rebuilt over the models that were measured. `converted` carries the
    whole models' ONNX files from one G to the next, as a job does.
    """
    from dlbricks_tf import errors
    from dlbricks_tf.cutting import suite as suite_lib
    from dlbricks_tf.estimating import ranges, rows
    from dlbricks_tf.running import job

    runs, failed, measured, results, decompositions = [], {}, {}, {}, {}
    walls: dict[str, float] = {}
    for source in sources:
        try:
            result = job.run_granularity(
                [source],
                g,
                settings,
                fp,
                store,
                options,
                brick_options,
                reuse_stored=not _FRESH.value,
                fuse=_FUSE.value,
                log=lambda line: logging.info("%s", line),
                onnx_folder=Path(_OUT.value) / "onnx",
                reference=timing_flags.REFERENCE.value,
                converted=converted,
            )
        except errors.Error as e:
            failed[source.name] = str(e).splitlines()[0]
            logging.warning("G=%d %s: skipped: %s", g, source.name, e)
            continue
        runs += result.runs
        measured.update(result.measured)
        results.update(result.results)
        decompositions.update(result.decompositions)
        for key in (
            "campaign_wall_s",
            "campaign_setup_s",
            "bricks_timed",
            "end_to_end_wall_s",
            "conversion_wall_s",
        ):
            walls[key] = walls.get(key, 0) + result.corpus.get(key, 0)
    if not runs:
        return runs, None, failed
    ranges.widen(runs)  # Over every model, not one at a time.
    corpus_row = rows.corpus_row(
        g,
        _FUSE.value,
        runs,
        measured,
        results,
        suite_lib.build_suite(decompositions),
        **walls,
    )
    return runs, corpus_row, failed


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    granularities = model_flags.granularities()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.machine import settings as settings_lib
    from dlbricks_tf.running import job

    try:
        sources = job.resolve_models(sampling_flags.model_names())
    except job.ModelSourceError as e:
        raise app.UsageError(str(e)) from None
    settings = settings_lib.RunSettings.default(
        sampling_flags.BATCH.value,
        intra_op_threads=sampling_flags.INTRA.value,
        inter_op_threads=sampling_flags.INTER.value,
        backend="onnxruntime",
        protocol=timing_flags.PROTOCOL.value,
    )
    from dlbricks_tf import errors
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.reporting.report import format_report
    from dlbricks_tf.storing.store import Store

    options, brick_options = sampling_flags.options(settings.protocol)
    out = Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    fp = system_fingerprint()
    report = report_json.new_report(fp, settings, brick_options)
    report["errors"] = {}
    logging.info("ONNX Runtime %s, settings %s", fp.onnxruntime, settings.key())
    try:
        with Store(out / "store.sqlite") as store:
            converted: dict = {}
            for g in granularities:
                runs, corpus_row, failed = _run_granularity(
                    g,
                    sources,
                    settings,
                    fp,
                    options,
                    brick_options,
                    store,
                    converted,
                )
                report["runs"] += runs
                if corpus_row is not None:
                    report["corpus"].append(corpus_row)
                for name, message in failed.items():
                    report["errors"][f"G={g} {name}"] = message
                # Rewrite after every G so a stopped run keeps what it did.
                report_json.write_report(report, out / "report.json")
    except errors.Error as e:  # One line, no traceback.
        raise SystemExit(f"ort_accuracy: {str(e).splitlines()[0]}") from None
    print(format_report(report))
    for key, message in report["errors"].items():
        print(f"skipped {key}: {message}")
    print(f"\nReport: {out / 'report.json'}")


if __name__ == "__main__":
    sweep_flags.set_default(["1"])
    flags.FLAGS.set_default("out", "dlbricks_out/ort_accuracy")
    app.run(main)
