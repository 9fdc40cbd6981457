r"""Accuracy and speed-up of DLBricks on a corpus of keras.applications models.

For each granularity G and each model: decompose the model, then time the
whole model and its bricks not yet timed at this G in interleaved rounds
(one sample of each per round), so that the ratio estimate / measured
compares measurements taken close together in time. Writes `report.json`
and prints a Markdown table.

Figures, per G: geometric mean, min and max of the normalized latency
(sequential estimate / measured end to end), the paper's speed-up (sum of
end-to-end latencies / sum of unique-brick latencies), and the wall-clock
time of the brick campaign (decomposing, building and timing the unique
bricks) against that of timing every model end to end (building the timer
and sampling), both with the same protocol in the same run; and the median
relative difference of --recheck bricks timed a second time.

Every G times its unique bricks afresh; results are written to the store
(for export), not read from it.

The corpus: one keras.applications model per family (--models to choose,
--all for the 40), or with --hub the keras_hub transformers of
`corpus.HUB_BACKBONES` (BERT, GPT-2, Gemma, Mistral at the size of
BERT-Mini, fresh weights, nothing downloaded), cut and timed at
--sequence_length tokens.

The models, G (--granularities, an alias of --granularity), the batch
size, threads, sampling flags and --out are the command line's flags
(`benchmarks.sampling_flags`), with defaults of their own here.

Usage:
    python -m benchmarks.accuracy --models=ResNet50,MobileNetV2 \
        --granularities=1 --out=dlbricks_out/accuracy
    python -m benchmarks.accuracy --hub --granularities=1,2,3 \
        --out=dlbricks_out/hub_accuracy
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from absl import app, flags, logging

from benchmarks import (
    neighbour_flags,
    noisy_neighbour,
    sampling_flags,
    sweep_flags,
)
from dlbricks_tf.cli import (
    model_flags,
    run_command,
    shared_flags,
    timing_flags,
)
from dlbricks_tf.cutting import split as split_lib
from dlbricks_tf.models import corpus
from dlbricks_tf.running import report_json

# Shown by --helpshort.
flags.adopt_module_key_flags(sampling_flags)
flags.adopt_module_key_flags(sweep_flags)
flags.declare_key_flag("out")
_HUB = flags.DEFINE_bool(
    "hub",
    False,
    "Use the keras_hub transformers of dlbricks_tf.models.corpus.HUB_BACKBONES "
    "(BERT, GPT-2, Gemma, Mistral; small, no download) at "
    "--sequence_length tokens instead of keras.applications models "
    "(overrides --models).",
)
_LENGTH = flags.DEFINE_integer(
    "sequence_length",
    corpus.HUB_LENGTH,
    "--hub: the sequence length the models are cut and timed at.",
    lower_bound=1,
)
_RECHECK = flags.DEFINE_integer(
    "recheck",
    10,
    "Bricks per G timed a second time to check repeatability.",
    lower_bound=0,
)
_SPLITS = flags.DEFINE_multi_enum(
    "split",
    ["plain"],
    list(split_lib.SPLITS),
    "How models are cut: plain (G layer calls) and/or fused (a "
    "convolution or dense layer stays with its BatchNormalization and "
    "activation; G counts such units). Repeat the flag for both.",
)


def _sources():
    """The corpus as `job.ModelSource`s (app.UsageError for a bad name)."""
    from dlbricks_tf.running import job

    if _HUB.value:
        return [
            job.ModelSource(
                name, builder=functools.partial(corpus.hub_backbone, name)
            ).at_shapes({"*": (_LENGTH.value,)})
            for name in corpus.HUB_BACKBONES
        ]
    names = sampling_flags.model_names()
    try:
        return job.resolve_models(names)
    except job.ModelSourceError as e:
        raise app.UsageError(str(e)) from None


def _run_granularity(
    g, sources, settings, fp, options, brick_options, store, fuse
):
    """Measures every model at one G; returns (runs, corpus row)."""
    from dlbricks_tf.running import job

    result = job.run_granularity(
        sources,
        g,
        settings,
        fp,
        store,
        options,
        brick_options,
        reuse_stored=False,  # Every G times its unique bricks afresh.
        fuse=fuse,
        log=lambda line: logging.info("%s", line),
        reference=timing_flags.REFERENCE.value,
        anchors=run_command.ANCHORS.value,
    )
    if settings.protocol == "chain":
        # A chain times every brick at once: any --recheck re-times them all.
        repeat = (
            _recheck_chains(result, settings, brick_options)
            if _RECHECK.value
            else {}
        )
    else:
        repeat = _recheck(result.suite, result.results, settings, brick_options)
    return result.runs, {**result.corpus, **repeat}


def _recheck_chains(result, settings, options) -> dict:
    """Times the whole suite again in new chains; compares the medians.

    New chains mean new traces: the figure says how far a second campaign
    moves each brick (those of at least 20 us) and each model's estimate.
    """
    import functools

    from dlbricks_tf.estimating import estimate as estimate_lib
    from dlbricks_tf.measuring import campaign

    bricks = [
        campaign.ChainedBrick(
            e.signature, functools.partial(e.brick.build, settings.batch_size)
        )
        for e in result.suite.entries
    ]
    weights = {}
    for e in result.suite.entries:
        for name, count in e.counts:
            weights.setdefault(name, {})[e.signature] = count
    again = {}
    campaign.time_chains(
        campaign.ordered(bricks, options.chain_order, options.seed + 1),
        settings,
        options,
        weights=weights,
        on_result=again.__setitem__,
    )
    first = result.results
    diffs = sorted(
        abs(again[k].median_ms - first[k].median_ms) / first[k].median_ms
        for k in again
        if first[k].median_ms >= 0.02
    )
    models = sorted(
        abs(
            estimate_lib.estimate(d, again).ms
            / estimate_lib.estimate(d, first).ms
            - 1
        )
        for d in result.decompositions.values()
    )
    if not diffs:
        return {}
    return {
        "repeat_bricks": len(diffs),
        "repeat_median_rel_diff": diffs[len(diffs) // 2],
        "repeat_within_2pct": sum(d <= 0.02 for d in diffs) / len(diffs),
        "repeat_estimate_median_rel_diff": models[len(models) // 2],
    }


def _recheck(suite, results, settings, options) -> dict:
    """Times a spread of the suite's bricks again; compares the medians."""
    from dlbricks_tf.measuring import timing

    # Near-empty bricks (Reshape, Dropout: ~0-1 us once the loop's own cost
    # is subtracted) have meaningless relative differences; re-time those
    # that take at least 20 us.
    timed = [e for e in suite.entries if results[e.signature].median_ms >= 0.02]
    count = min(_RECHECK.value, len(timed))
    if not count:
        return {}
    ordered = sorted(timed, key=lambda e: e.signature)
    step = len(ordered) / count
    diffs = []
    for i in range(count):
        entry = ordered[int(i * step)]
        built = entry.brick.build(settings.batch_size)
        again = timing.time_model(built, settings, options)
        first = results[entry.signature].median_ms
        diffs.append(abs(again.median_ms - first) / first if first else 0.0)
    diffs.sort()
    return {
        "repeat_bricks": count,
        "repeat_median_rel_diff": diffs[len(diffs) // 2],
        "repeat_within_2pct": sum(d <= 0.02 for d in diffs) / count,
    }


def _drift(previous: dict[str, float], runs) -> dict:
    """How far the whole models moved since the last pass (minutes before).

    Each pass times every whole model again, to its precision: the median
    relative difference is the machine's own drift over a pass, the floor
    of any recheck of the bricks (which are timed as far apart).
    """
    diffs = sorted(
        abs(r["measured_ms"] - previous[r["model"]]) / previous[r["model"]]
        for r in runs
        if previous.get(r["model"])
    )
    if not diffs:
        return {}
    return {"model_drift_median_rel_diff": diffs[len(diffs) // 2]}


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    granularities = model_flags.granularities()
    if _HUB.value and sampling_flags.ALL.value:
        raise app.UsageError("--hub and --all name two corpora: pick one.")
    sources = _sources()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Thread pools first: TensorFlow fixes them at its first op.
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib

    settings = settings_lib.RunSettings.default(
        sampling_flags.BATCH.value,
        intra_op_threads=sampling_flags.INTRA.value,
        inter_op_threads=sampling_flags.INTER.value,
        protocol=timing_flags.PROTOCOL.value,
    )
    process_lib.configure_threads(
        settings.intra_op_threads, settings.inter_op_threads
    )
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.reporting.report import format_report
    from dlbricks_tf.storing.store import Store

    options, brick_options = sampling_flags.options(settings.protocol)
    out = Path(shared_flags.OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    fp = system_fingerprint()
    report = report_json.new_report(fp, settings, brick_options)
    previous: dict[str, float] = {}  # The last pass's whole models.
    with (
        Store(out / "store.sqlite") as store,
        noisy_neighbour.running(
            neighbour_flags.NEIGHBOUR.value,
            neighbour_flags.NEIGHBOUR_SEED.value,
        ) as neighbour,
    ):
        for g in granularities:
            for split in _SPLITS.value:
                runs, row = _run_granularity(
                    g, sources, settings, fp, options, brick_options, store,
                    fuse=split == "fused",
                )  # fmt: skip
                row.update(_drift(previous, runs))
                previous = {r["model"]: r["measured_ms"] for r in runs}
                report["runs"] += runs
                report["corpus"].append(row)
                # Rewrite after every run so a stopped one keeps its rows.
                (out / "report.json").write_text(json.dumps(report, indent=1))
    if neighbour.summary is not None:
        report["neighbour"] = neighbour.summary
        (out / "report.json").write_text(json.dumps(report, indent=1))
        print(f"Neighbour: {json.dumps(neighbour.summary)}")
    print(format_report(report))
    print(f"\nReport: {out / 'report.json'}")


if __name__ == "__main__":
    sweep_flags.set_default(["1", "2", "3", "4", "5", "6"])
    flags.FLAGS.set_default("out", "dlbricks_out/accuracy")
    app.run(main)
