r"""Accuracy and speed-up of DLBricks on ONNX Runtime.

The ONNX Runtime counterpart of benchmarks/accuracy.py. For each
granularity G: decompose every model, convert each unique brick and each
whole model to ONNX (tf2onnx, dynamic batch; files cached in
`--out/onnx/`), then, model by model, time the whole model and its bricks
not yet stored with ONNX Runtime (`dlbricks_tf.measuring.ort_timing.OrtTimer`)
in interleaved rounds, by the runner `dlbricks_tf.job.run_granularity`
uses for TF (`dlbricks_tf.measuring.rounds`: one batch of samples of each
per round, the whole model sampling for as long as any of its bricks
does, a brick that ends noisy measured once more), so that estimate and
measurement are taken close together in time. Conversion is done before
any timing starts, so TensorFlow's work does not share the machine with
a measurement.

Results go to `--out/store.sqlite` under run settings with
`backend="onnxruntime"` as they finish, so a stopped run resumes: a brick
stored (not noisy) is not timed again, and a model is timed again only if
it has no stored result or some of its bricks are timed in this run
(`--fresh` re-times everything). Writes `report.json` in the shape of
benchmarks/accuracy.py (`system`, `settings`, `runs` with measured_ms,
estimated_ms, estimated_parallel_ms, normalized; `corpus` per G with the
geometric mean, min and max of the normalized latency and the speed-up)
and prints a Markdown table. A model that cannot be converted is listed
under `errors` and left out of the figures.

Usage:
    python -m benchmarks.ort_accuracy --models=ResNet50,MobileNetV2 \
        --granularities=1 --out=dlbricks_out/ort_accuracy
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

from absl import app, flags, logging

from benchmarks import sampling_flags
from dlbricks_tf.measuring import rounds

flags.adopt_module_key_flags(sampling_flags)  # Shown by --helpshort.
_GRANULARITIES = flags.DEFINE_list("granularities", ["1"], "Values of G.")

_FUSE = flags.DEFINE_bool(
    "fuse",
    False,
    "Keep a convolution or dense layer with its BatchNormalization and "
    "activation in one brick (ONNX Runtime fuses them only in one graph).",
)
_FRESH = flags.DEFINE_bool(
    "fresh", False, "Re-time every brick and model, even if stored."
)
_OUT = flags.DEFINE_string(
    "out", "dlbricks_out/ort_accuracy", "Output folder (report, store, onnx)."
)


def _stem(name: str) -> str:
    """A file-name-safe form of a model name."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _convert(build, folder: Path, stem: str, batch_size: int):
    """(path, id bounds) of a cached or new ONNX file of a Keras model.

    `build(batch)` returns the Keras model; a dynamic batch is tried first,
    then the batch size timed (some bricks only build with a fixed one).
    The `.json` beside a file is written last: without it, the file is
    converted again.

    Raises:
        dlbricks_tf.Error: If neither converts.
    """
    from dlbricks_tf import errors
    from dlbricks_tf.measuring import ort_timing

    names = ((None, stem), (batch_size, f"{stem}-b{batch_size}"))
    for _, name in names:
        path = folder / f"{name}.onnx"
        bounds = ort_timing.load_id_bounds(path)
        if bounds is not None and path.is_file():
            return path, bounds
    failure = None
    for batch, name in names:
        try:
            model = build(batch)
            return ort_timing.convert_for_ort(
                model, folder, name, batch_size=batch
            )
        except Exception as e:  # Keras and tf2onnx raise many types.
            failure = e
    if isinstance(failure, errors.Error):
        raise failure
    raise errors.Error(f"{type(failure).__name__}: {failure}") from failure


def _prepare(g, sources, settings, stored, stored_models, folder, clock):
    """Decomposes every model and converts what will be timed.

    Returns:
        (decompositions, {model: (path, bounds)}, {signature: (path,
        bounds)}, {model: error}) for the models that can be estimated.
    """
    import keras

    from dlbricks_tf import errors
    from dlbricks_tf.cutting.decompose import decompose

    decompositions, model_files, brick_files, failed = {}, {}, {}, {}
    for i, source in enumerate(sources):
        keras.backend.clear_session()
        model = source.build()
        try:
            d = clock.run(
                (rounds.CAMPAIGN, rounds.SETUP),
                decompose,
                model,
                g,
                fuse=_FUSE.value,
            )
        except errors.Error as e:
            failed[source.name] = str(e)
            continue
        todo = [
            b
            for b in dict((b.signature, b) for b in d.bricks).values()
            if b.signature not in stored and b.signature not in brick_files
        ]
        try:
            for j, brick in enumerate(todo):
                brick_files[brick.signature] = clock.run(
                    "conversion",
                    _convert,
                    brick.build,
                    folder,
                    f"brick-{brick.signature}",
                    settings.batch_size,
                )
                if (j + 1) % 25 == 0:
                    logging.info(
                        "G=%d %s: %d/%d bricks converted",
                        g,
                        source.name,
                        j + 1,
                        len(todo),
                    )
            if todo or source.name not in stored_models:
                model_files[source.name] = clock.run(
                    "conversion",
                    _convert,
                    lambda batch, m=model: m,
                    folder,
                    f"model-{_stem(source.name)}",
                    settings.batch_size,
                )
        except errors.Error as e:
            failed[source.name] = str(e).splitlines()[0]
            logging.warning("G=%d %s: skipped: %s", g, source.name, e)
            continue
        finally:
            del model
        decompositions[source.name] = d
        logging.info(
            "G=%d prepared %d/%d: %s (%d bricks, %d unique to time, ONNX "
            "in %s)",
            g,
            i + 1,
            len(sources),
            source.name,
            len(d.bricks),
            len(todo),
            folder,
        )
    keras.backend.clear_session()
    return decompositions, model_files, brick_files, failed


def _run_granularity(g, sources, settings, fp, options, brick_options, store):
    """Measures every model at one G on ORT; returns (runs, corpus, errors)."""
    from dlbricks_tf.cutting import suite as suite_lib
    from dlbricks_tf.estimating import rows
    from dlbricks_tf.measuring import ort_timing

    clock = rounds.WallClock(
        (rounds.CAMPAIGN, rounds.SETUP, rounds.END_TO_END, "conversion")
    )
    fresh = _FRESH.value
    stored = {} if fresh else store.results(settings, fp, accept_noisy=False)
    stored_models = {
        s.name: t
        for s in sources
        if not fresh and (t := store.get_model(s.name, settings, fp))
    }
    folder = Path(_OUT.value) / "onnx"
    folder.mkdir(parents=True, exist_ok=True)
    decompositions, model_files, brick_files, failed = _prepare(
        g, sources, settings, stored, stored_models, folder, clock
    )
    suite = suite_lib.build_suite(decompositions)
    results = {s: stored[s] for s in suite.signatures if s in stored}
    total = len(model_files) + sum(s not in results for s in suite.signatures)
    progress = {"done": 0}

    def tick(name):
        progress["done"] += 1
        n = progress["done"]
        if n == total or n % 10 == 0:
            logging.info("G=%d %s: %d/%d timers done", g, name, n, total)

    runs, measured, timed = [], {}, 0
    for source in sources:
        if source.name not in decompositions:
            continue
        d = decompositions[source.name]

        def make_timer(sig):
            path, bounds = brick_files[sig]
            return ort_timing.OrtTimer(
                path, settings, brick_options, id_bounds=bounds
            )

        def on_brick(sig, timing, name=source.name):
            results[sig] = timing
            store.put(sig, settings, fp, timing)  # Committed at once.
            tick(name)

        model_rounds = None
        if source.name in model_files:
            path, bounds = model_files[source.name]
            model_rounds = rounds.ModelSampler(
                clock.run(
                    rounds.END_TO_END,
                    ort_timing.OrtTimer,
                    path,
                    settings,
                    options,
                    id_bounds=bounds,
                ),
                clock,
                functools.partial(tick, source.name),
            )
        summary = rounds.time_in_rounds(
            [b.signature for b in d.bricks if b.signature not in results],
            make_timer,
            clock,
            between=model_rounds,
            on_result=on_brick,
        )
        timed += len(summary.timed)
        if model_rounds is not None:
            measured[source.name] = model_rounds.finish()
            store.put_model(source.name, settings, fp, measured[source.name])
        else:
            measured[source.name] = stored_models[source.name]
        row = rows.model_row(
            source.name, g, settings, measured[source.name], results, d
        )
        row["new_unique_bricks"] = len(summary.timed)
        runs.append(row)
        logging.info(
            "G=%d %s: measured %.3f ms, estimated %.3f ms (x%.3f), "
            "%d bricks, %d timed",
            g,
            source.name,
            row["measured_ms"],
            row["estimated_ms"],
            row["normalized"],
            row["bricks"],
            len(summary.timed),
        )
        del model_rounds
    if not runs:
        return runs, None, failed
    corpus_row = rows.corpus_row(
        g,
        _FUSE.value,
        runs,
        measured,
        results,
        suite,
        campaign_wall_s=clock[rounds.CAMPAIGN],
        campaign_setup_s=clock[rounds.SETUP],
        bricks_timed=timed,
        end_to_end_wall_s=clock[rounds.END_TO_END],
        conversion_wall_s=clock["conversion"],
    )
    return runs, corpus_row, failed


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    try:
        granularities = [int(g) for g in _GRANULARITIES.value]
    except ValueError:
        raise app.UsageError("--granularities must be integers.") from None
    if any(g < 1 for g in granularities):
        raise app.UsageError("--granularities must be 1 or more.")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf import job
    from dlbricks_tf import settings as settings_lib

    try:
        sources = job.resolve_models(sampling_flags.model_names())
    except job.ModelSourceError as e:
        raise app.UsageError(str(e)) from None
    settings = settings_lib.RunSettings.default(
        sampling_flags.BATCH.value,
        intra_op_threads=sampling_flags.INTRA.value,
        inter_op_threads=sampling_flags.INTER.value,
        backend="onnxruntime",
    )
    from dlbricks_tf import errors
    from dlbricks_tf.fingerprint import system_fingerprint
    from dlbricks_tf.reporting.report import format_report
    from dlbricks_tf.store import Store

    # ORT times each brick alone ("loop").
    options, brick_options = sampling_flags.options("loop")
    out = Path(_OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    fp = system_fingerprint()
    report = job.new_report(fp, settings, brick_options)
    report["errors"] = {}
    logging.info("ONNX Runtime %s, settings %s", fp.onnxruntime, settings.key())
    try:
        with Store(out / "store.sqlite") as store:
            for g in granularities:
                runs, corpus_row, failed = _run_granularity(
                    g, sources, settings, fp, options, brick_options, store
                )
                report["runs"] += runs
                if corpus_row is not None:
                    report["corpus"].append(corpus_row)
                for name, message in failed.items():
                    report["errors"][f"G={g} {name}"] = message
                # Rewrite after every G so a stopped run keeps what it did.
                job.write_report(report, out / "report.json")
    except errors.Error as e:  # One line, no traceback.
        raise SystemExit(f"ort_accuracy: {str(e).splitlines()[0]}") from None
    print(format_report(report))
    for key, message in report["errors"].items():
        print(f"skipped {key}: {message}")
    print(f"\nReport: {out / 'report.json'}")


if __name__ == "__main__":
    app.run(main)
