r"""Bricks on ONNX Runtime, channels-last against channels-first edges.

For each model, its unique bricks are converted twice
(`dlbricks_tf.measuring.onnx_files`): with the Keras model's layout
(channels-last) and with `BRICK_BOUNDARY` (channels-first next to a
convolution-like op, what `run --backend=onnxruntime` times). The whole
model and both files of every brick are timed in the same interleaved
rounds (`sampling.time_interleaved`, one `OrtTimer` each), so the two
layouts are compared in the same stretch of time, and each layout's sum
of bricks (weighted by their counts) is divided by the whole model.

It also counts, weighted the same way, the Transposes of the files as
converted and the Transpose, ReorderInput and ReorderOutput nodes left
after ONNX Runtime's optimisation (`SessionOptions.optimized_model_filepath`,
every optimisation on, as timed), and with --profile prints, per op type,
the time ONNX Runtime's profiler attributes per model call to the whole
model and to each layout's bricks (profiled runs are slower: for
attribution only).

--models (keras.applications names; `make run`'s three by default),
--granularity (one G), --intra_op_threads (1 by default here) and --fuse
are the command line's flags.

Usage:
    python -m benchmarks.ort_layout --models=MobileNetV2,ResNet50 --fuse \
        --intra_op_threads=1 --profile
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
from pathlib import Path

from absl import app, flags

from dlbricks_tf.cli import model_flags, settings_flags, shared_flags

# Shown by --helpshort.
for _name in ("models", "granularity", "intra_op_threads", "fuse", "out"):
    flags.declare_key_flag(_name)
_PROFILE = flags.DEFINE_bool(
    "profile", False, "Print ONNX Runtime's per-op-type attribution."
)
_PROFILE_RUNS = flags.DEFINE_integer(
    "profile_runs", 20, "Profiled runs per file.", lower_bound=1
)
_TOP = flags.DEFINE_integer(
    "profile_top", 12, "Op types printed with --profile.", lower_bound=1
)

# Nodes counted after ONNX Runtime's optimisation: what a layout moves.
_KINDS = ("Transpose", "ReorderInput", "ReorderOutput")
_LAYOUTS = ("keras", "conv_nchw")


def _op_counts(path: str, settings) -> collections.Counter:
    """Node types of a file as converted ("raw:") and as ORT runs it."""
    import onnx

    from dlbricks_tf.measuring import ort_session

    ort = ort_session.import_onnxruntime()
    counts = collections.Counter(
        f"raw:{n.op_type}" for n in onnx.load(path).graph.node
    )
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.intra_op_num_threads = settings.intra_op_threads
        options.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        )
        options.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        graph = onnx.load(options.optimized_model_filepath).graph
        counts.update(n.op_type for n in graph.node)
    return counts


def _profile_us(path: str, settings, runs: int) -> collections.Counter:
    """Microseconds per run by op type, from ORT's profiler."""
    from dlbricks_tf.measuring import ort_chain

    return collections.Counter(ort_chain.profile_op_times(path, settings, runs))


def _model_row(name, granularity, settings, folder: Path):
    import dlbricks_tf
    from dlbricks_tf.measuring import brick_timing, onnx_files, ort_timing
    from dlbricks_tf.measuring.sampling import time_interleaved
    from dlbricks_tf.models import corpus

    model = corpus.application(name)
    d = dlbricks_tf.decompose(model, granularity, fuse=shared_flags.FUSE.value)
    counts = collections.Counter(b.signature for b in d.bricks)
    builds = {b.signature: b.build for b in d.bricks}
    whole = brick_timing.model_onnx_file(
        model, folder, name, settings.batch_size
    ).path
    files = {
        layout: {
            sig: onnx_files.onnx_file(
                build,
                folder,
                f"brick-{sig}",
                settings.batch_size,
                boundary=layout,
            ).path
            for sig, build in builds.items()
        }
        for layout in _LAYOUTS
    }
    del model
    timers = [ort_timing.OrtTimer(whole, settings)] + [
        ort_timing.OrtTimer(files[layout][sig], settings)
        for layout in _LAYOUTS
        for sig in counts
    ]
    timings = time_interleaved(timers)
    measured = timings[0].mean_ms
    row = {"model": name, "bricks": len(d.bricks), "unique": len(counts)}
    row["measured_ms"] = measured
    ops = {"whole": _op_counts(whole, settings)}
    profile = {}
    if _PROFILE.value:
        profile["whole"] = _profile_us(whole, settings, _PROFILE_RUNS.value)
    rest = iter(timings[1:])
    for layout in _LAYOUTS:
        total = 0.0
        layout_ops: collections.Counter = collections.Counter()
        layout_us: collections.Counter = collections.Counter()
        for sig, count in counts.items():
            total += count * next(rest).mean_ms
            for kind, n in _op_counts(files[layout][sig], settings).items():
                layout_ops[kind] += count * n
            if _PROFILE.value:
                us = _profile_us(
                    files[layout][sig], settings, _PROFILE_RUNS.value
                )
                for kind, t in us.items():
                    layout_us[kind] += count * t
        row[f"{layout}_ms"] = total
        row[f"{layout}_normalized"] = total / measured
        ops[layout] = layout_ops
        profile[layout] = layout_us
    row["ops"] = {
        where: {k: c[k] for k in ("raw:Transpose", *_KINDS)}
        for where, c in ops.items()
    }
    if _PROFILE.value:
        row["profile_us"] = {k: dict(v) for k, v in profile.items()}
    return row


def _print(rows) -> None:
    print(
        "| model | measured ms | bricks channels-last ms (normalized) "
        "| bricks channels-first edges ms (normalized) | Transposes as "
        "converted: model / last / first | after ORT, Transpose + Reorder: "
        "model / last / first |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        o = r["ops"]

        def after(c):
            return "+".join(str(c[k]) for k in _KINDS)

        print(
            f"| {r['model']} | {r['measured_ms']:.3f} "
            f"| {r['keras_ms']:.3f} ({r['keras_normalized']:.3f}) "
            f"| {r['conv_nchw_ms']:.3f} ({r['conv_nchw_normalized']:.3f}) "
            f"| {o['whole']['raw:Transpose']} / "
            f"{o['keras']['raw:Transpose']} / "
            f"{o['conv_nchw']['raw:Transpose']} "
            f"| {after(o['whole'])} / {after(o['keras'])} / "
            f"{after(o['conv_nchw'])} |"
        )
    for r in rows:
        if "profile_us" not in r:
            continue
        p = r["profile_us"]
        kinds = sorted(
            set().union(*p.values()),
            key=lambda k: -max(v.get(k, 0) for v in p.values()),
        )[: _TOP.value]
        print(f"\n{r['model']}: ORT profiler, us per model call")
        print("| op type | whole | bricks channels-last | channels-first |")
        print("|---|---:|---:|---:|")
        for k in kinds:
            print(
                f"| {k} | {p['whole'].get(k, 0):.0f} "
                f"| {p['keras'].get(k, 0):.0f} "
                f"| {p['conv_nchw'].get(k, 0):.0f} |"
            )


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.machine import settings as settings_lib
    from dlbricks_tf.running import job

    settings = settings_lib.RunSettings.default(
        settings_flags.BATCH.value,
        intra_op_threads=settings_flags.INTRA.value,
        inter_op_threads=settings_flags.INTER.value,
        backend="onnxruntime",
    )
    out = Path(shared_flags.OUT.value)
    folder = out / "onnx"
    folder.mkdir(parents=True, exist_ok=True)
    granularity = model_flags.one_granularity()
    names = model_flags.MODELS.value or list(job.DEFAULT_MODELS)
    from dlbricks_tf import errors

    rows = []
    for name in names:
        try:
            rows.append(_model_row(name, granularity, settings, folder))
        except errors.Error as e:  # Listed, and the others still count.
            print(f"skipped {name}: {str(e).splitlines()[0]}")
    (out / "ort_layout.json").write_text(json.dumps(rows, indent=1))
    _print(rows)
    print(f"\nRows: {out / 'ort_layout.json'}")


if __name__ == "__main__":
    flags.FLAGS.set_default("out", "dlbricks_out/ort_layout")
    flags.FLAGS.set_default("intra_op_threads", 1)
    app.run(main)
