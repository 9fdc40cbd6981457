"""Interleaved rounds: a whole model and its bricks, timed side by side.

A model's measured latency is compared with the estimate its bricks give,
so on a noisy machine both are sampled over the same stretch of time.
`time_in_rounds` samples a set of brick timers in rounds, one batch of
each timer not done per round, and calls `between` once a round: there a
`ModelSampler` takes one batch of the whole model, and keeps doing so for
as long as any brick samples. A brick is handed to `on_result` as soon as
its timer is done; one whose timing did not settle is measured once more,
in the same rounds, by the same timer (`restart`: fresh samples, nothing
prepared again), and the more precise of its two timings
(`more_precise`) is handed on. A brick whose timer cannot be made or
sampled is handed to `on_failure`, and the others go on.

`WallClock` adds up what this costs, by kind of work: `END_TO_END` (the
whole model's own timing), `CAMPAIGN` (making and sampling the bricks'
timers) and its part `SETUP` that no sampling cap shortens (making the
timers and preparing them: tracing, warm-up, choosing K and S).

Timers are made by the caller's factory: `dlbricks_tf.measuring.timing.Timer`
(TensorFlow) and `dlbricks_tf.measuring.ort_timing.OrtTimer` (ONNX Runtime)
serve alike. Importing this module imports no TensorFlow.

Example:
    clock = WallClock()
    model = ModelSampler(clock.run(END_TO_END, Timer, model, settings), clock)
    summary = time_in_rounds(
        signatures, make_timer, clock, between=model, on_result=commit
    )
    measured = model.finish()
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from dlbricks_tf.measuring.sampling import Sampler
from dlbricks_tf.stats import Timing

# Kinds of work a `WallClock` counts (a caller may add its own).
CAMPAIGN = "campaign"
SETUP = "setup"
END_TO_END = "end_to_end"


class WallClock:
    """Wall-clock seconds spent, by kind of work.

    Args:
        kinds: The kinds that start at 0 s; another kind is added when
            first charged.
    """

    def __init__(
        self, kinds: Iterable[str] = (CAMPAIGN, END_TO_END, SETUP)
    ) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(kinds, 0.0)

    def __getitem__(self, kind: str) -> float:
        """Seconds charged to `kind` so far."""
        return self.seconds.get(kind, 0.0)

    def add(self, kinds: str | Iterable[str], seconds: float) -> None:
        """Charges `seconds` to each of `kinds` (one kind, or several)."""
        for kind in (kinds,) if isinstance(kinds, str) else kinds:
            self.seconds[kind] = self[kind] + seconds

    def run(
        self,
        kinds: str | Iterable[str],
        fn: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Returns `fn(*args, **kwargs)`, its duration charged to `kinds`.

        The duration is charged even if `fn` raises.
        """
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.add(kinds, time.perf_counter() - start)


class Remeasurable(Sampler, Protocol):
    """What `time_in_rounds` needs of a brick's timer (`Timer`, `OrtTimer`).

    A `Sampler` that can start a fresh series of samples and says what
    preparing it cost.
    """

    @property
    def prepare_seconds(self) -> float:
        """Seconds the first `sample()` spent before sampling."""

    def restart(self) -> Remeasurable:
        """Forgets the samples, keeps what was prepared; returns self."""


def more_precise(first: Timing, second: Timing) -> Timing:
    """Of two timings of one brick, the settled one, else the narrower.

    Args:
        first: The first timing.
        second: The re-measurement.

    Returns:
        `second` if it settled, else whichever has the smaller relative
        CI half-width (`second` on a tie); noisy unless one settled.
    """
    if first.noisy != second.noisy:
        return first if second.noisy else second
    if second.relative_precision <= first.relative_precision:
        return second
    return first


class ModelSampler:
    """Samples a whole model once per round of its bricks' timers.

    Called once per round (as `time_in_rounds`'s or
    `campaign.time_chains`'s `between`), it takes one batch of the whole
    model's samples, charged to `END_TO_END`, until the model's timer is
    done; then `on_done` is called. It keeps sampling for as long as the
    rounds go on, so that the model's median covers the same stretch of
    time as its bricks' (the machine drifts); samples past its own
    stopping point serve only that comparison and are charged to no wall
    clock. They are spread over that stretch but take at most
    `EXTRA_SHARE` of its wall-clock: a large model (EfficientNetB6, 0.8 s
    a call) among many rounds of its bricks would otherwise double the
    run.

    An error of the whole model is kept and raised by `finish`, once the
    bricks in flight are committed: bricks sampled beside the model must
    not take the model's fault for their own.

    Args:
        timer: The whole model's timer (`Timer`, `OrtTimer`).
        clock: Where its own sampling is charged (`END_TO_END`).
        on_done: Called once, when the model's own timing is done.
    """

    EXTRA_SHARE = 0.25

    def __init__(
        self,
        timer: Sampler,
        clock: WallClock,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.timer = timer
        self.clock = clock
        self.on_done = on_done
        self.error: Exception | None = None
        self._done = False
        self._since = 0.0  # When the model's own timing ended.
        self._extra_s = 0.0  # Seconds of samples taken since.

    @property
    def done(self) -> bool:
        """Whether the model's own timing is over."""
        return self._done

    def __call__(self) -> None:
        """Takes this round's batch of the model, if it is its turn."""
        if self.error is not None:
            return
        try:
            if self._done:
                now = time.perf_counter()
                if self._extra_s <= self.EXTRA_SHARE * (now - self._since):
                    self.timer.sample()
                    self._extra_s += time.perf_counter() - now
                return
            self.clock.run(END_TO_END, self.timer.sample)
        except Exception as e:  # Keras, TF and ORT raise many types.
            self.error = e
            return
        if self.timer.done:
            self._done = True
            self._since = time.perf_counter()
            if self.on_done is not None:
                self.on_done()

    def finish(self) -> Timing:
        """Samples until the model's own timing is done; returns it.

        Raises:
            Exception: The error the model's timer raised, in any round.
        """
        while not self._done:
            self()
            if self.error is not None:
                raise self.error
        return self.timer.result()


@dataclasses.dataclass(frozen=True)
class RoundsSummary:
    """What one `time_in_rounds` call did.

    Attributes:
        timed: Keys handed to `on_result`, in order.
        remeasured: Keys measured twice, their first timing not settled.
        failed: Keys handed to `on_failure`, in order.
        rounds: Rounds of samples taken (calls of `between`).
    """

    timed: tuple[str, ...]
    remeasured: tuple[str, ...]
    failed: tuple[str, ...]
    rounds: int


def time_in_rounds(
    keys: Iterable[str],
    make_timer: Callable[[str], Remeasurable],
    clock: WallClock | None = None,
    *,
    between: Callable[[], None] | None = None,
    on_result: Callable[[str, Timing], None] | None = None,
    on_failure: Callable[[str, Exception], None] | None = None,
) -> RoundsSummary:
    """Times bricks in interleaved rounds; hands each result on at once.

    Every timer is made first (`make_timer(key)`, charged to `CAMPAIGN`
    and `SETUP`), then each round calls `between` and takes one batch of
    samples of every timer not done (charged to `CAMPAIGN`). A timer done
    hands its brick's timing to `on_result`, or, the first time it ends
    noisy, restarts for a second measurement in the same rounds; the more
    precise of the two is handed on (`more_precise`). The timers'
    `prepare_seconds` are charged to `SETUP` at the end.

    Args:
        keys: The bricks' keys (signatures); a repeated key is timed once.
        make_timer: Returns the timer of a key (`Timer`, `OrtTimer`).
        clock: Where the work is charged (None: nowhere).
        between: Called once per round, before the bricks' batches (a
            `ModelSampler`).
        on_result: Called with (key, timing) as each brick is done.
        on_failure: Called with (key, error) for a brick whose timer
            cannot be made or sampled; the others go on. None: the error
            is raised.

    Returns:
        What was timed, re-measured and failed.
    """
    clock = clock or WallClock()
    timers: dict[str, Remeasurable] = {}
    failed: list[str] = []

    def fail(key: str, error: Exception) -> None:
        if on_failure is None:
            raise error
        failed.append(key)
        on_failure(key, error)

    for key in keys:
        if key in timers or key in failed:
            continue
        try:
            timers[key] = clock.run((CAMPAIGN, SETUP), make_timer, key)
        except Exception as e:  # Keras, TF and ORT raise many types.
            fail(key, e)
    timed: list[str] = []
    first_noisy: dict[str, Timing] = {}  # First timings of re-measured ones.
    rounds = 0
    pending = list(timers.items())
    while pending:
        rounds += 1
        if between is not None:
            between()
        for key, timer in pending:
            try:
                clock.run(CAMPAIGN, timer.sample)
            except Exception as e:  # Tracing fails on the first one.
                fail(key, e)
        left = []
        for key, timer in pending:
            if key in failed:
                continue
            if not timer.done:
                left.append((key, timer))
                continue
            result = timer.result()
            if result.noisy and key not in first_noisy:
                first_noisy[key] = result
                left.append((key, timer.restart()))
                continue
            if key in first_noisy:
                result = more_precise(first_noisy[key], result)
            timed.append(key)
            if on_result is not None:
                on_result(key, result)
        pending = left
    clock.add(SETUP, sum(t.prepare_seconds for t in timers.values()))
    return RoundsSummary(
        timed=tuple(timed),
        remeasured=tuple(first_noisy),
        failed=tuple(failed),
        rounds=rounds,
    )
