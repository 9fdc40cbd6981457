"""A brick campaign within a time budget: time what a predictor prices worst.

Timing every unique brick of a corpus on a new machine costs minutes to
hours; a predictor of this machine's bricks (`dlbricks_tf.estimating.predict`)
prices the others. `time_within_budget` spends a budget of seconds on the
bricks whose timing narrows the models' estimates most per second, and
predicts the rest:

1. The probes (`dlbricks_tf.models.probes`) are timed first if the store
   lacks them for these settings on this machine, as `bench --probes`
   does: once per machine and settings, their seconds counted apart from
   the budget (`probes_s`).
2. The predictor of every described brick the store holds for these
   settings on this machine (`beyond.train`, from the descriptions, no
   model walked: the probes' and any brick timed before), read back when
   the store keeps it (`bench --probes` fits and keeps it), else fitted,
   cross-validated and kept. It is a machine's set-up, as the probes
   are: its seconds are counted apart too (`first_fit_s`).
3. Rounds until the budget is spent, every model's range is within
   +-10% (`ranges.PROMISE`), or every brick is timed: each untimed
   brick b is scored (`score`), the best are timed in one chain
   (`brick_timing.time_bricks`, stored with their descriptions), and the
   predictions of the bricks left are corrected, per kind of brick, by
   what the bricks timed so far read against their predictions
   (`dlbricks_tf.estimating.calibration`). That is how the campaign learns
   from its own timings: the predictor's bias is shared by a kind of
   brick in every model. Refitting its trees on the new bricks, as this
   campaign did before, left the budget sweep's estimates at 1.15-1.36x
   (2026-12-03); simulated on a fully timed store of the 13 at G=1, with
   the 32, 63 and 115 bricks of highest gain timed, the predictor left
   as is put 3, 3 and 6 of 13 models within +-10%, and corrected per
   kind 12, 13 and 13. The predictor is
   fitted again only when there was none (too few bricks to learn from),
   and that fit counts in the budget. A round takes
   the best bricks whose expected cost fits the seconds left (the first
   always) and, once started, is finished and kept: stopped half way,
   what it spent building and tracing its chain would be lost. So the
   budget is kept by sizing the rounds, and overrun by one round at most.

The score. Timing brick b replaces its predicted interval by a sampled
one; what that removes from model m's range is about c_bm p_b u, with c_bm
its count in m, p_b its predicted latency and u the predictor's relative
half-width (from its cross-validation, `CrossValidation.interval`; one
value for every brick, so it orders nothing but says how much is gained).
The plain rule, p_b x (sum_m c_bm) x u / cost_b, adds those
milliseconds over the models; the one here divides each model's part by
its estimate E_m, and leaves out the models already within +-10%:

    score_b = u p_b (sum over models m not yet precise of c_bm / E_m)
              / cost_b

Why: the goal is a relative one per model (each model within +-10%). In
milliseconds, a brick of a 200 ms model outweighs every brick of a 5 ms
one, and the budget went to the large models while the small ones stayed
mostly predicted; in shares of each model, a brick that is 20% of a small
model comes before one that is 1% of a large one, and a model once
precise stops drawing the budget. cost_b = a brick's setup (building it,
its link in the chain's trace and warm-up: `SETUP_S` at first, then
fitted on this machine's rounds so far) plus its sampling,
`min_samples` passes of p_b. A round also costs a part of its own
whatever it holds (choosing, the chain's first calls): the rounds'
seconds beyond their sampling are fitted as a part per round and a part
per brick (`round_costs`), and a round is sized to the seconds left
less its own part. Charged to its bricks, as before, the part of small
rounds made each brick look dear, so the next round took fewer.

How precisely. A round's chain samples until each model's timed part is
known to `TIMED_PRECISION` (5%) of its estimate, not the full run's 2%
(`round_options`): the bricks it times share every range with predicted
ones, off by 15-30% each once corrected, so a brick's samples beyond
that buy less than the next brick does. At 2% a chain of large bricks
sampled 21-70 passes where `cost_s` counts 10, and the 40's 10% budget
timed 114-154 bricks; at 5%, 253-307 (docs/estimating-beyond.md).

How many a round. At most `ROUND_BRICKS`, so that the correction between
rounds can change the order. Rounds as long as the full run's chains
(128) were tried: the bricks they time read as high against the full
run's (5-9%, time-weighted) as those of rounds of 32, and the budget put
no more models within +-10% (docs/history/2026-12-06-intel-xeon.md).

Lead-ins. A round's chain times each brick it chose after the untimed
bricks that come just before it in the chains' order (at most
`LEAD_IN`: its model's bricks before it), as the full run's chains time
it; they are timed, stored and paid for like the brick they lead into
(`round_bricks`). In one process, in raw milliseconds, a round's bricks
chained after unrelated bricks read 1.01-1.07 of themselves among all
their models' bricks in model order, and 0.98-1.01 with two lead-ins
each (docs/estimating-beyond.md).

Spread over the models. `time_within_budget` (`bench --budget`) runs
its rounds back to back. `run --budget` measures every whole model
too, and spreads the rounds over them (`Campaign.round`): each model in
turn gets its share of the budget (the budget over the number of
models; one round at least while the budget lasts and the model has a
brick worth timing), spent on its own bricks (`among`: those of a model
not yet within +-10%, best first), and its rounds' chain passes go
between the model's batches, as a full run times its bricks beside its
models. A share left unspent goes to the models after it. With the
rounds first and the models after, a round's chains were read and
scaled by the reference after their own short calls and each model
after its own calls: on the 40 at a 10%
budget the readings of the rounds had a median of 0.960 ms and those
beside the models 1.006 ms, and the models whose readings were slowest
read highest (correlation -0.50 between a model's scale factor and its
normalized latency, in two runs). Spread over the models, the
correlation was -0.08 to -0.28, and the budget put 30-34 of 40 within
+-10% in three runs against 23-28 with the rounds first, with fewer
bricks timed. Its rounds then chose among every model's bricks, so
most of them ran beside another model's batches (512 of one run's 552
bricks), not as a full run times them. Replayed with the full run's
timings of the very bricks each run timed, the predictions and their
correction alone would have put 35-38 of 40 within +-10%: what was
left was the rounds' timings. On each model's own bricks, a model's
scale factor no longer leaned against its normalized latency (-0.10
to 0.09, against -0.20 to -0.51), and the 40 at a 10% budget read 33-38
of 40 within +-10% in five runs (oneDNN on and off) against 29-37 in
seven (docs/estimating-beyond.md).

The range. A corrected prediction is as far off as its kind's factor
is uncertain (shared by every brick of the kind) plus its own residual
around it, both read from the held-out ratios of the bricks timed so
far (`calibration.Calibration.halves`); `BudgetSummary.shared` carries
the kinds' parts to the rows, and `model_precisions` decides with them
whether every model is within +-10% ("precise").

A brick that cannot be built or timed is recorded as failed (as in every
campaign) and predicted. A budget the first fit already spends times
nothing: every brick is predicted.

Example:
    summary = time_within_budget(suite, store, settings, fp, options,
                                 budget_s=60, granularity=1)
    summary.timed, summary.predicted  # {signature: predicted Timing}
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.estimating import (
    beyond,
    calibration,
    features,
    ranges,
    regressors,
    saved_predictor,
)
from dlbricks_tf.estimating import predict as predict_lib
from dlbricks_tf.measuring import brick_timing, precision, sampling
from dlbricks_tf.models import probes
from dlbricks_tf.running import bench
from dlbricks_tf.stats import Timing, timing_problem
from dlbricks_tf.storing.database import StoreError

# Seconds a brick costs before its first sample: building it, its link in
# the chain's trace and warm-up (14-30 ms a brick on the 2-core hosts).
SETUP_S = 0.025
# Bricks timed in one round (one chain), at most: the predictions are
# corrected between rounds, so a round is small enough to change the order.
ROUND_BRICKS = 32
# Bricks timed right before each brick a round chose, at most: those just
# before it in its model (see "Lead-ins" above).
LEAD_IN = 2
# The precision a round's chains sample to (`TimingOptions.precision`, of
# each model's estimate; see "How precisely" above): the timed part may
# take a quarter of the variance of the +-10% a range aims at.
TIMED_PRECISION = ranges.PROMISE / 2
# Why a campaign ended (`BudgetSummary.stopped`).
SPENT, PRECISE, ALL_TIMED, SIGNAL = "budget", "precise", "all timed", "signal"


@dataclasses.dataclass(frozen=True)
class BudgetSummary:
    """What one `time_within_budget` call did.

    Attributes:
        budget_s: The budget, in seconds.
        spent_s: Seconds spent on the campaign (timing and fitting),
            the probes' apart.
        probes_s: Seconds spent timing the probes the store lacked (0 when
            it held them).
        first_fit_s: Seconds getting the predictor of what the store held
            at the start (read back when kept, else fitted and kept),
            apart from `spent_s` as the probes are.
        fit_s: Of `spent_s`, seconds fitting the predictor again.
        fits: Predictors fitted again (each one fit, the first fit's
            cross-validation kept).
        timed: Signatures timed and stored, in order.
        failed: (signature, reason) of the bricks that failed.
        predicted: {signature: predicted timing} of the suite's bricks left
            untimed (empty if no predictor could be fitted).
        stopped: Why it ended: "budget", "precise" (every model within
            +-10%), "all timed" or "signal".
        predictor: The last predictor fitted, or None.
        shared: {signature: (kind, half-width ms)} of the predicted
            bricks corrected by timed ones: the part of each one's error
            its kind shares (`calibration.Calibration.halves`; pass it to
            `precision.estimate_precision`). A predicted brick not in it
            carries the predictor's cross-validated interval.
    """

    budget_s: float
    spent_s: float
    probes_s: float
    first_fit_s: float
    fit_s: float
    fits: int
    timed: tuple[str, ...]
    failed: tuple[tuple[str, str], ...]
    predicted: dict[str, Timing]
    stopped: str
    predictor: Any = None
    shared: dict[str, tuple[str, float]] = dataclasses.field(
        default_factory=dict
    )


def round_bricks(
    ranked: Sequence[str],
    costs: Mapping[str, float],
    left_s: float,
    position: Mapping[str, int],
    most: int,
) -> list[str]:
    """The bricks of one round's chain, in the chains' order.

    The best of `ranked` (at most `ROUND_BRICKS` of them) whose expected
    cost fits `left_s` (the first always), each with its lead-ins: the
    untimed bricks among the `LEAD_IN` that come just before it in the
    chains' order (`position`, the suite's order of first appearance:
    its model's bricks before it), so that it runs after what it runs
    after in its model and in the full run's chains. A lead-in is timed
    and stored like the brick it leads into, and its cost counts.

    Args:
        ranked: The untimed bricks that may be timed, best first.
        costs: Expected seconds of each (`cost_s`).
        left_s: Seconds of the budget left.
        position: {signature: index} of every brick of the suite, in the
            chains' order.
        most: Links a chain may hold (`TimingOptions.chain_links`).

    Returns:
        The signatures to time, in the chains' order.
    """
    order = sorted(position, key=position.__getitem__)
    open_ = set(ranked)
    batch: list[str] = []
    spend, chosen = 0.0, 0
    for s in ranked:
        if chosen >= ROUND_BRICKS:
            break
        if s in batch:  # Already a lead-in of a better brick.
            continue
        i = position[s]
        leads = [
            p
            for p in order[max(i - LEAD_IN, 0) : i]
            if p in open_ and p not in batch
        ]
        # A chain too short for them keeps the nearest (or none).
        group = (leads[-(most - 1) :] if most > 1 else []) + [s]
        cost = sum(costs[p] for p in group)
        if batch and (spend + cost > left_s or len(batch) + len(group) > most):
            break
        batch += group
        spend += cost
        chosen += 1
    return sorted(batch, key=position.__getitem__)


def round_costs(
    history: Sequence[tuple[int, float]],
) -> tuple[float, float]:
    """(seconds a round costs whatever it holds, setup seconds a brick).

    A least-squares line through the rounds' (bricks, seconds beyond
    their expected sampling): choosing, building and tracing a chain,
    its first calls and its commits cost a part per round and a part per
    brick. The part per brick is at least `SETUP_S`; with no two rounds
    of different sizes, a round's part is 0 and a brick's the mean.
    """
    if not history:
        return 0.0, SETUP_S
    bricks = [n for n, _ in history]
    seconds = [s for _, s in history]
    mean_n = sum(bricks) / len(bricks)
    mean_s = sum(seconds) / len(seconds)
    spread = sum((n - mean_n) ** 2 for n in bricks)
    if spread == 0:
        return 0.0, max(SETUP_S, sum(seconds) / max(sum(bricks), 1))
    slope = (
        sum(
            (n - mean_n) * (s - mean_s)
            for n, s in zip(bricks, seconds, strict=True)
        )
        / spread
    )
    setup = max(slope, SETUP_S)
    return max(mean_s - setup * mean_n, 0.0), setup


def round_options(options: sampling.TimingOptions) -> sampling.TimingOptions:
    """The options a round's chain samples with: `TIMED_PRECISION` of each
    model's estimate, or the options' own precision if that is looser."""
    return dataclasses.replace(
        options, precision=max(options.precision, TIMED_PRECISION)
    )


def relative_half(predictor: predict_lib.Predictor) -> float:
    """The predictor's relative half-width of a predicted brick (CV)."""
    low, high = predictor.cv.interval
    return max(math.exp(high) - 1.0, 1.0 - math.exp(low), 0.0)


def cost_s(
    predicted_ms: float,
    options: sampling.TimingOptions,
    setup_s: float = SETUP_S,
) -> float:
    """Expected seconds to time a brick of `predicted_ms` in a chain.

    `setup_s`: a brick's setup; the campaign passes what its last round
    cost a brick beyond its sampling, on this machine (at least `SETUP_S`).
    """
    return setup_s + sampling_s(predicted_ms, options)


def sampling_s(predicted_ms: float, options: sampling.TimingOptions) -> float:
    """Expected seconds of a brick's samples: `min_samples` passes."""
    passes = max(options.min_samples, 1)
    return passes * max(predicted_ms, 0.0) / 1000.0


def score(
    predicted_ms: float,
    counts: Sequence[tuple[str, int]],
    estimates_ms: Mapping[str, float],
    uncertainty: float,
    cost: float,
) -> float:
    """How much timing a brick narrows the models' ranges per second.

    Args:
        predicted_ms: The brick's predicted latency.
        counts: (model, occurrences) of the brick.
        estimates_ms: {model: estimate} of the models not yet within
            +-10%; the others gain nothing.
        uncertainty: The predictor's relative half-width (`relative_half`).
        cost: Expected seconds to time it (`cost_s`).

    Returns:
        u p (sum_m c_m / E_m) / cost (see the module docstring).
    """
    share = sum(
        n / estimates_ms[m]
        for m, n in counts
        if m in estimates_ms and estimates_ms[m] > 0
    )
    return uncertainty * max(predicted_ms, 0.0) * share / max(cost, 1e-9)


def model_precisions(
    suite: Any,
    timings: Mapping[str, Timing],
    predicted: Collection[str],
    shared: Mapping[str, tuple[str, float]] | None = None,
) -> dict[str, tuple[float, float]]:
    """{model: (estimate ms, relative half-width)} of a suite's models.

    From the timed and predicted bricks (`precision.estimate_precision`,
    with the `shared` parts of corrected predictions); a model with a
    brick in neither is left out.
    """
    counts: dict[str, dict[str, int]] = {}
    for entry in suite.entries:
        for model, n in entry.counts:
            counts.setdefault(model, {})[entry.signature] = n
    out = {}
    for model, brick_counts in counts.items():
        if any(s not in timings for s in brick_counts):
            continue
        total = sum(n * timings[s].center_ms for s, n in brick_counts.items())
        out[model] = (
            total,
            precision.estimate_precision(
                brick_counts, timings, predicted, shared
            ),
        )
    return out


def fit_predictor(
    store: Any,
    settings: Any,
    fingerprint: Any,
    log: Callable | None = None,
) -> tuple[predict_lib.Predictor | None, int]:
    """(predictor fitted on the store's described bricks, bricks learnt).

    The predictor of exactly what the store holds: read back when the
    store keeps it (`saved_predictor.fit_key`, the key `estimate
    --predict` reads too), else fitted, cross-validated and kept there for
    the next campaign or estimate.

    None (and 0) when too few are stored to fit one.
    """
    results = {
        s: t
        for s, t in store.results(settings, fingerprint).items()
        if timing_problem(t.to_dict(), ordered=False) is None
    }
    texts = store.descriptions(settings, fingerprint)
    texts = {s: text for s, text in texts.items() if s in results}
    key = saved_predictor.fit_key(
        beyond.METHOD, 0, False, (), results, described=texts
    )
    found = beyond.kept(store, settings, fingerprint, key, log)
    if found is not None:
        if log:
            log(
                f"Budget: the predictor of the store's {len(texts)} "
                "described bricks, kept in the store"
            )
        return found, len(texts)
    try:
        predictor = beyond.train(
            {}, results, max_granularity=1, descriptions=texts, log=log
        )
    except predict_lib.PredictorError as e:
        if log:
            log(f"Budget: no predictor yet ({e})")
        return None, len(texts)
    beyond.keep(store, settings, fingerprint, key, predictor, log)
    return predictor, len(texts)


def keep_probe_suite(
    store: Any,
    key: str,
    signatures: Any,
    log: Callable[[str], None] | None = None,
) -> None:
    """Keeps what the probes cut into (`Store.put_probe_suite`); a store
    that cannot be written still times (the line says so)."""
    try:
        store.put_probe_suite(key, signatures)
    except StoreError as e:
        if log:
            log(f"What the probes cut into was not kept: {e}")


def time_probes(
    store: Any,
    settings: Any,
    fingerprint: Any,
    options: sampling.TimingOptions | None,
    *,
    granularity: int,
    count: int = probes.COUNT,
    fuse: bool = False,
    check_settings: bool = True,
    scale: Any = None,
    stop: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[float, int]:
    """Times the probes' bricks the store lacks, as `bench --probes` does.

    Returns:
        (seconds spent, bricks timed); (seconds, 0) when the store held
        them all (a look-up in the store where it keeps what the
        probes cut into, else the cut).
    """
    start = time.perf_counter()
    key = probes.cut_key(count, granularity, fuse)
    cut = store.probe_suite(key)
    if cut and not store.missing(cut, settings, fingerprint, accept_noisy=True):
        if log:
            log(
                f"Budget: the probes' bricks are all stored ({len(cut)}, "
                "as they were cut before)"
            )
        return time.perf_counter() - start, 0
    s = suite_lib.build_suite(
        {
            p.name: p.decompose(granularity, True, fuse)
            for p in probes.sources(count)
        }
    )
    keep_probe_suite(store, key, s.signatures, log)
    # A probe stored noisy still teaches the predictor: it is not timed
    # again here (a second `bench --probes` does that).
    todo = store.missing(s.signatures, settings, fingerprint, accept_noisy=True)
    if not todo:
        return time.perf_counter() - start, 0
    if log:
        log(
            f"Budget: the store lacks {len(todo)} of the probes' "
            f"{len(s)} bricks for these settings; timing them first "
            "(counted apart from the budget)"
        )
    summary = bench.time_suite(
        s,
        store,
        settings,
        fingerprint,
        options,
        accept_noisy=True,
        check_settings=check_settings,
        scale=scale,
        stop=stop,
    )
    return time.perf_counter() - start, len(summary.timed)


def time_within_budget(
    suite: Any,
    store: Any,
    settings: Any,
    fingerprint: Any,
    options: sampling.TimingOptions | None = None,
    **campaign: Any,
) -> BudgetSummary:
    """Times the suite's most useful bricks within `budget_s` seconds.

    A `Campaign` run round after round until it ends; see the module
    docstring for the order and the stopping rule, and `Campaign` for
    the arguments (`budget_s` and `granularity` are required).

    Returns:
        What was timed, and the predicted timings of the rest.

    Raises:
        ValueError: A budget of 0 seconds or less.
        StoreError, ThreadPoolError: As `brick_timing.time_bricks`.
    """
    rounds = Campaign(suite, store, settings, fingerprint, options, **campaign)
    while rounds.round():
        pass
    return rounds.summary()


class Campaign:
    """A brick campaign within a budget, one round at a time.

    `time_within_budget` runs its rounds back to back. `run` spreads them
    over its models' measurement instead, each round's chain passes
    between a model's batches (`round(between=...)`), as a full run times
    bricks beside its models (see "Spread over the models" above).

    Creating it times the probes the store lacks and gets the first
    predictor (both counted apart from the budget). The budget counts
    the rounds' own seconds from then (`elapsed`), not what a round's
    `between` takes.

    Args:
        suite: The unique bricks, with their counts per model
            (`cutting.suite.Suite`, entries cut in memory: their bricks
            describe themselves).
        store: The `Store`; every result is written as it finishes.
        settings: Run settings in force in this process.
        fingerprint: This machine's fingerprint.
        options: Sampling options of the bricks.
        budget_s: Seconds the campaign may spend (more than 0).
        granularity: G of the suite, at which the probes are cut too.
        build: Returns what an entry's brick runs as; default: the
            entry's brick built at the settings' batch size.
        known: Timings of the suite's bricks already stored (default: the
            store's, noisy ones included).
        probe_count: The probes timed if the store lacks them.
        fuse: The suite was cut into fusion units (the probes are too).
        check_settings: Verify `settings` against the process first.
        scale: A `reference.ReferenceScale`, or None.
        stop: Asked between chains; True ends the campaign ("signal").
        on_result: Called with (signature, timing) after each commit.
        on_failure: Called with (signature, reason) after a failure.
        log: Called with a line of progress.
        clock: A `rounds.WallClock` charged with the bricks' work.

    Raises:
        ValueError: A budget of 0 seconds or less.
    """

    def __init__(
        self,
        suite: Any,
        store: Any,
        settings: Any,
        fingerprint: Any,
        options: sampling.TimingOptions | None = None,
        *,
        budget_s: float,
        granularity: int,
        build: Callable[[Any], Any] | None = None,
        known: Mapping[str, Timing] | None = None,
        probe_count: int = probes.COUNT,
        fuse: bool = False,
        check_settings: bool = True,
        scale: Any = None,
        stop: Callable[[], bool] | None = None,
        on_result: Callable[[str, Timing], None] | None = None,
        on_failure: Callable[[str, str], None] | None = None,
        log: Callable[[str], None] | None = None,
        clock: Any = None,
    ) -> None:
        if not budget_s > 0:
            raise ValueError(
                f"The budget must be above 0 s. Received: {budget_s}"
            )
        options = options or sampling.TimingOptions()
        self.log = log or (lambda line: None)
        self.suite, self.store = suite, store
        self.settings, self.fingerprint = settings, fingerprint
        self.budget_s = budget_s
        self.build = build or functools.partial(bench.build_brick, settings)
        self.check_settings, self.scale = check_settings, scale
        self.stop, self.clock = stop, clock
        self.on_result, self.on_failure = on_result, on_failure

        self.probes_s, _ = time_probes(
            store,
            settings,
            fingerprint,
            options,
            granularity=granularity,
            count=probe_count,
            fuse=fuse,
            check_settings=check_settings,
            scale=scale,
            stop=stop,
            log=self.log,
        )
        if known is None:
            known = store.results(settings, fingerprint)
        self.timings = {
            s: known[s]
            for s in suite.signatures
            if s in known
            and timing_problem(known[s].to_dict(), ordered=False) is None
        }
        _describe_known(store, suite, self.timings)
        # The predictor of what the store holds as the campaign starts is
        # a machine's set-up, as the probes are: fitted once, kept in the
        # store (`bench --probes` fits it too), read back by every later
        # campaign and `estimate --predict`; counted apart from the budget.
        t0 = time.perf_counter()
        self.predictor, _ = fit_predictor(
            store, settings, fingerprint, self.log
        )
        self.first_fit_s = time.perf_counter() - t0
        # Seconds of the budget spent: the rounds' own, not what their
        # `between` took.
        self._spent = 0.0
        self.fit_s = 0.0
        self.fits = 0
        # The probes above keep the options' precision: the predictor
        # learns from them.
        self.options = round_options(options)
        self.weights = brick_timing.model_weights(suite.entries)
        self.entries = {e.signature: e for e in suite.entries}
        self.position = {s: i for i, s in enumerate(suite.signatures)}
        self.rows: dict[str, Any] = {}  # Features of each brick, read once.
        self.kinds: dict[str, str] = {}
        # What the predictor in force priced each brick at, read once.
        self.priced: dict[str, float] = {}
        self.timed: list[str] = []
        # timed[fitted_at:] were timed after the predictor was fitted: it
        # did not learn from them, so they say how far off its predictions
        # are.
        self.fitted_at = 0
        self.failed: list[tuple[str, str]] = []
        self.bad: set[str] = set()
        self.stopped: str | None = None  # Why it ended; None until then.
        self.setup = SETUP_S  # A brick's setup: fitted on the rounds.
        self.round_s = 0.0  # What a round costs whatever it holds: fitted.
        # (bricks, seconds beyond their sampling) of each round.
        self.history: list[tuple[int, float]] = []

    def elapsed(self) -> float:
        """Seconds of the budget spent so far (rounds and fits; not what
        the rounds' `between` took)."""
        return self._spent

    @property
    def ended(self) -> bool:
        """Whether the campaign is over (`stopped` says why)."""
        return self.stopped is not None

    def _refit(self) -> Any:
        """The predictor of what the store holds now (None: too few)."""
        t0 = time.perf_counter()
        fitted, _ = fit_predictor(
            self.store, self.settings, self.fingerprint, self.log
        )
        self.fit_s += time.perf_counter() - t0
        self.fits += fitted is not None
        return fitted

    def _described(self, signatures: Sequence[str]) -> None:
        """Reads the features and kind of each brick not read yet."""
        new = [s for s in signatures if s not in self.rows]
        for s in new:
            brick = self.entries[s].brick
            self.rows[s] = features.brick_features(brick, brick.specs)
        found = regressors.brick_kinds(
            [features.vector(self.rows[s]) for s in new]
        )
        self.kinds.update(zip(new, found, strict=True))

    def _price(self, signatures: Sequence[str]) -> None:
        """Prices each brick the predictor in force has not priced yet."""
        new = [s for s in signatures if s not in self.priced]
        self._described(new)
        ms = self.predictor.predict_ms([self.rows[s] for s in new])
        self.priced.update(zip(new, ms, strict=True))

    def _calibrated(self) -> calibration.Calibration:
        use = [s for s in self.timed[self.fitted_at :] if s in self.timings]
        if self.predictor is None or not use:
            return calibration.Calibration()
        self._price(use)
        return calibration.fit(
            [self.kinds[s] for s in use],
            [self.timings[s].center_ms for s in use],
            [self.priced[s] for s in use],
        )

    def _predictions(
        self, cal: calibration.Calibration
    ) -> tuple[dict[str, Timing], dict[str, tuple[str, float]]]:
        """The untimed bricks' corrected timings, and their shared parts."""
        todo = [s for s in self.suite.signatures if s not in self.timings]
        if self.predictor is None or not todo:
            return {}, {}
        self._price(todo)
        guessed, shared = {}, {}
        for s in todo:
            ms = self.priced[s] * cal.factor(self.kinds[s])
            halves = cal.halves(self.kinds[s], ms)
            if halves is None:  # Nothing timed yet: the CV's interval.
                guessed[s] = self.predictor.timing(ms)
                continue
            guessed[s] = corrected_timing(ms, halves[1])
            shared[s] = (self.kinds[s], halves[0])
        return guessed, shared

    def _committed(self, key: str, result: Timing) -> None:
        self.timings[key] = result
        if self.on_result is not None:
            self.on_result(key, result)

    def _failure(self, key: str, reason: str) -> None:
        self.bad.add(key)
        if self.on_failure is not None:
            self.on_failure(key, reason)

    def round(
        self,
        until_s: float | None = None,
        between: Callable[[], None] | None = None,
        among: Collection[str] | None = None,
    ) -> bool:
        """Times one round, unless the campaign is over.

        Args:
            until_s: Size the round to end by this many seconds of the
                campaign (at most the budget; its first group is always
                taken). None: the budget.
            between: Called between the round's chain passes
                (`brick_timing.time_bricks`), e.g. a model's
                `rounds.ModelSampler`.
            among: The signatures the round may choose from (those of the
                model sampled in `between`); None: the suite's.

        Returns:
            False once the campaign is over (`stopped` says why), or when
            nothing of `among` is left that would narrow a range (the
            campaign goes on: `ended` is still False); True after a round.
        """
        if self.ended:
            return False
        start = time.perf_counter()
        aside = [0.0]  # Seconds `between` took: not the campaign's.

        def beside() -> None:
            t0 = time.perf_counter()
            try:
                between()
            finally:
                aside[0] += time.perf_counter() - t0

        try:
            return self._round(
                until_s, beside if between else None, aside, among
            )
        finally:
            self._spent += time.perf_counter() - start - aside[0]

    def _round(
        self,
        until_s: float | None,
        between: Callable[[], None] | None,
        aside: list[float],
        among: Collection[str] | None = None,
    ) -> bool:
        """`round`'s work; `aside[0]`: the seconds `between` took so far."""
        start = time.perf_counter()
        guessed, shared = self._predictions(self._calibrated())
        todo = [
            s
            for s in self.suite.signatures
            if s not in self.timings and s not in self.bad
        ]
        if not todo:
            self.stopped = ALL_TIMED
            return False
        if self.stop is not None and self.stop():
            self.stopped = SIGNAL
            return False
        left = self.budget_s - self.elapsed()
        if left <= 0:
            self.stopped = SPENT
            return False
        if until_s is not None:
            left = max(min(left, until_s - self.elapsed()), 0.0)
        if self.predictor is not None:
            state = model_precisions(
                self.suite, {**guessed, **self.timings}, guessed, shared
            )
            open_models = {
                m: e for m, (e, half) in state.items() if half > ranges.PROMISE
            }
            if state and not open_models:
                self.stopped = PRECISE
                return False
            u = relative_half(self.predictor)
            predicted_ms = {s: guessed[s].median_ms for s in todo}
        else:  # No predictor yet: the suite's order, every model open.
            open_models = dict.fromkeys(self.suite.models, 1.0)
            u = 1.0
            predicted_ms = dict.fromkeys(todo, 0.0)

        entries = self.entries
        if among is not None:
            # Only what narrows a range: the bricks of models already
            # within +-10% are left, and so is their share.
            mine = set(among)
            todo = [
                s
                for s in todo
                if s in mine
                and any(m in open_models for m, _ in entries[s].counts)
            ]
            if not todo:
                return False
        costs = {
            s: cost_s(predicted_ms[s], self.options, self.setup) for s in todo
        }
        ranked = sorted(
            todo,
            key=lambda s: (
                -score(
                    predicted_ms[s], entries[s].counts, open_models, u, costs[s]
                )
            ),
        )
        # A round once started is finished and kept: stopped half way,
        # what it spent building and tracing its chain would be lost, so
        # the budget is kept by sizing the rounds.
        batch = round_bricks(
            ranked,
            costs,
            max(left - self.round_s, 0.0),
            self.position,
            self.options.chain_links,
        )
        summary = brick_timing.time_bricks(
            [
                brick_timing.BrickToTime(
                    s,
                    functools.partial(self.build, entries[s]),
                    getattr(entries[s], "id_bounds", None),
                    entries[s].brick.describe,
                )
                for s in batch
            ],
            self.settings,
            self.fingerprint,
            self.store,
            self.options,
            weights=self.weights,
            known=self.timings,
            between=between,
            clock=self.clock,
            stop=self.stop,
            check_settings=self.check_settings,
            on_result=self._committed,
            on_failure=self._failure,
            scale=self.scale,
        )
        self.timed += summary.timed
        self.failed += summary.failed
        if batch:  # What the round cost beyond its samples.
            sampled = sum(
                sampling_s(predicted_ms[s], self.options) for s in batch
            )
            own_s = time.perf_counter() - start - aside[0]
            self.history.append((len(batch), own_s - sampled))
            # The first round also pays the process's first chain.
            self.round_s, self.setup = round_costs(
                self.history[1:] or self.history
            )
        if not summary.timed and not summary.failed:  # Stopped at once.
            stop = self.stop
            self.stopped = SIGNAL if stop is not None and stop() else SPENT
            return False
        if self.predictor is None and self.elapsed() < self.budget_s:
            self.predictor = self._refit()
            if self.predictor is not None:
                self.fitted_at = len(self.timed)  # It learnt from them.
                self.priced.clear()
        return True

    def summary(self) -> BudgetSummary:
        """What the campaign did, and the predictions of the bricks left.

        A campaign not over yet ends here ("budget").
        """
        if self.stopped is None:
            self.stopped = SPENT
        start = time.perf_counter()
        cal = self._calibrated()
        guessed, shared = self._predictions(cal)
        self._spent += time.perf_counter() - start
        self.log(
            f"Budget: {len(self.timed)} brick(s) timed, {len(guessed)} "
            f"predicted, {self.elapsed():.1f} s of {self.budget_s:g} s spent "
            f"({self.fit_s:.1f} s fitting {self.fits} predictor(s)); "
            f"predictions corrected by {sum(cal.counts.values())} timed "
            f"brick(s) of {len(cal.counts)} kind(s) (x{cal.overall:.2f} "
            f"overall); stopped: {self.stopped}"
            + (f"; probes {self.probes_s:.1f} s apart" if self.probes_s else "")
            + f"; first predictor {self.first_fit_s:.1f} s apart"
        )
        return BudgetSummary(
            budget_s=self.budget_s,
            spent_s=self.elapsed(),
            probes_s=self.probes_s,
            first_fit_s=self.first_fit_s,
            fit_s=self.fit_s,
            fits=self.fits,
            timed=tuple(self.timed),
            failed=tuple(self.failed),
            predicted=guessed,
            stopped=self.stopped,
            predictor=self.predictor,
            shared=shared,
        )


def corrected_timing(ms: float, own_half_ms: float) -> Timing:
    """A corrected prediction of `ms` as a timing whose interval is its
    own residual's (`calibration.Calibration.halves`), nothing sampled."""
    low = ms * ms / (ms + own_half_ms) if ms > 0 else 0.0
    return predict_lib.predicted_timing(ms, low, ms + own_half_ms)


def _describe_known(
    store: Any, suite: Any, timings: Mapping[str, Timing]
) -> None:
    """Keeps the descriptions the store lacks of the suite's timed bricks,
    so the predictor learns from them (a store older than descriptions)."""
    have = store.described()
    texts = {}
    for entry in suite.entries:
        if entry.signature not in timings or entry.signature in have:
            continue
        try:
            texts[entry.signature] = entry.brick.describe()
        except Exception:  # Left out of what the predictor learns, as when
            continue  # a brick's description cannot be made once timed.
    store.put_descriptions(texts)
