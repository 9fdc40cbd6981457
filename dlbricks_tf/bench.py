"""Bench: time the bricks of a suite that the store does not hold yet.

Each brick is built fresh (`brick.build(batch_size)`) and timed: under the
chain protocol many bricks at once in chains (`dlbricks_tf.measuring.campaign`),
committed chain by chain; under the loop protocol one at a time with the
harness of `dlbricks_tf.measuring.timing`, committed brick by brick. Either way
a campaign stopped half way resumes where it stopped and a new model costs
only its new bricks.

Loop protocol: a brick whose median does not settle within the sampling
caps (a noisy machine) is measured once more, with fresh samples; if the
second timing does not settle either, the more precise of the two is
stored flagged `noisy` (and a later run measures it again, see
`Store.missing`); each brick is timed alone by the runner of the job's
interleaved rounds (`dlbricks_tf.measuring.rounds`). Chain protocol: a
brick is flagged only when it keeps some model's estimate from its
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
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from dlbricks_tf import errors
from dlbricks_tf import settings as settings_lib
from dlbricks_tf.cutting.suite import Suite
from dlbricks_tf.fingerprint import SystemFingerprint
from dlbricks_tf.measuring import rounds, timing
from dlbricks_tf.stats import Timing
from dlbricks_tf.store import Store, StoreError

# Longest failure reason kept (ONNX Runtime's messages can run long).
_MAX_REASON = 500


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


def time_suite(
    suite: Suite,
    store: Store,
    settings: settings_lib.RunSettings,
    fingerprint: SystemFingerprint,
    options: timing.TimingOptions | None = None,
    *,
    accept_noisy: bool = False,
    check_settings: bool = True,
    on_result: Callable[[str, Timing], None] | None = None,
    stop: Callable[[], bool] | None = None,
    measure: Callable[[Any], Timing] | None = None,
    build: Callable[[Any], Any] | None = None,
    on_failure: Callable[[str, str], None] | None = None,
) -> BenchSummary:
    """Times every brick of `suite` missing from `store`, committing each.

    A brick that does not settle is measured once more before it is
    stored; see the module docstring.

    Args:
        suite: The unique bricks (or a shard of them, see `Suite.shard`).
        store: Where results are read and written.
        settings: Run settings in force in this process.
        fingerprint: This machine's fingerprint.
        options: Sampling options of the harness.
        accept_noisy: Count stored noisy results as done (else retime them).
        check_settings: Verify `settings` against the process first.
        on_result: Called with (signature, timing) after each commit.
        stop: Asked before each brick; True ends the call early (e.g. a
            `StopSignals`). The brick in flight is always finished first.
        measure: Times one suite entry (called again to re-measure it);
            by default its brick is built and timed with `options` by
            `dlbricks_tf.measuring.timing.time_model` (see also
            `dlbricks_tf.portable.suite_bench.measurer`). Under the chain
            protocol (`settings.protocol == "chain"`) and without `measure`,
            bricks are timed in chains instead
            (`dlbricks_tf.measuring.campaign`), to the precision of the
            estimates of the models the suite counts (each chain's sum for a
            suite without counts).
        build: Under the chain protocol, returns an entry's runnable
            `keras.Model` (default: `entry.brick.build(batch_size)`; see
            `dlbricks_tf.portable.suite_bench.builder`).
        on_failure: Called with (signature, reason) after a brick that
            could not be loaded, built or timed is recorded as failed.

    Returns:
        What was timed, skipped and failed.

    Raises:
        StoreError: If a result cannot be written.
    """
    start = time.perf_counter()
    if measure is None and settings.protocol == "chain":
        return _time_chained(
            suite,
            store,
            settings,
            fingerprint,
            options,
            accept_noisy=accept_noisy,
            check_settings=check_settings,
            on_result=on_result,
            stop=stop,
            build=build,
            on_failure=on_failure,
        )
    entries = {entry.signature: entry for entry in suite.entries}

    def make_timer(signature: str) -> rounds.Remeasurable:
        # A re-measurement restarts the timer: with the default `Timer`,
        # fresh samples without tracing the brick again.
        entry = entries[signature]
        if measure is not None:
            return _Measured(measure, entry)
        model = entry.brick.build(batch_size=settings.batch_size)
        return timing.Timer(
            model, settings, options, check_settings=check_settings
        )

    todo = store.missing(
        suite.signatures, settings, fingerprint, accept_noisy=accept_noisy
    )
    wanted = set(todo)
    skipped = tuple(s for s in suite.signatures if s not in wanted)
    timed, noisy, remeasured, failed = [], [], [], []
    stopped = False

    def commit(signature: str, result: Timing) -> None:
        store.put(signature, settings, fingerprint, result)
        timed.append(signature)
        if result.noisy:
            noisy.append(signature)
        if on_result is not None:
            on_result(signature, result)

    def fail(signature: str, error: BaseException) -> None:
        if isinstance(error, StoreError):
            raise error
        _record_failure(
            store, settings, fingerprint, signature, error, failed, on_failure
        )

    for entry in suite.entries:
        if entry.signature not in wanted:
            continue
        if stop is not None and stop():
            stopped = True
            break
        summary = rounds.time_in_rounds(
            [entry.signature], make_timer, on_result=commit, on_failure=fail
        )
        remeasured += summary.remeasured
    return BenchSummary(
        timed=tuple(timed),
        skipped=skipped,
        noisy=tuple(noisy),
        wall_s=time.perf_counter() - start,
        remeasured=tuple(remeasured),
        stopped=stopped,
        failed=tuple(failed),
    )


class _Measured:
    """A function measuring a suite entry, as a timer of `rounds`.

    One `sample()` is a whole measurement, and `restart()` lets the next
    one measure afresh: a brick timed by any `measure` is re-measured
    when noisy, as one timed by the default `Timer`.
    """

    prepare_seconds = 0.0

    def __init__(self, measure: Callable[[Any], Timing], entry: Any) -> None:
        self._measure, self._entry = measure, entry
        self._result: Timing | None = None

    @property
    def done(self) -> bool:
        """Whether the entry has been measured since the last restart."""
        return self._result is not None

    def sample(self) -> list[float]:
        """Measures the entry; its samples are in the timing only."""
        self._result = self._measure(self._entry)
        return []

    def result(self) -> Timing:
        """The last measurement."""
        assert self._result is not None, "sample() first"
        return self._result

    def restart(self) -> _Measured:
        """Forgets the measurement; returns self."""
        self._result = None
        return self


def _time_chained(
    suite: Any,
    store: Store,
    settings: settings_lib.RunSettings,
    fingerprint: SystemFingerprint,
    options: timing.TimingOptions | None,
    *,
    accept_noisy: bool,
    check_settings: bool,
    on_result: Callable[[str, Timing], None] | None,
    stop: Callable[[], bool] | None,
    build: Callable[[Any], Any] | None,
    on_failure: Callable[[str, str], None] | None,
) -> BenchSummary:
    """`time_suite` under the chain protocol: chains, committed per chain."""
    from dlbricks_tf.measuring import campaign

    start = time.perf_counter()
    options = options or timing.TimingOptions()
    todo = store.missing(
        suite.signatures, settings, fingerprint, accept_noisy=accept_noisy
    )
    wanted = set(todo)
    skipped = tuple(s for s in suite.signatures if s not in wanted)
    if build is None:

        def build(entry: Any) -> Any:
            return entry.brick.build(batch_size=settings.batch_size)

    weights: dict[str, dict[str, int]] = {}
    for entry in suite.entries:
        for model, count in getattr(entry, "counts", ()):
            weights.setdefault(model, {})[entry.signature] = count
    bricks = [
        campaign.ChainedBrick(
            entry.signature,
            functools.partial(build, entry),
            getattr(entry, "id_bounds", None),
        )
        for entry in suite.entries
        if entry.signature in wanted
    ]
    known = store.results(settings, fingerprint)

    def commit(signature: str, result: Timing) -> None:
        store.put(signature, settings, fingerprint, result)
        if on_result is not None:
            on_result(signature, result)

    failed: list[tuple[str, str]] = []

    def fail(signature: str, error: BaseException) -> None:
        if isinstance(error, StoreError):
            raise error
        _record_failure(
            store, settings, fingerprint, signature, error, failed, on_failure
        )

    summary = campaign.time_chains(
        campaign.ordered(bricks, options.chain_order, options.seed),
        settings,
        options,
        weights=weights,
        known=known,
        on_result=commit,
        stop=stop,
        check_settings=check_settings,
        on_failure=fail,
    )
    return BenchSummary(
        timed=summary.timed,
        skipped=skipped,
        noisy=summary.noisy,
        wall_s=time.perf_counter() - start,
        stopped=summary.stopped,
        failed=tuple(failed),
    )


def _record_failure(
    store: Store,
    settings: settings_lib.RunSettings,
    fingerprint: SystemFingerprint,
    signature: str,
    error: BaseException,
    failed: list[tuple[str, str]],
    on_failure: Callable[[str, str], None] | None,
) -> None:
    """Stores a brick as failed, with its reason; lists it; tells the caller."""
    reason = failure_reason(error)
    store.put_failure(signature, settings, fingerprint, reason)
    failed.append((signature, reason))
    if on_failure is not None:
        on_failure(signature, reason)


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
