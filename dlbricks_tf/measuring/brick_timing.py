"""The one path from "these bricks, these settings" to timings in the store.

Every command that times bricks (`run`, `bench --models`, `bench --suite`,
`bench --probes`) and the accuracy benchmarks go through `time_bricks`,
whatever the backend and protocol:

- TF, `protocol="chain"`: many bricks per traced function, timed link by
  link, to the precision of the estimates of the models that count them
  (`dlbricks_tf.measuring.campaign.time_chains`);
- TF with `protocol="loop"` (and so under XLA): one traced loop per brick
  (`dlbricks_tf.measuring.timing.Timer`), in interleaved rounds
  (`dlbricks_tf.measuring.rounds.time_in_rounds`);
- ONNX Runtime, `protocol="chain"`: the bricks' ONNX files merged into
  chains, each timed whole in one session and split among its bricks by
  ORT's profiler (`dlbricks_tf.measuring.ort_campaign.time_ort_chains`);
- ONNX Runtime with `protocol="loop"`: one session per brick
  (`ort_timing.OrtTimer`), in interleaved rounds.

On ONNX Runtime a brick's `build` returns an `OnnxFile` (see
`dlbricks_tf.measuring.onnx_files`, which converts a Keras brick once and
keeps the file per signature).

It owns what used to be written once per caller: the brick counts that
set a chain's precision (`model_weights`), committing each result to the
store as it finishes, recording a brick that cannot be built or timed as
failed (with `failure_reason`) while the others go on, stopping on
request after the chain or brick in flight, and charging the work to a
`rounds.WallClock`. `model_timer` makes the timer of a whole model on
either backend, so the whole models compared with the bricks are timed
the same way.

Importing this module imports no TensorFlow.

Example:
    bricks = [BrickToTime(b.signature, functools.partial(b.build, 1))
              for b in unique_bricks]
    summary = time_bricks(bricks, settings, fp, store, options,
                          weights=model_weights(suite))
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import (
    Callable,
    Collection,
    Iterable,
    Mapping,
    Sequence,
)
from pathlib import Path
from typing import Any

from dlbricks_tf import errors
from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import (
    campaign,
    onnx_files,
    ort_campaign,
    ort_timing,
    rounds,
    sampling,
    timing,
)
from dlbricks_tf.measuring.onnx_files import OnnxFile
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.database import StoreError

# Longest failure reason kept (ONNX Runtime's messages can run long).
_MAX_REASON = 500
# Errors that are no brick's fault: they end the campaign, never a brick.
_NOT_A_BRICK_FAULT = (StoreError, process_lib.ThreadPoolError)


@dataclasses.dataclass(frozen=True)
class BrickToTime:
    """A brick to time: its key and how to make what the backend runs.

    Attributes:
        key: Its signature (the key of its result).
        build: Returns a built `keras.Model` (TF) or an `OnnxFile` (ONNX
            Runtime); called when the brick's chain or timer is made.
        id_bounds: Exclusive id bound per flat input for a Keras model
            whose graph hides its Embeddings (a SavedModel in a
            `TFSMLayer`); None to read them from the graph.
        describe: Returns the brick's description
            (`dlbricks_tf.cutting.description`), stored with its timing;
            called once the brick is timed. None: none is stored.
    """

    key: str
    build: Callable[[], Any]
    id_bounds: tuple[int | None, ...] | None = None
    describe: Callable[[], str | None] | None = None


@dataclasses.dataclass(frozen=True)
class BrickSummary:
    """What one `time_bricks` call did.

    Attributes:
        timed: Keys timed and stored, in order.
        noisy: Timed keys stored flagged noisy.
        remeasured: Keys measured twice (loop protocol: the first timing
            did not settle).
        failed: (key, reason) of each brick recorded as failed.
        stopped: Whether `stop` ended the call before every brick.
        wall_s: Wall-clock seconds of the call.
        passes: Samples of TensorFlow's chains' links taken (0 for other
            protocols and backends).
        passes_left_out: Of those, the ones left out as disturbed.
    """

    timed: tuple[str, ...] = ()
    noisy: tuple[str, ...] = ()
    remeasured: tuple[str, ...] = ()
    failed: tuple[tuple[str, str], ...] = ()
    stopped: bool = False
    wall_s: float = 0.0
    passes: int = 0
    passes_left_out: int = 0

    @property
    def measurements(self) -> int:
        """Timings taken: one per timed brick, two for re-measured ones."""
        return len(self.timed) + len(self.remeasured)


def model_weights(entries: Iterable[Any]) -> dict[str, dict[str, int]]:
    """{model: {signature: count}} of suite entries (`entry.counts`).

    The estimates a chain's precision serves; a suite without counts (an
    exported one) gives {} and each chain is timed to its own sum.
    """
    weights: dict[str, dict[str, int]] = {}
    for entry in entries:
        for name, count in getattr(entry, "counts", ()):
            weights.setdefault(name, {})[entry.signature] = count
    return weights


def failure_reason(error: BaseException) -> str:
    """One line naming an error: its type and the first line of its text.

    A project error (`dlbricks_tf.Error`) already says what to do, so its
    text is kept whole (on one line). At most `_MAX_REASON` characters.
    """
    text = str(error).strip()
    if isinstance(error, errors.Error):
        reason = " ".join(text.split()) or type(error).__name__
    else:
        first = text.splitlines()[0].strip() if text else ""
        reason = f"{type(error).__name__}: {first}" if first else ""
        reason = reason or type(error).__name__
    if len(reason) > _MAX_REASON:
        reason = reason[: _MAX_REASON - 3] + "..."
    return reason


def _pace(between: Callable[[], None] | None) -> Callable[[], bool] | None:
    """While a whole model sampled in `between` is not done; else None."""
    if isinstance(between, rounds.ModelSampler):
        return lambda: not between.done
    return None


def time_bricks(
    bricks: Sequence[BrickToTime],
    settings: settings_lib.RunSettings,
    fingerprint: Any,
    store: Any,
    options: sampling.TimingOptions | None = None,
    *,
    weights: Mapping[str, Mapping[str, int]] | None = None,
    known: Mapping[str, Timing] | None = None,
    between: Callable[[], None] | None = None,
    clock: rounds.WallClock | None = None,
    stop: Callable[[], bool] | None = None,
    check_settings: bool = True,
    measure: Callable[[BrickToTime], Timing] | None = None,
    on_result: Callable[[str, Timing], None] | None = None,
    on_failure: Callable[[str, str], None] | None = None,
    scale: Any = None,
    unstored: Collection[str] = (),
    on_layout: Callable[[str, Timing], None] | None = None,
) -> BrickSummary:
    """Times `bricks` under `settings` and commits each result to `store`.

    The protocol follows the settings (see the module docstring); chains
    are made in the options' `chain_order`. Each result is written
    (`store.put`, with the brick's description if it has a `describe`) as
    soon as its chain or timer is done, then handed to `on_result`; a
    brick that cannot be built or timed is written as failed
    (`store.put_failure`) and handed to `on_failure`, and the others go
    on. A store or thread-pool error stops everything.

    Args:
        bricks: What to time, in order (a repeated key is timed once).
        settings: Run settings in force in this process.
        fingerprint: This machine's `SystemFingerprint`.
        store: The `Store`.
        options: Sampling options of bricks.
        weights: {model: {signature: count}} (`model_weights`): chains are
            sampled until these models' estimates are precise.
        known: Timings of bricks already stored, which the estimates in
            `weights` also sum.
        between: Called once per round (chains and loop alike): a
            `rounds.ModelSampler` samples the whole model there, so the
            model and its bricks are measured over the same stretch of
            time. With it, a loop campaign makes every timer first and
            samples all of them in the same rounds; without it, bricks
            are timed one at a time (memory stays flat, `stop` is asked
            between bricks).
        clock: Charged with the campaign's work (`CAMPAIGN`, `SETUP`).
        stop: Asked between chains and bricks (and each chain round);
            True ends the call after the one in flight.
        check_settings: Verify `settings` against the process first.
        measure: Times one brick instead of the backend's own timer
            (called again to re-measure it); loop protocol only.
        on_result: Called with (key, timing) after each commit.
        on_failure: Called with (key, reason) after a failure is stored.
        scale: A `reference.ReferenceScale`: every batch of samples is
            scaled to the machine's reference state; None: raw times.
        unstored: Keys timed only to be compared (a model's anchors,
            `dlbricks_tf.estimating.anchors`): handed to `on_result`,
            never written to the store, not in the summary's `timed`.
        on_layout: ONNX Runtime's chains only: called with (key, timing)
            of each NCHWc reorder a chain ran as an edge, after it is
            written to the store under its key
            (`dlbricks_tf.measuring.ort_layout`); not in the summary.

    Returns:
        What was timed, re-measured and failed.

    Raises:
        StoreError: If a result cannot be written.
        ThreadPoolError: If the thread pools differ from `settings`.
    """
    start = time.perf_counter()
    options = options or sampling.TimingOptions()
    clock = clock or rounds.WallClock()
    timed: list[str] = []
    noisy: list[str] = []
    failed: list[tuple[str, str]] = []

    def commit(key: str, result: Timing) -> None:
        if key not in unstored:
            store.put(key, settings, fingerprint, result, describe(key))
            timed.append(key)
            if result.noisy:
                noisy.append(key)
        if on_result is not None:
            on_result(key, result)

    def fail(key: str, error: BaseException) -> None:
        if isinstance(error, _NOT_A_BRICK_FAULT):
            raise error
        if key in unstored:  # Its stored timing stands; no anchor then.
            return
        reason = failure_reason(error)
        store.put_failure(key, settings, fingerprint, reason)
        failed.append((key, reason))
        if on_failure is not None:
            on_failure(key, reason)

    def commit_layout(key: str, result: Timing) -> None:
        store.put(key, settings, fingerprint, result)
        if on_layout is not None:
            on_layout(key, result)

    unique = list({b.key: b for b in bricks}.values())
    describers = {b.key: b.describe for b in unique}

    def describe(key: str) -> str | None:
        # The timing is stored whatever happens here: a brick whose
        # description cannot be made (a suite's file that no longer reads)
        # is only left out of what a predictor learns from.
        describer = describers.get(key)
        try:
            return describer() if describer is not None else None
        except Exception:
            return None

    if settings.protocol == "chain" and measure is None:
        if settings.backend == "onnxruntime":
            summary = ort_campaign.time_ort_chains(
                [ort_campaign.OrtBrick(b.key, b.build) for b in unique],
                settings,
                options,
                weights=weights,
                between=between,
                on_result=commit,
                on_failure=fail,
                stop=stop,
                scale=scale,
                on_layout=commit_layout,
            )
        else:
            chained = [
                campaign.ChainedBrick(b.key, b.build, b.id_bounds)
                for b in unique
            ]
            summary = campaign.time_chains(
                campaign.ordered(chained, options.chain_order, options.seed),
                settings,
                options,
                weights=weights,
                known=known,
                between=between,
                on_result=commit,
                stop=stop,
                check_settings=check_settings,
                on_failure=fail,
                scale=scale,
                pace=_pace(between) if options.keep_pace else None,
            )
        clock.add(rounds.SETUP, summary.setup_s)
        clock.add(rounds.CAMPAIGN, summary.setup_s + summary.sampling_s)
        return BrickSummary(
            timed=tuple(timed),
            noisy=tuple(noisy),
            failed=tuple(failed),
            stopped=summary.stopped,
            wall_s=time.perf_counter() - start,
            passes=summary.passes,
            passes_left_out=summary.passes_left_out,
        )

    by_key = {b.key: b for b in unique}
    make_timer = functools.partial(
        _loop_timer,
        by_key,
        settings,
        options,
        check_settings=check_settings,
        measure=measure,
        scale=scale,
    )
    remeasured: list[str] = []
    stopped = False
    # With a whole model beside them, all bricks share its rounds; alone,
    # one brick at a time.
    groups = [list(by_key)] if between is not None else [[k] for k in by_key]
    for group in groups:
        if stop is not None and stop():
            stopped = True
            break
        summary = rounds.time_in_rounds(
            group,
            make_timer,
            clock,
            between=between,
            on_result=commit,
            on_failure=fail,
        )
        remeasured += summary.remeasured
    return BrickSummary(
        timed=tuple(timed),
        noisy=tuple(noisy),
        remeasured=tuple(remeasured),
        failed=tuple(failed),
        stopped=stopped,
        wall_s=time.perf_counter() - start,
    )


def _loop_timer(
    bricks: Mapping[str, BrickToTime],
    settings: settings_lib.RunSettings,
    options: sampling.TimingOptions,
    key: str,
    *,
    check_settings: bool,
    measure: Callable[[BrickToTime], Timing] | None,
    scale: Any,
) -> rounds.Remeasurable:
    """The timer of one brick under the loop protocol, on its backend."""
    brick = bricks[key]
    if measure is not None:
        return _Measured(measure, brick)
    return model_timer(
        brick.build(),
        settings,
        options,
        check_settings=check_settings,
        id_bounds=brick.id_bounds,
        scale=scale,
    )


def model_timer(
    runnable: Any,
    settings: settings_lib.RunSettings,
    options: sampling.TimingOptions | None = None,
    *,
    check_settings: bool = True,
    id_bounds: Sequence[int | None] | None = None,
    input_shapes: Mapping[str, Sequence[int | None]] | None = None,
    scale: Any = None,
) -> rounds.Remeasurable:
    """The timer of a brick or whole model on `settings.backend`.

    Args:
        runnable: A built `keras.Model` (TF) or an `OnnxFile` (ONNX
            Runtime).
        settings: Run settings in force in this process.
        options: Sampling options.
        check_settings: Verify the thread pools first (TF).
        id_bounds: Exclusive id bound per input, overriding the graph's.
        input_shapes: Sizes of a Keras model's open input dimensions.
        scale: A `reference.ReferenceScale` for its samples, or None.

    Raises:
        MeasurementError: If `runnable` does not fit the backend.
    """
    timer = _backend_timer(
        runnable, settings, options, check_settings, id_bounds, input_shapes
    )
    timer.scale = scale
    return timer


def _backend_timer(
    runnable, settings, options, check_settings, id_bounds, input_shapes
):
    """`Timer` or `OrtTimer`, as `model_timer` says."""
    if settings.backend == "onnxruntime":
        if not isinstance(runnable, OnnxFile):
            raise sampling.MeasurementError(
                "ONNX Runtime times ONNX files; convert the Keras model "
                f"first (onnx_file). Received: {type(runnable).__name__}"
            )
        return ort_timing.OrtTimer(
            runnable.path,
            settings,
            options,
            input_specs=runnable.input_specs,
            id_bounds=runnable.id_bounds or id_bounds,
        )

    if isinstance(runnable, OnnxFile):
        raise sampling.MeasurementError(
            f"The TF backend times Keras models, not {runnable.path!r}; use "
            "--backend=onnxruntime for ONNX files."
        )
    return timing.Timer(
        runnable,
        settings,
        options,
        check_settings=check_settings,
        id_bounds=id_bounds,
        input_shapes=input_shapes,
    )


def brick_onnx_file(
    build: Callable[[int | None], Any],
    folder: str | Path,
    signature: str,
    batch_size: int,
) -> OnnxFile:
    """A brick's ONNX file, kept by signature for every later run and shard."""
    return onnx_files.onnx_file(
        build,
        folder,
        f"brick-{signature}",
        batch_size,
        boundary=onnx_files.BRICK_BOUNDARY,
    )


def model_onnx_file(
    model: Any, folder: str | Path, name: str, batch_size: int
) -> OnnxFile:
    """A whole model's ONNX file, converted afresh: a model file may change
    under the same name."""
    stem = "model-" + re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    return onnx_files.onnx_file(
        lambda batch: model, folder, stem, batch_size, reuse=False
    )


class _Measured:
    """A function measuring one brick, as a timer of `rounds`.

    One `sample()` is a whole measurement, and `restart()` lets the next
    one measure afresh: a brick timed by any `measure` is re-measured when
    noisy, as one timed by the backend's own timer.
    """

    prepare_seconds = 0.0

    def __init__(
        self, measure: Callable[[BrickToTime], Timing], brick: BrickToTime
    ) -> None:
        self._measure, self._brick = measure, brick
        self._result: Timing | None = None

    @property
    def done(self) -> bool:
        """Whether the brick has been measured since the last restart."""
        return self._result is not None

    def sample(self) -> list[float]:
        """Measures the brick; its samples are in the timing only."""
        self._result = self._measure(self._brick)
        return []

    def result(self) -> Timing:
        """The last measurement."""
        assert self._result is not None, "sample() first"
        return self._result

    def restart(self) -> _Measured:
        """Forgets the measurement; returns self."""
        self._result = None
        return self
