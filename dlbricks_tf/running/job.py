"""The whole DLBricks job: models in, measured vs estimated latency out.

For each granularity G: decompose every model, collect the unique bricks,
then per model time the whole model and its bricks not yet timed in
interleaved rounds (one sample of each per round, so that the ratio
estimate / measured compares measurements taken close together in time on
a noisy machine; see `dlbricks_tf.measuring.rounds`), store every result
as it finishes, and rebuild each model's latency from its bricks
(sequential and parallel). The bricks are timed by the one timing path
of every command (`dlbricks_tf.measuring.brick_timing`), on TensorFlow or
ONNX Runtime as the settings say. The command line's `run` and the
accuracy benchmarks (TF and ONNX Runtime) call `run_granularity`.

Models are named by `resolve_models` (`dlbricks_tf.models.sources`, also
importable from here): `keras.applications` names or model
files (`.keras`, `.h5`, config `.json`), or built by a function of the
caller's (`ModelSource.builder`, e.g. `corpus.hub_backbone`). Resolving
does not import TensorFlow, so a caller can check names before fixing the
thread pools. A model whose inputs leave dimensions open (a transformer's
sequence length) is cut and timed at the sizes `input_shapes` gives; they
are part of its name ("bert@128"), so the same model at two lengths keeps
two results in the store.

A brick that cannot be built or timed does not stop the job: it is
recorded as failed in the store with its reason (as `bench` does), the
other bricks and models are timed, and the models that use it get no
estimate; their rows name it, and a rerun tries it again.

Example:
    configure_threads(settings.intra_op_threads, settings.inter_op_threads)
    sources = resolve_models(["MobileNetV2", "my_model.keras"])
    with Store("store.sqlite") as store:
        report = run_job(sources, [1], settings, store)
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.estimating import anchors as anchors_lib
from dlbricks_tf.estimating import ranges
from dlbricks_tf.estimating.rows import corpus_row, model_row
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import disturbed, ort_layout, rounds, steal
from dlbricks_tf.measuring import reference as reference_lib
from dlbricks_tf.measuring.sampling import MeasurementError
from dlbricks_tf.models.sources import (  # noqa: F401 (the job's names for them)
    MODEL_FILE_SUFFIXES,
    ModelSource,
    ModelSourceError,
    resolve_models,
    shape_label,
)
from dlbricks_tf.running.report_json import new_report, write_report
from dlbricks_tf.stats import Timing, timing_problem

# The default corpus of `run`: three families (inverted residuals, residual
# bottlenecks, squeeze-and-excitation) that share many bricks at G=1 and
# finish in 2-4 minutes on a 2-core machine.
DEFAULT_MODELS = ("MobileNetV2", "ResNet50", "EfficientNetB0")

# Wall-clock kind of converting bricks and models to ONNX.
CONVERSION = "conversion"

# progress(model, done, total): timers finished so far at this G.
Progress = Callable[[str, int, int], None]


@dataclasses.dataclass
class GranularityResult:
    """What `run_granularity` measured at one G.

    Attributes:
        runs: One report row per model (see `run_granularity`).
        corpus: The report's corpus row for this G.
        decompositions: {model: decomposition}.
        suite: The unique bricks, with counts.
        results: {signature: timing} of every brick of the suite.
        measured: {model: end-to-end timing}.
        remeasured: Bricks timed twice because the first timing did not
            settle (the more precise one is stored; noisy if neither
            settled).
        failed: {signature: reason} of the bricks that could not be built
            or timed (recorded as failed in the store); the models that
            use them have no estimate.
    """

    runs: list[dict[str, Any]]
    corpus: dict[str, Any]
    decompositions: dict[str, Any]
    suite: Any
    results: dict[str, Timing]
    measured: dict[str, Timing]
    remeasured: tuple[str, ...] = ()
    failed: dict[str, str] = dataclasses.field(default_factory=dict)


def run_granularity(
    sources: Sequence[ModelSource],
    granularity: int,
    settings,
    fingerprint,
    store,
    options=None,
    brick_options=None,
    *,
    reuse_stored: bool = True,
    safe_mode: bool = True,
    check_settings: bool = True,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    fuse: bool = False,
    onnx_folder: str | os.PathLike | None = None,
    reference: bool = False,
    budget_s: float | None = None,
    probe_count: int | None = None,
    anchors: bool = False,
    converted: dict[str, tuple[Any, dict[str, int] | None]] | None = None,
) -> GranularityResult:
    """Measures every model and its bricks at one G, and estimates.

    Every model is decomposed first (so the work is known), then built
    again, one at a time, to be timed: memory stays flat over a corpus.
    A model with `input_shapes` is cut and timed at them.

    A brick that cannot be built or timed is recorded as failed in the
    store (`Store.put_failure`, with `brick_timing.failure_reason`) and
    logged;
    the other bricks and models are timed. A model that uses it is still
    measured, but its row has no estimate (nan) and names the brick in
    `failed_bricks`; the corpus figures are those of the other models.

    Args:
        sources: The models.
        granularity: G.
        settings: `RunSettings` in force in this process.
        fingerprint: This machine's `SystemFingerprint`.
        store: The `Store`; every result is written as it finishes.
        options: `TimingOptions` of whole models.
        brick_options: `TimingOptions` of bricks (default: `options`).
        reuse_stored: Skip bricks the store already holds (settled) for
            these settings and machine; False times every brick afresh.
        safe_mode: Refuse Lambda layers from model files.
        check_settings: Verify `settings` against the process first.
        progress: Called with (model, timers done, timers total of this G)
            as each brick or model finishes (or a brick fails).
        log: Called with one line per model and one per failed brick.
        fuse: Keep fusion units whole (see `dlbricks_tf.decompose`).
        onnx_folder: Where ONNX files are kept, for settings with
            `backend="onnxruntime"` (bricks by signature, reused by later
            runs; whole models converted afresh, once a job: `converted`).
            Converting is charged to the report's `conversion_wall_s`, not
            to the campaign: an exported suite carries its ONNX files to
            every machine.
        reference: Scale every batch of samples, bricks' and models' alike,
            to the machine's reference state
            (`dlbricks_tf.measuring.reference`); the corpus row then keeps
            the reference's state and spread. The host's hypervisor steal
            over the G (`steal_share`, `steal_peak_share`) is kept either
            way.
        budget_s: Time the bricks within this many seconds
            (`dlbricks_tf.running.budget`): the probes first if the store
            lacks them (their seconds apart), then the bricks that narrow
            the models' ranges most per second, the others predicted;
            every model is still measured end to end, the campaign's
            rounds spread over the models (each model's share of the
            budget, its chains' passes between the model's batches).
            Rows then carry `predicted_bricks` and `predicted_share`, and
            the corpus row the budget's figures. None: every brick is
            timed, interleaved with its model. TF only.
        probe_count: The probes timed under a budget (default: all).
        anchors: A model whose brick calls are mostly stored already gets
            anchors (`dlbricks_tf.estimating.anchors`): its heaviest
            stored bricks, timed again beside it in its rounds (not
            stored), carry its stored bricks half-way (in logs) to the
            phase of its own measurement; its row gives `anchor_bricks`,
            `anchor_drift` (the anchors' ratio now / stored) and
            `anchor_carry` (the factor applied). TF chains only.
        converted: On ONNX Runtime, {model name: (its ONNX file, its
            reorders)} that earlier G of the same job made: a model found
            here is not converted, nor its reorders read, again (a whole
            model does not change with G); those this G makes are added.
            None: every model is converted at this G.

    Returns:
        The rows of report.json (`runs`, `corpus`) and what they came from.

    Raises:
        dlbricks_tf.Error: A model cannot be loaded, decomposed or timed
            end to end (raised once the bricks timed with it are stored).
        StoreError: A result cannot be written.
    """
    # TensorFlow only once a job runs: `import dlbricks_tf` stays light.
    import keras

    from dlbricks_tf.cutting import program
    from dlbricks_tf.cutting.decompose import decompose
    from dlbricks_tf.measuring import brick_timing

    brick_options = brick_options or options
    log = log or (lambda line: None)
    ort = settings.backend == "onnxruntime"
    if ort and onnx_folder is None:
        raise ValueError(
            "ONNX Runtime times ONNX files: pass onnx_folder, where the "
            "bricks' and models' files are kept."
        )
    if budget_s is not None and ort:
        raise ValueError("A budget times bricks on TensorFlow only.")
    # "setup" is the campaign's part that no sampling cap shortens:
    # decomposing, building, and each brick timer's trace and warm-up.
    clock = rounds.WallClock(
        (rounds.CAMPAIGN, rounds.SETUP, rounds.END_TO_END, CONVERSION)
    )
    setup = (rounds.CAMPAIGN, rounds.SETUP)
    meter = steal.StealMeter()
    meter.start()
    scale = None
    if reference:  # Its trace and first calibration are campaign setup.
        # The state is found once the models are cut (below).
        scale = clock.run(
            setup,
            reference_lib.ReferenceScale.for_store,
            clock.run(setup, reference_lib.Reference),
            store,
            settings,
            fingerprint,
        )

    decompositions = {}
    for source in sources:
        # Building an application is not part of the campaign: a file's
        # config is read by decompose itself.
        target = source.path or source.build(safe_mode)
        decompositions[source.name] = clock.run(
            setup,
            decompose,
            target,
            granularity,
            safe_mode=safe_mode,
            fuse=fuse,
            input_shapes=source.shapes,
        )
        del target
        keras.backend.clear_session()
    suite = suite_lib.build_suite(decompositions)
    if scale is not None:  # Every model cut: the store gets its state now.
        clock.run(setup, lambda: scale.state_ms)
    results: dict[str, Timing] = {}
    # ONNX Runtime: the NCHWc reorders the chains timed, by key, and those
    # each model's own graph runs (`ort_layout`), priced into its estimate.
    layout: dict[str, Timing] = {}
    reorders: dict[str, dict[str, int] | None] = {}
    if reuse_stored:
        # Under a budget a noisy stored timing is kept: it is still
        # better than a prediction, and the budget goes to new bricks.
        stored = store.results(
            settings, fingerprint, accept_noisy=budget_s is not None
        )
        results = {
            s: stored[s]
            for s in suite.signatures
            if s in stored
            and (
                budget_s is None
                or timing_problem(stored[s].to_dict(), ordered=False) is None
            )
        }
        if ort:
            layout = store.results(settings, fingerprint, layout=True)
    total = len(sources) + len(suite) - len(results)
    done = [0]
    if progress is not None and sources:
        progress(sources[0].name, 0, total)
    measured: dict[str, Timing] = {}
    remeasured: list[str] = []  # Bricks whose first timing did not settle.
    # {model: {signature: count}}: the estimates a chain's precision serves.
    weights = brick_timing.model_weights(suite.entries)
    failed: dict[str, str] = {}

    def finished(name: str) -> None:
        done[0] += 1
        if progress is not None:
            progress(name, done[0], total)

    def brick_done(name: str, key: str, result: Timing) -> None:
        results[key] = result  # Committed to the store already.
        finished(name)

    def anchor_or_brick(name, anchored, retimed, key, result) -> None:
        """A result of the model's campaign: an anchor's (kept apart,
        never stored) or a brick's (`brick_done`)."""
        if key in anchored:
            retimed[key] = result
        else:
            brick_done(name, key, result)

    def brick_failed(name: str, key: str, reason: str, tick=True) -> None:
        failed[key] = reason
        log(f"G={granularity} {name}: brick {key} failed: {reason}")
        if tick:
            finished(name)

    def anchor_bricks(d, model, keys) -> list[brick_timing.BrickToTime]:
        """The model's stored bricks `keys`, to time again beside it."""
        of = {}
        for brick in d.bricks:
            of.setdefault(brick.signature, brick)
        return [
            brick_timing.BrickToTime(
                key,
                functools.partial(
                    program.program, of[key], settings.batch_size, model
                ),
            )
            for key in keys
        ]

    def to_time(d, model) -> list[brick_timing.BrickToTime]:
        """The model's bricks not yet timed, each with its builder."""
        bricks = {}
        for brick in d.bricks:
            key = brick.signature
            if key in results or key in failed or key in bricks:
                continue
            if ort:  # Converted once per signature, kept for later runs.
                build = functools.partial(
                    clock.run,
                    CONVERSION,
                    brick_timing.brick_onnx_file,
                    brick.build,
                    onnx_folder,
                    key,
                    settings.batch_size,
                )
            elif settings.protocol == "chain":
                # The bricks call the model's own layers: no weights to
                # create, and no keras.Model to build where a program will
                # do (`dlbricks_tf.cutting.program`).
                build = functools.partial(
                    program.program, brick, settings.batch_size, model
                )
            else:
                build = functools.partial(brick.build, settings.batch_size)
            bricks[key] = brick_timing.BrickToTime(
                key, build, describe=brick.describe
            )
        return list(bricks.values())

    def model_runnable(source, model):
        """What the backend runs of the whole model; on ONNX Runtime, the
        reorders its graph runs are read from its file (campaign setup:
        the estimate adds them)."""
        if not ort:
            return model
        if converted is not None and source.name in converted:
            onnx_file, reorders[source.name] = converted[source.name]
            return onnx_file
        onnx_file = clock.run(
            CONVERSION,
            brick_timing.model_onnx_file,
            model,
            onnx_folder,
            source.name,
            settings.batch_size,
        )
        try:
            reorders[source.name] = clock.run(
                setup,
                ort_layout.model_reorders,
                onnx_file.path,
                settings,
                onnx_file.id_bounds,
            )
        except MeasurementError as e:  # Timed as before, without them.
            reorders[source.name] = None
            log(f"G={granularity} {source.name}: reorders not read: {e}")
        if converted is not None:
            converted[source.name] = (onnx_file, reorders[source.name])
        return onnx_file

    def make_row(
        name, d, counts, stored_before, retimed, new_bricks, spent=None
    ) -> dict:
        """A model's row of report.json, logged: its measurement against
        its estimate (with `spent`, a budget's: the rest predicted)."""
        drift = anchors_lib.drift(counts, results, retimed)
        carry = anchors_lib.carry(drift)
        row = model_row(
            name,
            granularity,
            settings,
            measured[name],
            anchors_lib.carried(results, stored_before, carry),
            d,
            failed,
            predicted=None if spent is None else spent.predicted,
            shared=None if spent is None else spent.shared,
            layout=_layout_price(reorders.get(name), layout) if ort else None,
        )
        row["anchor_bricks"] = len(retimed)
        row["anchor_drift"] = drift
        row["anchor_carry"] = carry
        if retimed and not math.isnan(row["estimated_ms"]):
            # The carry is known to its anchors' precision and to how far
            # it sits from either estimate, on the stored part.
            part = sum(
                c * results[s].center_ms * carry
                for s, c in counts.items()
                if s in stored_before
            )
            row["anchor_half"] = (
                anchors_lib.carry_precision(counts, retimed, drift)
                * part
                / row["estimated_ms"]
            )
            row["estimate_precision"] = math.hypot(
                row["estimate_precision"], row["anchor_half"]
            )
        row["new_unique_bricks"] = new_bricks
        if row["failed_bricks"] and math.isnan(row["estimated_ms"]):
            shown = "; ".join(
                f"{s}: {r}" for s, r in list(row["failed_bricks"].items())[:3]
            )
            estimate_text = (
                f"not estimated, {len(row['failed_bricks'])} brick(s) "
                f"failed ({shown})"
            )
        else:
            estimate_text = (
                f"estimated {row['estimated_ms']:.3f} ms "
                f"(x{row['normalized']:.3f}, "
                f"+-{100 * row['estimate_precision']:.1f}%"
                + (
                    f", {100 * row['predicted_share']:.0f}% predicted"
                    if row.get("predicted_share")
                    else ""
                )
                + (
                    f", {row['layout_reorders']} reorders "
                    f"{row['layout_ms']:.3f} ms of it"
                    if row.get("layout_reorders")
                    else ""
                )
                + ")"
            )
        log(
            f"G={granularity} {name}: measured "
            f"{row['measured_ms']:.3f} ms, {estimate_text}, "
            f"{row['bricks']} bricks, {new_bricks} timed"
        )
        return row

    campaign = spent = None
    if budget_s is not None:
        from dlbricks_tf.running import budget

        campaign = budget.Campaign(
            suite,
            store,
            settings,
            fingerprint,
            brick_options,
            budget_s=budget_s,
            granularity=granularity,
            known=results,
            **({"probe_count": probe_count} if probe_count else {}),
            fuse=fuse,
            check_settings=check_settings,
            scale=scale,
            on_result=results.__setitem__,
            on_failure=functools.partial(brick_failed, "bricks", tick=False),
            log=log,
            clock=clock,
        )
        # The bricks left are predicted, not timed: the progress counts
        # the models only.
        total = done[0] + len(sources)

    runs = []
    # Chains' passes and whole models' samples, and how many were left out
    # as disturbed (a neighbour's burst).
    passes, model_samples = disturbed.Tally(), disturbed.Tally()
    # Under a budget the rows wait for the campaign's last predictions:
    # (model, decomposition, brick counts, bricks stored before it).
    waiting = []
    for number, source in enumerate(sources):
        keras.backend.clear_session()
        d = decompositions[source.name]
        model = source.build(safe_mode)
        model_timer = clock.run(
            rounds.END_TO_END,
            brick_timing.model_timer,
            model_runnable(source, model),
            settings,
            options,
            check_settings=check_settings,
            input_shapes=source.shapes,
            scale=scale,
        )
        model_rounds = rounds.ModelSampler(
            model_timer, clock, functools.partial(finished, source.name)
        )
        summary = brick_timing.BrickSummary()
        counts = collections.Counter(b.signature for b in d.bricks)
        retimed: dict[str, Timing] = {}
        stored_before = {s for s in counts if s in results}
        if campaign is not None:
            # The budget's rounds are spread over the models: this
            # model's share of it, spent on its own bricks, their
            # chains' passes between the model's batches, as a full run
            # times bricks beside their models (see
            # `dlbricks_tf.running.budget`): one round at least while
            # the budget lasts and the model has a brick worth timing
            # (sized to no time left when the rounds before ran over),
            # more while a round fits what is left of the share. A
            # share left unspent goes to the models after it.
            until = budget_s * (number + 1) / len(sources)
            rounds_run = 0
            while model_rounds.error is None and (
                not rounds_run or campaign.elapsed() + campaign.round_s < until
            ):
                if not campaign.round(
                    until_s=until, between=model_rounds, among=counts
                ):
                    break
                rounds_run += 1
        else:
            bricks = to_time(d, model)
            anchored = []
            if anchors and not ort and settings.protocol == "chain":
                anchored = anchors_lib.choose(
                    counts, results, {b.key for b in bricks}
                )
                bricks += anchor_bricks(d, model, anchored)

            summary = brick_timing.time_bricks(
                bricks,
                settings,
                fingerprint,
                store,
                brick_options,
                weights=weights,
                known=results,
                between=model_rounds,
                clock=clock,
                check_settings=check_settings,
                on_result=functools.partial(
                    anchor_or_brick, source.name, frozenset(anchored), retimed
                ),
                on_failure=functools.partial(brick_failed, source.name),
                scale=scale,
                unstored=anchored,
                on_layout=layout.__setitem__,
            )
        meter.tick()
        remeasured.extend(summary.remeasured)
        measured[source.name] = model_rounds.finish()
        passes.add(summary.passes, summary.passes_left_out)
        taken = len(model_timer.samples)
        model_samples.add(taken, taken - len(model_timer.kept_samples))
        store.put_model(
            source.name, settings, fingerprint, measured[source.name]
        )
        del model, model_timer, model_rounds
        if campaign is None:
            runs.append(
                make_row(
                    source.name,
                    d,
                    counts,
                    stored_before,
                    retimed,
                    len(summary.timed),
                )
            )
        else:
            waiting.append((source.name, d, counts, stored_before))
    if campaign is not None:
        spent = campaign.summary()
        for name, d, counts, stored_before in waiting:
            new_bricks = sum(s in counts for s in spent.timed)
            runs.append(
                make_row(name, d, counts, stored_before, {}, new_bricks, spent)
            )
    meter.stop()
    # Each range gains the machine's variation, seen in the other models.
    ranges.widen(runs)
    machine = {
        **meter.summary(),
        "passes_left_out_share": passes.share,
        "model_samples_left_out_share": model_samples.share,
        **(scale.summary() if scale else {}),
    }
    timed_bricks = total - len(sources) - len(failed)
    budget_figures = {}
    if spent is not None:
        timed_bricks = len(spent.timed)
        budget_figures = {
            "budget_s": spent.budget_s,
            "budget_spent_s": spent.spent_s,
            "budget_fit_s": spent.fit_s,
            "budget_stopped": spent.stopped,
            "bricks_predicted": len(spent.predicted),
            "probes_s": spent.probes_s,
            "first_fit_s": spent.first_fit_s,
        }
    return GranularityResult(
        runs,
        corpus_row(
            granularity,
            fuse,
            runs,
            measured,
            results if spent is None else {**spent.predicted, **results},
            suite,
            len(failed),
            campaign_wall_s=clock[rounds.CAMPAIGN],
            campaign_setup_s=clock[rounds.SETUP],
            bricks_timed=timed_bricks,
            **budget_figures,
            end_to_end_wall_s=clock[rounds.END_TO_END],
            **({"conversion_wall_s": clock[CONVERSION]} if ort else {}),
            **machine,
        ),
        decompositions,
        suite,
        results,
        measured,
        tuple(remeasured),
        dict(failed),
    )


def _layout_price(
    counts: dict[str, int] | None, layout: dict[str, Timing]
) -> ort_layout.LayoutPrice | None:
    """A model's reorders priced at the chains' (None: not read)."""
    if counts is None:
        return None
    return ort_layout.price(counts, ort_layout.known_ms(layout))


def run_job(
    sources: Sequence[ModelSource],
    granularities: Sequence[int],
    settings,
    store,
    options=None,
    brick_options=None,
    *,
    fingerprint=None,
    report_path: str | os.PathLike | None = None,
    reuse_stored: bool = True,
    safe_mode: bool = True,
    check_settings: bool = True,
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    fuse: bool = False,
    onnx_folder: str | os.PathLike | None = None,
    reference: bool = False,
    budget_s: float | None = None,
    probe_count: int | None = None,
    anchors: bool = False,
) -> tuple[dict[str, Any], dict[int, GranularityResult]]:
    """Runs `run_granularity` for every G; returns the report and details.

    Args:
        sources: The models.
        granularities: The values of G, in order.
        settings: `RunSettings` in force in this process.
        store: The `Store`.
        options: `TimingOptions` of whole models.
        brick_options: `TimingOptions` of bricks (default: `options`).
        fingerprint: This machine's fingerprint (taken if None).
        report_path: Where to write report.json, rewritten after every G
            so a stopped run keeps what it did; None writes nothing.
        reuse_stored, safe_mode, check_settings, progress, log, fuse,
            onnx_folder, reference, budget_s, probe_count, anchors: As
            in `run_granularity` (a budget is each G's).

    Returns:
        (report, {G: GranularityResult}); the report as in report.json.
    """

    fingerprint = fingerprint or system_fingerprint()
    report = new_report(fingerprint, settings, brick_options or options)
    details = {}
    converted: dict = {}  # Whole models' ONNX files, made once a job.
    for g in granularities:
        result = run_granularity(
            sources,
            g,
            settings,
            fingerprint,
            store,
            options,
            brick_options,
            reuse_stored=reuse_stored,
            safe_mode=safe_mode,
            check_settings=check_settings,
            fuse=fuse,
            progress=progress,
            log=log,
            onnx_folder=onnx_folder,
            reference=reference,
            budget_s=budget_s,
            probe_count=probe_count,
            anchors=anchors,
            converted=converted,
        )
        details[g] = result
        report["runs"] += result.runs
        report["corpus"].append(result.corpus)
        if report_path is not None:
            write_report(report, report_path)
    return report, details
