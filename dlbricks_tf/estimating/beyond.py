"""Estimates beyond the timed bricks: covered and predicted, as report rows.

`cover_and_predict` is what `dlbricks estimate --cover` and `--predict` run.
Each row says how its estimate was obtained (`method`):

* "timed": the model cut at G, every brick timed (what `estimate` always
  did);
* "covered": a cover by stored bricks of G or fewer steps
  (`dlbricks_tf.estimating.cover`), with the share of each brick size in
  `sources` ("G=1", "G=2", ...);
* "predicted" (or "covered+predicted"): some bricks were never timed and
  a latency model of this machine's bricks filled them in
  (`dlbricks_tf.estimating.predict`); `predicted_bricks` and `predicted_share`
  say how many and how much of the estimate, and the bounds hold the predictor's
  cross-validated error.

Without `predict`, a brick the store lacks is an error, as it always was.

Example:
    rows = cover_and_predict(sources, 3, settings, fp, store, cover=True)
    rows[0]["method"], rows[0]["sources"]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dlbricks_tf.cutting import split
from dlbricks_tf.cutting.decompose import Cutter, from_runs, model_graph
from dlbricks_tf.estimating import cover as cover_lib
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.estimating import predict as predict_lib
from dlbricks_tf.estimating import saved_predictor
from dlbricks_tf.estimating.rows import estimate_row
from dlbricks_tf.models import corpus, probes, sources
from dlbricks_tf.stats import timing_problem
from dlbricks_tf.storing.database import StoreError

# The predictor's method (`predict.METHODS`).
METHOD = "kinds"


def graph_of(source: Any, safe_mode: bool = True) -> tuple[Any, Any]:
    """(graph, factory) of a `job.ModelSource`; a file is read for its config.

    Raises:
        DecompositionError, ModelSourceError: As `ModelSource.decompose`.
    """
    target = source.path if source.path is not None else source.build()
    return model_graph(target, safe_mode=safe_mode)


def train(
    graphs: Mapping[str, tuple[Any, Any]],
    results: Mapping[str, estimate_lib.Timing],
    *,
    max_granularity: int,
    fuse: bool = False,
    descriptions: Mapping[str, str] | None = None,
    log: Any = None,
) -> predict_lib.Predictor:
    """A predictor fitted on the stored bricks of some models.

    Args:
        graphs: {model: (graph, factory)}: the models whose bricks (every
            run of up to `max_granularity` steps) the store may hold.
        results: `Store.results(settings, fp)`: one settings, one machine.
        max_granularity: The largest run to learn from.
        fuse: Steps are fusion units.
        descriptions: {signature: description} of stored bricks
            (`Store.descriptions`): learnt from too, with no model, unless
            a model of `graphs` holds them.
        log: Called with a line naming descriptions that do not read back
            (left out), if given.

    Its cross-validation holds out whole families of keras.applications
    (`corpus.family`; any other model is a family of its own; a brick
    known by its description alone is a group of its own), so that its
    error is that of a model unlike those it learnt from.

    Raises:
        PredictorError: Too few stored bricks among them.
    """
    data = predict_lib.examples(
        graphs,
        results,
        max_granularity=max_granularity,
        fuse=fuse,
        group_of=corpus.family,
    )
    if descriptions:
        more, unread = predict_lib.described_examples(
            descriptions, results, exclude=frozenset(e.signature for e in data)
        )
        data += more
        if unread and log:
            first, why = next(iter(unread.items()))
            log(
                f"Predictor: left out {len(unread)} stored description(s) "
                f"that do not read back (brick {first}: {why})"
            )
    return predict_lib.Predictor.fit(data, method=METHOD)


def estimate_graph(
    graph: Any,
    factory: Any,
    granularity: int,
    results: Mapping[str, estimate_lib.Timing],
    mode: str = "sequential",
    *,
    cover: bool = False,
    predictor: predict_lib.Predictor | None = None,
    objective: str = "fewest",
    fuse: bool = False,
    failures: Mapping[str, str] | None = None,
) -> tuple[estimate_lib.Estimate, str, int]:
    """One model's estimate: timed at G, covered, or with predicted bricks.

    Args:
        graph, factory: `decompose.model_graph` of the model.
        granularity: G of the cut, or the largest G of a cover.
        results: `Store.results(settings, fp)`.
        mode: "sequential" or "parallel".
        cover: Cover the model by stored bricks of 1..G steps.
        predictor: Predicts the bricks `results` lacks; None makes a
            missing brick an error.
        objective: The cover's (`cover.OBJECTIVES`).
        fuse: Steps are fusion units.
        failures: `Store.failures`, named when bricks are missing.

    Returns:
        (estimate, method, predicted bricks (unique)).

    Raises:
        MissingResultsError: A brick is missing and no predictor was given.
    """
    cutter = Cutter(graph, factory)
    if cover:
        c = cover_lib.cover_graph(
            graph,
            factory,
            results,
            max_granularity=granularity,
            fuse=fuse,
            objective=objective,
            predictor=predictor,
            cutter=cutter,
        )
        est = c.estimate(results, mode, failures=failures)
        method = "covered+predicted" if c.predicted else "covered"
        return est, method, len(c.predicted)
    d = from_runs(
        graph,
        factory,
        split.split(graph, granularity, fuse),
        granularity=granularity,
        fuse=fuse,
        cutter=cutter,
    )
    missing = {b.signature: b for b in d.bricks if b.signature not in results}
    if not missing or predictor is None:
        est = estimate_lib.estimate(d, results, mode, failures=failures)
        return est, "timed", 0
    predicted = predictor.predict_bricks(list(missing.values()), graph.specs)
    est = estimate_lib.estimate(
        d,
        {**results, **predicted},
        mode,
        sources=dict.fromkeys(predicted, estimate_lib.PREDICTED),
    )
    return est, "predicted", len(predicted)


def row(
    est: estimate_lib.Estimate,
    method: str,
    predicted: int,
    granularity: int,
    measured: Any = None,
) -> dict[str, Any]:
    """A row of the `estimate` command (`report.format_estimates`).

    The keys of `steps.estimate_models`' rows, plus `method`, `sources`
    ({label: share of the estimate}), `predicted_bricks` (unique) and
    `predicted_share`.
    """

    return {
        **estimate_row(est.model, granularity, est, measured),
        "method": method,
        "sources": {s.label: s.share for s in est.sources},
        "predicted_bricks": predicted,
        "predicted_share": est.share(estimate_lib.PREDICTED),
    }


def cover_and_predict(
    sources: Sequence[Any],
    granularity: int,
    settings: Any,
    fingerprint: Any,
    store: Any,
    mode: str = "sequential",
    *,
    cover: bool = False,
    predict: bool = False,
    objective: str = "fewest",
    training: Sequence[Any] | None = None,
    safe_mode: bool = True,
    fuse: bool = False,
    log: Any = None,
) -> list[dict[str, Any]]:
    """Estimates every model from the store, covered and/or predicted.

    Args:
        sources: `job.ModelSource`s to estimate.
        granularity: G of the cut, or the largest G of a cover.
        settings, fingerprint: Which stored timings to use (and nothing
            else: bricks of other settings or machines are never used).
        store: The `Store`.
        mode: "sequential" or "parallel".
        cover: Cover each model by stored bricks of 1..G steps.
        predict: Predict the bricks the store lacks, with the store's
            predictor (`kept_predictor`: fitted on the stored bricks of
            `training` and of the probes, or read back).
        objective: The cover's (`cover.OBJECTIVES`).
        training: More `job.ModelSource`s whose stored bricks the
            predictor learns from; None: the keras.applications models
            the store timed end to end (`timed_applications`).
        safe_mode, fuse: As `decompose`.
        log: Called with a line of progress, if given.

    Returns:
        One `row` per model.

    Raises:
        MissingResultsError: A brick is missing and `predict` is off.
        PredictorError: `predict` is on and too few bricks are stored.
    """
    results = store.results(settings, fingerprint)
    failures = store.failures(settings, fingerprint)
    graphs = {s.name: graph_of(s, safe_mode) for s in sources}
    predictor = None
    if predict:
        if training is None:
            training = timed_applications(store, settings, fingerprint)
        predictor = kept_predictor(
            store,
            settings,
            fingerprint,
            results,
            graphs,
            training,
            max_granularity=granularity,
            fuse=fuse,
            safe_mode=safe_mode,
            log=log,
        )
    rows = []
    for source in sources:
        graph, factory = graphs[source.name]
        est, method, predicted = estimate_graph(
            graph,
            factory,
            granularity,
            results,
            mode,
            cover=cover,
            predictor=predictor,
            objective=objective,
            fuse=fuse,
            failures=failures,
        )
        est = _renamed(est, source.name)
        measured = store.get_model(source.name, settings, fingerprint)
        rows.append(row(est, method, predicted, granularity, measured))
    return rows


def timed_applications(
    store: Any, settings: Any, fingerprint: Any
) -> list[Any]:
    """The keras.applications models the store timed end to end, as sources.

    Under these settings, on this machine, in name order: the models a
    predictor of the store learns from (with the probes), whatever models
    are estimated. Models of files are left out: they may be gone.

    Args:
        store, settings, fingerprint: Whose whole-model timings.

    Returns:
        `sources.ModelSource`s, none if the store timed no application.
    """
    timed = {
        r["model"]
        for r in store.rows("model")
        if r["fingerprint_id"] == fingerprint.id
        and r["settings"] == settings.to_dict()
    }
    names = sorted(timed & set(corpus.APPLICATIONS))
    return sources.resolve_models(names) if names else []


def kept_predictor(
    store: Any,
    settings: Any,
    fingerprint: Any,
    results: Mapping[str, estimate_lib.Timing],
    graphs: Mapping[str, tuple[Any, Any]],
    training: Sequence[Any] = (),
    *,
    max_granularity: int,
    fuse: bool = False,
    safe_mode: bool = True,
    probe_corpus: bool = True,
    log: Any = None,
) -> predict_lib.Predictor:
    """The store's predictor for these settings and this machine.

    It learns from every brick timed under these settings on this machine
    that the store keeps a description of (`Store.descriptions`: what
    `bench`, `run` and `bench --suite` store beside each timing), with no
    model at hand. Bricks timed before stores kept descriptions are found,
    as they always were, by walking models again: the stored bricks of
    `training` (the models the store timed end to end) and of the probe
    corpus (`dlbricks_tf.models.probes`, timed by `dlbricks bench
    --probes`); of `graphs`, the models to estimate, only when `training`
    is empty, so that estimating a new model reuses the predictor fitted
    for the last one. No model is walked when every timed brick has a
    description. It is read back from the store when it was fitted from
    exactly what the store now holds (`saved_predictor.fit_key`: the models
    learnt from, G, every stored brick and its median, the bricks
    described), else fitted (`train`) and kept in the store for the next
    call. Timings a sum of latencies cannot use (`stats.timing_problem`:
    a figure negative, infinite or not a number) are not learnt from.

    Args:
        store, settings, fingerprint: Whose bricks, and where it is kept.
        results: `store.results(settings, fingerprint)`.
        graphs: {model: (graph, factory)} already walked (the models to
            estimate).
        training: `job.ModelSource`s to learn from.
        max_granularity, fuse: Runs of up to this many steps are learnt.
        safe_mode: As `decompose`, for `training`.
        probe_corpus: Learn from the probes' stored bricks too.
        log: Called with a line of progress, if given.

    Raises:
        PredictorError: Too few stored bricks to learn from.
    """

    results = {
        s: t
        for s, t in results.items()
        if timing_problem(t.to_dict(), ordered=False) is None
    }
    texts = store.descriptions(settings, fingerprint)
    texts = {s: text for s, text in texts.items() if s in results}
    undescribed = len(results) - len(texts)
    learnt: dict[str, Any] = {}
    if undescribed or not texts:  # Walk the models, as before.
        learnt = {s.name: s for s in training}
        if not learnt:  # No model timed end to end: learn from those given.
            learnt = dict.fromkeys(graphs)
        if probe_corpus:
            # Only the layer probes can lack descriptions: the probe nets
            # came after stores kept them, and walking the 180 nets would
            # find nothing the descriptions do not already hold.
            learnt.update({s.name: s for s in probes.layer_sources()})
    if log and not texts:
        log(
            "Predictor: the store keeps no brick descriptions (its bricks "
            "were timed before stores kept them): learning from the models "
            "walked again, as before"
        )
    elif log and undescribed:
        log(
            f"Predictor: {undescribed} of the {len(results)} timed bricks "
            "have no description (timed before stores kept them): walking "
            "the models again to find them"
        )
    elif log:
        log(
            f"Predictor: learning from the descriptions of the "
            f"{len(texts)} timed bricks; no model walked"
        )
    names = sorted(learnt)
    key = saved_predictor.fit_key(
        METHOD,
        max_granularity if learnt else 0,
        fuse and bool(learnt),
        names,
        results,
        described=texts,
    )
    predictor = kept(store, settings, fingerprint, key, log)
    if predictor is not None:
        if log:
            log(
                f"Predictor: kept in the store, fitted on "
                f"{predictor.cv.bricks} stored bricks "
                f"({_what_is_learnt(learnt, texts)})"
            )
        return predictor
    learn = {}
    for i, (name, s) in enumerate(learnt.items(), 1):
        if log and (i == 1 or i % 40 == 0 or i == len(learnt)):
            log(f"Predictor: walking its models, {i}/{len(learnt)}")
        learn[name] = graphs[name] if name in graphs else graph_of(s, safe_mode)
    if log:
        log(
            f"Predictor: fitting and cross-validating on the stored bricks "
            f"({_what_is_learnt(learn, texts)}); the store keeps it for "
            "the next call"
        )
    predictor = train(
        learn,
        results,
        max_granularity=max_granularity,
        fuse=fuse,
        descriptions=texts,
        log=log,
    )
    keep(store, settings, fingerprint, key, predictor, log)
    if log:
        cv = predictor.cv
        log(
            f"Predictor: {cv.bricks} stored bricks "
            f"({_what_is_learnt(learn, texts)}); cross-validated median "
            "brick error "
            f"{100 * cv.median_error:.0f}%, "
            f"{100 * cv.within_10pct:.0f}% of bricks within 10%"
        )
    return predictor


def kept(
    store: Any, settings: Any, fingerprint: Any, key: str, log: Any = None
) -> predict_lib.Predictor | None:
    """The predictor the store keeps under `key`, or None (also when it
    does not read back: the line says why, and it is fitted again)."""
    text = store.get_predictor(settings, fingerprint, key)
    if text is None:
        return None
    try:
        return saved_predictor.from_json(text)
    except saved_predictor.SavedPredictorError as e:
        if log:
            log(str(e))
        return None


def keep(
    store: Any,
    settings: Any,
    fingerprint: Any,
    key: str,
    predictor: predict_lib.Predictor,
    log: Any = None,
) -> None:
    """Keeps a fitted predictor in the store under its fit key; a store
    that cannot be written still estimates (the line says so)."""
    try:
        store.put_predictor(
            settings, fingerprint, key, saved_predictor.to_json(predictor)
        )
    except StoreError as e:
        if log:
            log(f"The fitted predictor was not kept: {e}")


def _what_is_learnt(learn: Mapping[str, Any], texts: Mapping[str, str]) -> str:
    """Where the bricks a predictor learns from are found, for its lines."""
    walked = f"found in {len(learn)} model(s)"
    if not learn:
        return "read from their descriptions"
    if not texts:
        return walked
    return f"{walked} or read from their descriptions"


def _renamed(est: estimate_lib.Estimate, name: str) -> estimate_lib.Estimate:
    import dataclasses

    return dataclasses.replace(est, model=name)
