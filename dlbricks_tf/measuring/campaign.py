"""A brick campaign: bricks timed in chains, to the precision models need.

`time_chains` takes the bricks to time (each with a builder, so only the
bricks of the chains in flight are alive), groups them into chains of at
most `TimingOptions.chain_links` bricks and `MAX_CHAIN_BYTES` of estimated
memory (`dlbricks_tf.measuring.memory`), and times each chain as one traced
function (`dlbricks_tf.measuring.chain.ChainTimer`). Chains are sampled side
by side when a whole model is sampled beside them (`between`), a group of
them (up to `MAX_GROUP_BYTES`) at a time, in rounds: one pass of every
chain not done, then `between`; without `between`, two chains at a time.
The chains of a group are prepared two at a time, one traced while the
other is optimised and instantiated (`chain.prepare_together`), and a
group of one chain is cut in two halves for it (`paired`).
A chain is done when the estimates of the models that use its bricks are
known to the options' precision
(`dlbricks_tf.measuring.precision.chain_verdict`), or a cap is hit; then
every brick of it is handed to `on_result` (to be committed),
flagged noisy only if it keeps some model from its target. A campaign
killed mid-chain loses the samples of the chains in flight, nothing
committed before.

`between` is called once per round: `dlbricks_tf.running.job` samples the whole
model there, so bricks and model are measured over the same stretch of
time. Chains timed one after another (as before groups) put the model's
own samples, which it takes densely until it is precise, beside its first
chain's bricks only: with a neighbour busy in bursts of seconds, the
model's mean then saw other bursts than most of its bricks' means.

With `pace` (`TimingOptions.keep_pace`, off by default), a chain whose
bricks are precise keeps sampling, to its caps, while its model's own
timing is not done, so that the model's samples and its bricks' cover the
same rounds: beside a seeded neighbour it put 48 of 52 models within
+-10% against 67 of 78 without, for 1.3-1.5x the campaign
(docs/measuring.md).

One link a pass per brick, however often a model calls it: the count
weighs the brick's samples in that model's estimate. One link per 4
calls (at most 8), spread along the chain, had let a brick that Xception
calls 25 times settle in fewer passes; on the 40 those links made a pass
1.45x as long and left 1.33 links a brick to trace. Without them,
alternated runs of the 40 at G=1 took 12.9-14.2 against 16.6-17.1 ms of
setup a brick and 106 against 116 s of campaign, 36 and 38 against 38
and 38 models within +-10%. On the 13 the setup fell too, but in two of
four pairs the sampling rose as much (docs/measuring.md).

Two chains prepared at once: a chain's trace is Python (one core, the
GIL held) and its first call grappler and instantiation in C++ (one
core, the GIL released), so the first call of one chain runs beside the
trace of the next (`chain.prepare_together`). Over the G=1 bricks of
four models that took trace and first call from 7.8-8.2 to 4.7-5.7 ms a
brick; in alternated runs of the 40 the setup a brick fell from
11.8-12.0 to 9.9-10.6 ms (docs/measuring.md). A group of one chain is
cut in two halves for it (`paired`); four pieces gained 1-2% more, as
each smaller chain brings its own empty links and function.

Order: by default bricks are chained in the order they come (the models'
topological order, as a model runs them); `chain_order="shuffled"`
chains them in a seeded random order, so that no brick runs after its
model neighbour (`benchmarks.accuracy --chain_order=...` compares them).

Example:
    summary = time_chains(
        [ChainedBrick(b.signature, functools.partial(b.build, 1))
         for b in bricks],
        settings, options, weights={"m": counts},
        on_result=lambda key, timing: store.put(key, settings, fp, timing))
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import memory, precision
from dlbricks_tf.measuring.timing import TimingOptions
from dlbricks_tf.stats import Timing

# What one chain's bricks need (weights, inputs, largest activations; see
# `dlbricks_tf.measuring.memory.estimate`), at most (one brick may exceed it
# alone): bounds the campaign's memory whatever the corpus.
MAX_CHAIN_BYTES = 512 * 2**20
# What the chains sampled side by side need, at most (a chain alone may
# exceed it): the chains of a group are alive at once.
MAX_GROUP_BYTES = 2 * 2**30
ORDERS = ("model", "shuffled")
# Without a model to sample beside them, chains go this many at a time,
# prepared together (`chain.prepare_together`: one traced while the
# other is optimised and instantiated, one on each of two cores).
PAIR = 2
# A group of one chain of at least twice this many bricks is cut in two
# (`paired`), so that its halves are prepared together: below it, the
# fixed cost of a second function outweighs the overlap.
HALF_CHAIN_FROM = 8
# Errors that are no brick's fault: they stop the campaign, never a brick.
_NOT_A_BRICK_FAULT = (settings_lib.ThreadPoolError, KeyboardInterrupt)


@dataclasses.dataclass(frozen=True)
class ChainedBrick:
    """A brick to time in a chain.

    Attributes:
        key: Its signature (the key of its result).
        build: Returns the runnable `keras.Model`, built when its chain is.
        id_bounds: Exclusive id bound per flat input, for a model whose
            graph hides its Embeddings; None to read them from the graph.
    """

    key: str
    build: Callable[[], Any]
    id_bounds: tuple[int | None, ...] | None = None


@dataclasses.dataclass(frozen=True)
class CampaignSummary:
    """What one `time_chains` call did.

    Attributes:
        timed: Keys timed and handed to `on_result`, in order.
        noisy: Timed keys flagged noisy (they keep a model from its target).
        chains: Chains traced.
        setup_s: Seconds building, tracing and warming up the chains.
        sampling_s: Seconds in calls that took samples.
        stopped: Whether `stop` ended the campaign early.
        failed: Keys handed to `on_failure` (not built or not timed).
        passes: Samples taken of the chains' links (passes, or groups of
            passes of a chain of short bricks).
        passes_left_out: Of those, the ones left out as disturbed
            (`dlbricks_tf.measuring.disturbed`).
    """

    timed: tuple[str, ...]
    noisy: tuple[str, ...]
    chains: int
    setup_s: float
    sampling_s: float
    stopped: bool = False
    failed: tuple[str, ...] = ()
    passes: int = 0
    passes_left_out: int = 0


def ordered(
    bricks: Sequence[ChainedBrick], order: str, seed: int = 0
) -> list[ChainedBrick]:
    """The bricks in chain order: as given ("model") or "shuffled"."""
    if order not in ORDERS:
        raise ValueError(
            f"chain order must be one of {ORDERS}. Received: {order!r}"
        )
    result = list(bricks)
    if order == "shuffled":
        random.Random(seed).shuffle(result)
    return result


def paired(group: list[list[Any]]) -> list[list[Any]]:
    """A group of chains, a lone chain of `2 * HALF_CHAIN_FROM` bricks or
    more cut in two halves (prepared together, see `PAIR`)."""
    if len(group) == 1 and len(group[0]) >= 2 * HALF_CHAIN_FROM:
        half = len(group[0]) // 2
        return [group[0][:half], group[0][half:]]
    return group


def time_chains(
    bricks: Sequence[ChainedBrick],
    settings: settings_lib.RunSettings,
    options: TimingOptions | None = None,
    *,
    weights: Mapping[str, Mapping[str, int]] | None = None,
    known: Mapping[str, Timing] | None = None,
    between: Callable[[], None] | None = None,
    on_result: Callable[[str, Timing], None] | None = None,
    stop: Callable[[], bool] | None = None,
    check_settings: bool = True,
    on_failure: Callable[[str, BaseException], None] | None = None,
    scale=None,
    pace: Callable[[], bool] | None = None,
) -> CampaignSummary:
    """Times bricks in chains; hands each result to `on_result`.

    Args:
        bricks: The bricks to time, in the wanted order (see `ordered`).
        settings: Run settings in force (TF backend, chain protocol).
        options: `precision` (of each model's estimate), `min_samples`,
            `max_samples` and `max_seconds` (per chain), `chain_links`,
            `absolute_precision_ms` and `seed` are used.
        weights: {model: {signature: count}} of the models whose estimates
            the precision aims at (None: each chain's sum).
        known: Timings of the models' other bricks, already timed.
        between: Called once per round of samples.
        on_result: Called with (key, timing) for every brick of a chain
            as soon as the chain is done.
        stop: Asked every round; True ends the chain in flight (committed
            if it has `min_samples` samples) and the campaign.
        check_settings: Verify `settings` against the process first.
        on_failure: Called with (key, error) for a brick that cannot be
            built or timed; the others are timed. A chain that fails is
            halved until the brick at fault is alone. None: errors raise.
        scale: A `reference.ReferenceScale` every chain pass is scaled
            by (its readings count as sampling), or None.
        pace: Asked when a chain's bricks are precise enough: while it
            returns True (the whole model sampled in `between` is not
            done), the chain keeps sampling, up to its caps, so that the
            model and its bricks cover the same rounds (see the module
            docstring); None: a chain stops when its bricks are precise.

    Returns:
        What was timed (and what failed).

    Raises:
        MeasurementError: If a brick cannot be built or timed and there is
            no `on_failure`; ThreadPoolError if the settings are not in
            force.
    """
    from dlbricks_tf.measuring.chain import ChainTimer, prepare_together

    options = options or TimingOptions()
    weights = weights or {}
    known_ms = {k: t.center_ms for k, t in (known or {}).items()}
    timed: list[str] = []
    noisy: list[str] = []
    failed: list[str] = []
    clock = {
        "setup": 0.0,
        "sampling": 0.0,
        "chains": 0,
        "passes": 0,
        "left_out": 0,
    }
    stopped = False

    def run(chain_bricks: list[tuple[ChainedBrick, Any]]) -> bool:
        """Times a chain alone; a chain that fails is halved until the bad
        brick is alone, and that brick is handed to `on_failure`."""
        if on_failure is None:
            return run_group([chain_bricks], alone=True)
        try:
            return run_group([chain_bricks], alone=True)
        except _NOT_A_BRICK_FAULT:
            raise
        except Exception as e:  # Keras and TF raise many types.
            if len(chain_bricks) == 1:
                on_failure(chain_bricks[0][0].key, e)
                failed.append(chain_bricks[0][0].key)
                return False
        half = len(chain_bricks) // 2
        return run(chain_bricks[:half]) or run(chain_bricks[half:])

    def make_timer(chain_bricks: list[tuple[ChainedBrick, Any]]) -> Any:
        start = time.perf_counter()
        try:
            return ChainTimer(
                [(b.key, model) for b, model in chain_bricks],
                settings,
                seed=options.seed,
                check_settings=check_settings,
                id_bounds={
                    b.key: b.id_bounds for b, _ in chain_bricks if b.id_bounds
                },
                scale=scale,
            )
        finally:
            clock["setup"] += time.perf_counter() - start
            clock["chains"] += 1

    def capped(chain: Any) -> bool:
        return (
            chain.sample_count >= options.max_samples
            or chain.sampling_seconds >= options.max_seconds
        )

    def verdict(chain: Any) -> tuple[bool, frozenset[str]]:
        """(done, bricks holding a model back) after a chain's sample."""
        holding: frozenset[str] = frozenset()
        if chain.kept_count >= options.min_samples:
            settled, holding = precision.chain_verdict(
                {k: chain.precise_samples(i) for i, k in enumerate(chain.keys)},
                weights,
                known_ms,
                options.precision,
                options.absolute_precision_ms,
            )
            if settled:
                # Beside a model still sampling, keep its pace (to the caps).
                pacing = pace is not None and pace()
                return not pacing or capped(chain), holding
        return capped(chain), holding

    def commit(chain: Any, holding: frozenset[str]) -> None:
        clock["setup"] += chain.prepare_seconds
        clock["sampling"] += chain.sampling_seconds
        clock["passes"] += chain.sample_count
        clock["left_out"] += chain.sample_count - chain.kept_count
        for i, key in enumerate(chain.keys):
            result = chain.result(i, noisy=key in holding)
            known_ms[key] = result.center_ms
            timed.append(key)
            if result.noisy:
                noisy.append(key)
            if on_result is not None:
                on_result(key, result)

    def run_group(
        chains: list[list[tuple[ChainedBrick, Any]]], alone: bool = False
    ) -> bool:
        """Samples chains in round-robin until each is done; True if
        stopped. Each round takes one pass of every chain not done, then
        calls `between`: the whole model (and the machine's state) is
        sampled over the same stretch of time as every one of its bricks,
        not mostly beside the first chain. A chain that fails is timed
        again alone (`run`, which finds the brick at fault), unless
        `alone`: then its error is raised."""
        active: list[tuple[list, Any, frozenset[str]]] = []
        retry: list[list[tuple[ChainedBrick, Any]]] = []
        for chain_bricks in chains:
            try:
                active.append((chain_bricks, make_timer(chain_bricks), None))
            except _NOT_A_BRICK_FAULT:
                raise
            except Exception:  # Keras and TF raise many types.
                if alone:
                    raise
                retry.append(chain_bricks)
        if len(active) > 1:  # Two at a time, one on each core.
            prepare_together([chain for _, chain, _ in active])
        halted = False
        while active:
            left = []
            for chain_bricks, chain, _ in active:
                try:
                    chain.sample()
                except _NOT_A_BRICK_FAULT:
                    raise
                except Exception:  # Tracing fails on the first sample.
                    if alone:
                        raise
                    retry.append(chain_bricks)
                    continue
                done, holding = verdict(chain)
                if done:
                    commit(chain, holding)
                else:
                    left.append((chain_bricks, chain, holding))
            if between is not None:
                between()
            active = left
            if active and stop is not None and stop():
                halted = True
                break
        for _, chain, holding in active:  # Stopped: keep what can be.
            if chain.kept_count >= options.min_samples:
                commit(chain, holding or frozenset())
            else:
                clock["setup"] += chain.prepare_seconds
                clock["sampling"] += chain.sampling_seconds
        for chain_bricks in retry:
            if halted:
                break
            halted = run(chain_bricks)
        return halted

    group: list[list[tuple[ChainedBrick, Any]]] = []
    group_size = 0
    pending: list[tuple[ChainedBrick, Any]] = []
    size = 0
    for brick in bricks:
        if stop is not None and stop():
            stopped = True
            break
        start = time.perf_counter()
        try:
            model = brick.build()
            # Refused in one line before anything batch-sized is allocated;
            # what it needs also bounds the chain's size.
            grow = memory.check(
                model, settings.batch_size, what=f"Brick {brick.key}"
            ).total
        except _NOT_A_BRICK_FAULT:
            raise
        except Exception as e:  # Keras and TF raise many types.
            if on_failure is None:
                raise
            on_failure(brick.key, e)
            failed.append(brick.key)
            continue
        finally:
            clock["setup"] += time.perf_counter() - start
        if pending and (
            len(pending) >= options.chain_links or size + grow > MAX_CHAIN_BYTES
        ):
            group.append(pending)
            group_size += size
            pending, size = [], 0
            # Without a model to sample beside them, chains go two at a
            # time (prepared together): a stop loses at most two chains,
            # memory stays small.
            if (
                between is None and len(group) >= PAIR
            ) or group_size + grow > MAX_GROUP_BYTES:
                if run_group(paired(group)):
                    stopped = True
                    group = []
                    break
                group, group_size = [], 0
        pending.append((brick, model))
        size += grow
    if pending and not stopped:
        group.append(pending)
    if group and not stopped:
        stopped = run_group(paired(group))
    return CampaignSummary(
        timed=tuple(timed),
        noisy=tuple(noisy),
        chains=clock["chains"],
        setup_s=clock["setup"],
        sampling_s=clock["sampling"],
        stopped=stopped,
        failed=tuple(failed),
        passes=clock["passes"],
        passes_left_out=clock["left_out"],
    )
