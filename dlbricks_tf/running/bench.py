"""Bench: time the bricks of a suite that the store does not hold yet.

The bricks missing from the store go through the one timing path of every
command (`dlbricks_tf.measuring.brick_timing.time_bricks`): on TF in chains
(committed chain by chain) or one traced loop per brick, on ONNX Runtime
in merged graphs split by its profiler (committed chain by chain) or one
session per brick (committed brick by brick). Either way a campaign
stopped half way resumes where it stopped and a new model costs only its
new bricks. A brick timed alone whose median does not settle is measured
once more and the more precise timing is stored, flagged `noisy` if
neither settled (a later run measures it again, see `Store.missing`); in a
chain a brick is flagged only when it keeps some model's estimate from its
precision (`dlbricks_tf.measuring.precision`).

A brick that cannot be loaded, built or timed (any error but the store's
own) does not stop the suite: it is recorded as failed in the store, with
its reason (`Store.put_failure`), and the rest of the suite is timed; the
summary lists it, and a later run tries it again.

`StopSignals` turns SIGINT and SIGTERM into a request to stop: the brick in
flight is finished and committed, then `time_suite` returns with `stopped`
set (a second signal acts at once, as without it).

Example:
    configure_threads(settings.intra_op_threads, settings.inter_op_threads)
    with Store(path) as store, StopSignals() as stop:
        summary = time_suite(suite, store, settings, fp, stop=stop)
"""

from __future__ import annotations

import dataclasses
import functools
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from dlbricks_tf.cutting.suite import Suite
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.measuring import brick_timing, sampling
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store


@dataclasses.dataclass(frozen=True)
class BenchSummary:
    """What one `time_suite` call did.

    Attributes:
        timed: Signatures timed and stored by this call, in order.
        skipped: Signatures already stored (not timed again).
        noisy: Timed signatures whose timing never settled, even measured
            twice; they are stored flagged.
        remeasured: Timed signatures measured a second time because the
            first timing did not settle.
        wall_s: Wall-clock seconds spent, building bricks included.
        stopped: Whether a stop request ended the call before every
            missing brick was timed.
        failed: (signature, reason) of each brick that could not be
            loaded, built or timed; recorded in the store as failed.
    """

    timed: tuple[str, ...]
    skipped: tuple[str, ...]
    noisy: tuple[str, ...]
    wall_s: float
    remeasured: tuple[str, ...] = ()
    stopped: bool = False
    failed: tuple[tuple[str, str], ...] = ()

    @property
    def measurements(self) -> int:
        """Timings taken: one per timed brick, two for re-measured ones."""
        return len(self.timed) + len(self.remeasured)


def build_brick(settings: Any, entry: Any) -> Any:
    """What TF times of an entry cut in memory: a `BrickProgram` of fresh
    layers under the chain protocol (no `keras.Model` to build,
    `dlbricks_tf.cutting.program`), its built `keras.Model` otherwise."""
    from dlbricks_tf.cutting import program

    if settings.protocol == "chain" and settings.backend == "tf":
        return program.program(entry.brick, settings.batch_size)
    return entry.brick.build(batch_size=settings.batch_size)


def time_suite(
    suite: Suite,
    store: Store,
    settings: settings_lib.RunSettings,
    fingerprint: SystemFingerprint,
    options: sampling.TimingOptions | None = None,
    *,
    accept_noisy: bool = False,
    check_settings: bool = True,
    on_result: Callable[[str, Timing], None] | None = None,
    stop: Callable[[], bool] | None = None,
    measure: Callable[[Any], Timing] | None = None,
    build: Callable[[Any], Any] | None = None,
    on_failure: Callable[[str, str], None] | None = None,
    scale: Any = None,
    describe: Callable[[Any], str | None] | None = None,
) -> BenchSummary:
    """Times every brick of `suite` missing from `store`, committing each.

    The bricks go through the one timing path of every command
    (`dlbricks_tf.measuring.brick_timing.time_bricks`): chains, a loop
    per brick or ONNX Runtime sessions, as `settings` say.

    Args:
        suite: The unique bricks (or a shard of them, see `Suite.shard`).
        store: Where results are read and written.
        settings: Run settings in force in this process.
        fingerprint: This machine's fingerprint.
        options: Sampling options of the bricks.
        accept_noisy: Count stored noisy results as done (else retime them).
        check_settings: Verify `settings` against the process first.
        on_result: Called with (signature, timing) after each commit.
        stop: Asked before each chain or brick; True ends the call early
            (e.g. a `StopSignals`). The one in flight is always finished
            first.
        measure: Times one suite entry (called again to re-measure it),
            instead of the backend's own timer; loop protocol only.
        build: Returns what an entry's brick runs as: a `keras.Model`
            (TF), or a `onnx_files.OnnxFile` (ONNX Runtime; see
            `dlbricks_tf.portable.suite_bench.builder`). Default: the
            entry's brick built at the settings' batch size.
        on_failure: Called with (signature, reason) after a brick that
            could not be loaded, built or timed is recorded as failed.
        scale: A `dlbricks_tf.measuring.reference.ReferenceScale`: every
            batch of samples is scaled to the machine's reference state.
        describe: Returns an entry's brick description
            (`dlbricks_tf.cutting.description`) or None, kept with its
            timing, and for a brick already stored without one (timed
            before stores kept them). Default: `entry.brick.describe()` (an
            entry cut in memory); an exported suite's entries need
            `dlbricks_tf.portable.suite_bricks.describe`.

    Returns:
        What was timed, skipped and failed.

    Raises:
        StoreError: If a result cannot be written.
    """
    if build is None:
        build = functools.partial(build_brick, settings)

    if describe is None:

        def describe(entry: Any) -> str | None:
            brick = getattr(entry, "brick", None)
            return brick.describe() if brick is not None else None

    todo = store.missing(
        suite.signatures, settings, fingerprint, accept_noisy=accept_noisy
    )
    wanted = set(todo)
    skipped = tuple(s for s in suite.signatures if s not in wanted)
    # In the order chains take them, among the bricks still to time.
    entries = {e.signature: e for e in suite.chain_order(wanted)}
    bricks = [
        brick_timing.BrickToTime(
            signature,
            functools.partial(build, entry),
            getattr(entry, "id_bounds", None),
            functools.partial(describe, entry),
        )
        for signature, entry in entries.items()
    ]
    _describe_stored(store, suite, wanted, describe)
    summary = brick_timing.time_bricks(
        bricks,
        settings,
        fingerprint,
        store,
        options,
        weights=brick_timing.model_weights(suite.entries),
        known=store.results(settings, fingerprint),
        stop=stop,
        check_settings=check_settings,
        measure=(
            None
            if measure is None
            else (lambda brick: measure(entries[brick.key]))
        ),
        on_result=on_result,
        on_failure=on_failure,
        scale=scale,
    )
    return BenchSummary(
        timed=summary.timed,
        skipped=skipped,
        noisy=summary.noisy,
        wall_s=summary.wall_s,
        remeasured=summary.remeasured,
        stopped=summary.stopped,
        failed=summary.failed,
    )


def _describe_stored(
    store: Store,
    suite: Suite,
    todo: set[str],
    describe: Callable[[Any], str | None],
) -> None:
    """Keeps the descriptions the store lacks of bricks it already timed.

    A store written before descriptions were kept gains them as its
    bricks are met again; a brick whose description cannot be made is
    left without one, as when it is timed (`brick_timing.time_bricks`).
    """
    have = store.described()
    texts = {}
    for entry in suite.entries:
        if entry.signature in todo or entry.signature in have:
            continue
        try:
            text = describe(entry)
        except Exception:
            continue
        if text is not None:
            texts[entry.signature] = text
    store.put_descriptions(texts)


# The reason a failed brick is stored with (kept here for callers).
failure_reason = brick_timing.failure_reason


class StopSignals:
    """Turns SIGINT and SIGTERM into a stop request, while in a `with`.

    The first signal sets `received` (so `stop()` turns True) and puts the
    previous handlers back, so a second signal acts as it would have
    without this: KeyboardInterrupt for SIGINT, termination for SIGTERM.
    Handlers can only be set from the main thread; elsewhere this does
    nothing and `stop()` stays False.

    Args:
        signums: The signals to catch.

    Example:
        with StopSignals() as stop:
            summary = time_suite(..., stop=stop)
        if stop.received:
            sys.exit(128 + stop.received)
    """

    def __init__(
        self, signums: Iterable[int] = (signal.SIGINT, signal.SIGTERM)
    ) -> None:
        self._signums = tuple(signums)
        self._previous: dict[int, object] = {}
        self.received: int | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in self._signums:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()

    def __call__(self) -> bool:
        """Whether a signal asked to stop."""
        return self.received is not None

    @property
    def name(self) -> str:
        """The received signal's name ("SIGINT"), or "" if none."""
        return signal.Signals(self.received).name if self.received else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame  # Unused.
        if self.received is None:
            self.received = signum
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            # None: a handler not set from Python; the default stands in.
            signal.signal(
                signum, signal.SIG_DFL if handler is None else handler
            )
        self._previous = {}
