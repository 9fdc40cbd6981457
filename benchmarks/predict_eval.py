r"""Predicted bricks, evaluated one held-out family at a time.

Reads a store holding the bricks of many keras.applications models at one
G and their end-to-end timings (benchmarks/accuracy.py --all writes one);
times nothing, and reads the store from a copy. Models are grouped in
families (ConvNeXt, DenseNet, EfficientNet, EfficientNetV2,
Inception/Xception, MobileNet, NASNet, RegNet, ResNet, VGG). For each
family F:

1. a predictor (`dlbricks_tf.estimating.predict`) is fitted on the stored bricks
   of the other families only, with every signature F uses left out even
   where another family shares it: nothing of F is learnt from;
2. every brick of F's models is predicted, and each model's estimate
   ("predicted") compared with its end-to-end timing;
3. "stored + predicted": what `estimate --predict` would give had only the
   other families been timed: F's bricks that another family shares keep
   their stored timing, the rest are predicted (their share is shown);
4. "timed": the usual estimate from F's own timed bricks, beside them;
   "predicted / timed" compares the predicted estimate with it, apart
   from how far the timed bricks themselves are from the whole model.

With --probes_only, one predictor learns from the probes alone and
prices every brick of every model: a new machine on which no model brick
is timed. Its table is followed by the layer classes' timed and predicted
milliseconds, summed over the models, where the predictions part.

With --probes (the default), every predictor also learns from the probe
corpus's bricks (`dlbricks_tf.models.probes`: sampled layer configurations, no
model's), where the store holds them: `dlbricks bench --probes
--db=<the store>` times them, with the settings of the run. Their
campaign is reported: it is paid once per machine and settings.

Campaign seconds saved: what timing F's bricks that no other family has
cost, taken as each brick's sampling time (samples x calls per sample x
median, from the store) plus a setup cost per brick (building, tracing,
first run of its chain: --setup_ms, by default the G=1 campaign's
setup / bricks of --report, else 38.5 ms, that of the 13-model run of
2026-11-30).

--db and --granularity (one G) are the command line's flags; --report
and --json those of `benchmarks.eval_flags`.

Usage:
    python -m benchmarks.predict_eval --db=dlbricks_out/accuracy/store.sqlite
    python -m benchmarks.predict_eval --db=... --noprobes
    python -m benchmarks.predict_eval --db=... --probes_only
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from absl import app, flags

from benchmarks import eval_flags, figures, stores
from dlbricks_tf import stats
from dlbricks_tf.cli import bench_command, model_flags

# Shown by --helpshort.
flags.adopt_module_key_flags(eval_flags)
flags.declare_key_flag("granularity")
_METHOD = flags.DEFINE_enum(
    "method",
    "kinds",
    ["kinds", "efficiency", "trees", "hybrid", "roofline"],
    "Predictor (dlbricks_tf.estimating.predict.METHODS).",
)
_SETUP_MS = flags.DEFINE_float(
    "setup_ms", None, "Campaign setup per brick, ms (see the docstring)."
)
_PROBES_ONLY = flags.DEFINE_bool(
    "probes_only",
    False,
    "Fit one predictor on the probes' stored bricks alone and predict every "
    "brick of every model: a new machine on which no model brick is timed. "
    "Prints each model, then the layer classes' timed and predicted "
    "milliseconds summed over the models.",
)
# The command line's --probes (`bench --probes` times the probe corpus),
# read here as: learn from the probe corpus's stored bricks too, beside
# the other families' (on by default, see the end of this file).
_PROBES = bench_command.PROBES


def _campaign_s(signatures, results, setup_s: float) -> float:
    """What timing these stored bricks cost: each one's sampling time
    (samples x calls per sample x median) plus the setup of a brick."""
    return sum(
        results[s].samples
        * results[s].calls_per_sample
        * results[s].median_ms
        / 1e3
        + setup_s
        for s in signatures
    )


def _setup_ms(g: int) -> float:
    if _SETUP_MS.value is not None:
        return _SETUP_MS.value
    if eval_flags.REPORT.value:
        with open(eval_flags.REPORT.value, encoding="utf-8") as f:
            corpus = json.load(f)["corpus"]
        for c in corpus:
            if c["granularity"] == g and c.get("bricks_timed"):
                return 1e3 * c["campaign_setup_s"] / c["bricks_timed"]
    return 38.5


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    db = eval_flags.store_path()
    g = model_flags.one_granularity()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.cutting import split
    from dlbricks_tf.cutting.decompose import from_runs, model_graph
    from dlbricks_tf.estimating import estimate as estimate_lib
    from dlbricks_tf.estimating import predict as predict_lib
    from dlbricks_tf.models import corpus
    from dlbricks_tf.models.corpus import family
    from dlbricks_tf.storing.store import Store

    setup_s = _setup_ms(g) / 1e3
    with tempfile.TemporaryDirectory() as tmp:
        with Store(stores.copy_store(db, tmp)) as store:
            settings, fp, results, measured = stores.first_pair_timings(store)
    measured = {m: t for m, t in measured.items() if m in corpus.APPLICATIONS}
    graphs = {}
    plans = {}
    configs = {}
    folder = tempfile.mkdtemp()
    for name in measured:
        model = corpus.application(name)
        configs[name] = os.path.join(folder, f"{name}.json")
        with open(configs[name], "w", encoding="utf-8") as f:
            f.write(model.to_json())
        graph, factory = model_graph(model)
        plan = from_runs(graph, factory, split.split(graph, g), granularity=g)
        if any(b.signature not in results for b in plan.bricks):
            print(f"{name}: not every brick at G={g} is stored; left out")
            continue
        graphs[name] = (graph, factory)
        plans[name] = plan
    families = {}
    for name in plans:
        families.setdefault(family(name), []).append(name)
    probe_graphs = {}
    probe_s = 0.0
    if _PROBES.value:
        from dlbricks_tf.models import probes

        stored = set()
        # The probe nets, and the layer probes of stores timed before them.
        for source in probes.sources() + probes.layer_sources():
            graph, factory = model_graph(source.build())
            plan = from_runs(
                graph, factory, split.split(graph, g), granularity=g
            )
            mine = {b.signature for b in plan.bricks} & set(results)
            if mine:
                probe_graphs[source.name] = (graph, factory)
                stored |= mine
        probe_s = _campaign_s(stored, results, setup_s)
        print(
            f"Probes: {len(probe_graphs)} probe models with stored bricks, "
            f"{len(stored)} unique bricks at G={g}, campaign about "
            f"{probe_s:.1f} s",
            flush=True,
        )

    if _PROBES_ONLY.value:
        if not probe_graphs:
            raise app.UsageError(
                f"{db} holds no probe brick at G={g}: time them first "
                f"(dlbricks bench --probes --granularity={g} --db={db})"
            )
        _probes_only(probe_graphs, plans, graphs, results, measured, g)
        shutil.rmtree(folder)
        return

    rows = []
    fits = []
    for fam, names in families.items():
        own = {b.signature for n in names for b in plans[n].bricks}
        rest = {
            b.signature
            for n, p in plans.items()
            if family(n) != fam
            for b in p.bricks
        }
        data = predict_lib.examples(
            {
                **{n: v for n, v in graphs.items() if family(n) != fam},
                **probe_graphs,
            },
            results,
            max_granularity=g,
            exclude=frozenset(own),
            group_of=family,
        )
        start = time.perf_counter()
        predictor = predict_lib.Predictor.fit(data, method=_METHOD.value)
        fits.append(time.perf_counter() - start)
        new = own - rest
        saved = _campaign_s(new, results, setup_s)
        for n in names:
            m = measured[n].median_ms
            # From the model's config file: read, walked, cut, every brick
            # predicted, estimated; nothing is timed.
            start = time.perf_counter()
            graph, factory = model_graph(configs[n])
            plan = from_runs(
                graph, factory, split.split(graph, g), granularity=g
            )
            guessed = predictor.predict_bricks(plan.bricks, graph.specs)
            all_predicted = estimate_lib.estimate(
                plan,
                guessed,
                sources=dict.fromkeys(guessed, estimate_lib.PREDICTED),
            )
            seconds = time.perf_counter() - start
            mixed_results = {
                s: results[s] if s in rest else guessed[s] for s in guessed
            }
            mixed = estimate_lib.estimate(
                plan,
                mixed_results,
                sources={
                    s: estimate_lib.PREDICTED for s in guessed if s not in rest
                },
            )
            timed = estimate_lib.estimate(plan, results)
            rows.append(
                {
                    "family": fam,
                    "model": n,
                    "measured_ms": m,
                    "timed": timed.ms / m,
                    "predicted": all_predicted.ms / m,
                    "predicted_low": all_predicted.low_ms / m,
                    "predicted_high": all_predicted.high_ms / m,
                    "mixed": mixed.ms / m,
                    "mixed_share": mixed.share(estimate_lib.PREDICTED),
                    "mixed_low": mixed.low_ms / m,
                    "mixed_high": mixed.high_ms / m,
                    "predict_s": seconds,
                    "family_new_bricks": len(new),
                    "family_bricks": len(own),
                    "family_saved_s": saved,
                    "train_bricks": len(data),
                    "cv_median_error": predictor.cv.median_error,
                }
            )
        print(f"{fam}: {len(data)} bricks learnt from", flush=True)

    print(
        f"\nStore {db}: {settings.key()}, machine {fp.id}, G={g}, "
        f"predictor {_METHOD.value}, "
        f"{'with' if probe_graphs else 'without'} probes; "
        f"normalized = estimate / measured\n"
    )
    print(
        "| family | model | measured ms | timed | predicted [95% bounds] "
        "| stored + predicted [bounds] (predicted share) |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['family']} | {r['model']} | {r['measured_ms']:.2f} "
            f"| {r['timed']:.3f} | {r['predicted']:.3f} "
            f"[{r['predicted_low']:.2f}-{r['predicted_high']:.2f}] "
            f"| {r['mixed']:.3f} [{r['mixed_low']:.2f}-{r['mixed_high']:.2f}]"
            f" ({100 * r['mixed_share']:.0f}%) |"
        )
    print(
        "\n| family | models | within ±10%: timed / predicted / stored + "
        "predicted | geomean: timed / predicted / stored + predicted "
        "| predicted / timed: geomean | new bricks / bricks "
        "| campaign s saved |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    groups = list(families) + ["(all)"]
    for fam in groups:
        mine = [r for r in rows if fam == "(all)" or r["family"] == fam]
        if not mine:
            continue
        cols = ("timed", "predicted", "mixed")
        within = " / ".join(
            str(figures.within([r[c] for r in mine])) for c in cols
        )
        means = " / ".join(
            f"{stats.geomean([r[c] for r in mine]):.3f}" for c in cols
        )
        fams = {r["family"]: r for r in mine}
        new = sum(r["family_new_bricks"] for r in fams.values())
        total = sum(r["family_bricks"] for r in fams.values())
        saved = sum(r["family_saved_s"] for r in fams.values())
        agree = stats.geomean([r["predicted"] / r["timed"] for r in mine])
        print(
            f"| {fam} | {len(mine)} | {within} | {means} | {agree:.3f} "
            f"| {new} / {total} | {saved:.1f} |"
        )
    inside = sum(r["predicted_low"] <= 1 <= r["predicted_high"] for r in rows)
    times = [r["predict_s"] for r in rows]
    print(
        f"\nThe measured latency lies within the predicted estimate's "
        f"bounds for {inside}/{len(rows)} models. Fitting a predictor took "
        f"{min(fits):.1f}-{max(fits):.1f} s; estimating a model from its "
        f"config .json file (read, walked, cut, every brick predicted; "
        f"nothing timed): {figures.seconds_summary(times)}. Setup per "
        f"brick taken as "
        f"{1e3 * setup_s:.1f} ms."
    )
    if probe_graphs:
        print(
            f"The probes' campaign (timed once per machine and settings): "
            f"about {probe_s:.1f} s."
        )
    shutil.rmtree(folder)
    eval_flags.write_json(rows)


def _probes_only(probe_graphs, plans, graphs, results, measured, g) -> None:
    """Prints every model predicted from the probes alone, and the layer
    classes where the predictions part from the timed bricks."""
    from dlbricks_tf.estimating import estimate as estimate_lib
    from dlbricks_tf.estimating import predict as predict_lib

    data = predict_lib.examples(
        probe_graphs, results, max_granularity=g, group_of=lambda n: n
    )
    start = time.perf_counter()
    predictor = predict_lib.Predictor.fit(data, method=_METHOD.value)
    fit_s = time.perf_counter() - start
    print(
        f"\nPredictor {_METHOD.value} fitted on {len(data)} probe bricks "
        f"({fit_s:.1f} s); every brick of the models predicted; normalized = "
        "estimate / measured\n"
    )
    print("| model | measured ms | timed | predicted [95% bounds] |")
    print("|---|---:|---:|---:|")
    timed_all, predicted_all, inside = [], [], 0
    classes = {}
    for name, plan in plans.items():
        graph, _ = graphs[name]
        guessed = predictor.predict_bricks(plan.bricks, graph.specs)
        predicted = estimate_lib.estimate(
            plan,
            guessed,
            sources=dict.fromkeys(guessed, estimate_lib.PREDICTED),
        )
        m = measured[name].median_ms
        timed = estimate_lib.estimate(plan, results).ms / m
        p = predicted.ms / m
        low, high = predicted.low_ms / m, predicted.high_ms / m
        timed_all.append(timed)
        predicted_all.append(p)
        inside += low <= 1 <= high
        print(
            f"| {name} | {m:.2f} | {timed:.3f} | {p:.3f} "
            f"[{low:.2f}-{high:.2f}] |"
        )
        for brick in plan.bricks:
            row = classes.setdefault("+".join(brick.class_names), [0.0, 0.0])
            row[0] += results[brick.signature].median_ms
            row[1] += guessed[brick.signature].median_ms
    print(
        f"\nWithin ±10%: timed {figures.within(timed_all)}/{len(plans)}, "
        f"predicted {figures.within(predicted_all)}/{len(plans)}; geomean "
        f"timed {stats.geomean(timed_all):.3f}, predicted "
        f"{stats.geomean(predicted_all):.3f}; the predicted range holds the "
        f"measured latency for {inside}/{len(plans)} models.\n"
    )
    print(
        "| layer class of the brick | timed ms, summed over the models "
        "| predicted ms | predicted / timed |"
    )
    print("|---|---:|---:|---:|")
    for name, (t, p) in sorted(classes.items(), key=lambda kv: -kv[1][0])[:15]:
        print(f"| {name} | {t:.1f} | {p:.1f} | {p / t:.2f} |")


if __name__ == "__main__":
    flags.FLAGS.set_default("probes", True)
    app.run(main)
