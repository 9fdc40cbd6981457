r"""How much a cover by stored bricks of every G gains over one G.

Reads a store that holds the bricks of some keras.applications models cut
at several G (benchmarks/accuracy.py --granularities=1,2,3 writes one) and
their end-to-end timings; times nothing. The store is read from a copy.
For every model the store timed end to end, for the settings and machine
of those timings:

* the estimate at each G (the model cut at G, as `estimate` does);
* the cover by stored bricks of 1..max G for each objective of
  `dlbricks_tf.estimating.cover` ("fewest", the default; "precise"; "smallest"),
  with the share of the estimate that bricks of each G hold;
* "chosen": for each model, the objective that fits the *other* models
  best (mean |log(estimate / measured)|), never the model itself.

Normalized latency is estimate / measured (the store's end-to-end median).

A store of benchmarks/accuracy.py keeps one timing per signature (a later
G's pass re-times the single-call bricks it shares with an earlier one)
and the models' timings of the last pass only; and a machine drifts
between passes. With --report (that run's report.json, which holds each
pass's end-to-end medians), a second table compares every estimate with
the model timed in the same pass as its bricks: each brick's latency is
set against the model's median of the pass that timed it (passes found
from the bricks' commit times), so no G is favoured by when it ran.

--db, --granularity (also --granularities) and --mode are the command
line's flags; --report and --json those of `benchmarks.eval_flags`.

Usage:
    python -m benchmarks.cover_eval --db=dlbricks_out/accuracy/store.sqlite \
        --report=dlbricks_out/accuracy/report.json
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from datetime import datetime

from absl import app, flags

from benchmarks import eval_flags, figures, stores, sweep_flags
from dlbricks_tf.cli import model_flags, shared_flags

# Shown by --helpshort.
flags.adopt_module_key_flags(eval_flags)
flags.adopt_module_key_flags(sweep_flags)
flags.declare_key_flag("mode")


def _passes(store, settings, fp, granularities):
    """{signature: G of the pass that timed it}, from commit times."""
    rows = [
        r
        for r in store.rows("brick")
        if r["fingerprint_id"] == fp.id and r["settings"] == settings.to_dict()
    ]
    stamps = sorted(
        (datetime.fromisoformat(r["created"].rstrip("Z")), r["signature"])
        for r in rows
    )
    gaps = sorted(
        range(1, len(stamps)),
        key=lambda i: stamps[i][0] - stamps[i - 1][0],
        reverse=True,
    )[: len(granularities) - 1]
    cuts = sorted(gaps)
    out = {}
    k = 0
    for i, (_, signature) in enumerate(stamps):
        while k < len(cuts) and i >= cuts[k]:
            k += 1
        out[signature] = granularities[k]
    return out


def _matched(est_ms, plan, results, passes, measured_by_pass, model):
    """Estimate over the pass-weighted end-to-end median of the model."""
    weights = {}
    for b in plan.bricks:
        g = passes[b.signature]
        weights[g] = weights.get(g, 0.0) + results[b.signature].median_ms
    total = sum(weights.values())
    ref = sum(w * measured_by_pass[(model, g)] for g, w in weights.items())
    return est_ms / (ref / total)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    db = eval_flags.store_path()
    mode = shared_flags.MODE.value
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf.cutting import split
    from dlbricks_tf.cutting.decompose import Cutter, from_runs, model_graph
    from dlbricks_tf.estimating import cover as cover_lib
    from dlbricks_tf.estimating import estimate as estimate_lib
    from dlbricks_tf.models import corpus
    from dlbricks_tf.storing.store import Store

    gs = sorted(model_flags.granularities())
    top = max(gs)
    by_pass = None
    if eval_flags.REPORT.value:
        with open(eval_flags.REPORT.value, encoding="utf-8") as f:
            report = json.load(f)
        by_pass = {
            (r["model"], r["granularity"]): r["measured_ms"]
            for r in report["runs"]
            if r.get("split", "plain") == "plain"
        }
    with tempfile.TemporaryDirectory() as tmp:
        with Store(stores.copy_store(db, tmp)) as store:
            settings, fp, results, measured = stores.first_pair_timings(store)
            passes = (
                _passes(store, settings, fp, gs) if by_pass is not None else {}
            )
    names = [n for n in measured if n in corpus.APPLICATIONS]
    tmp_configs = tempfile.mkdtemp()
    columns = [f"G={g}" for g in gs] + list(cover_lib.OBJECTIVES)
    rows = []
    seconds = []
    from_file = []
    for name in names:
        model = corpus.application(name)
        # What estimating a model from its file costs, with nothing timed:
        # reading its config, walking it, the cover and the estimate.
        config = os.path.join(tmp_configs, f"{name}.json")
        with open(config, "w", encoding="utf-8") as f:
            f.write(model.to_json())
        start = time.perf_counter()
        graph, factory = model_graph(config)
        cover_lib.cover_graph(
            graph, factory, results, max_granularity=top
        ).estimate(results, mode)
        from_file.append(time.perf_counter() - start)
        graph, factory = model_graph(model)
        cutter = Cutter(graph, factory)
        m = measured[name].median_ms
        row = {"model": name, "measured_ms": m, "normalized": {}}
        row["matched"] = {}
        row["shares"] = {}
        row["bricks"] = {}
        plans = {}
        for g in gs:
            plans[f"G={g}"] = from_runs(
                graph,
                factory,
                split.split(graph, g),
                granularity=g,
                cutter=cutter,
            )
        for objective in cover_lib.OBJECTIVES:
            start = time.perf_counter()
            plans[objective] = cover_lib.cover_graph(
                graph,
                factory,
                results,
                max_granularity=top,
                objective=objective,
                cutter=cutter,
            )
            seconds.append(time.perf_counter() - start)
        for key, plan in plans.items():
            if isinstance(plan, cover_lib.Cover):
                est = plan.estimate(results, mode)
            else:
                est = estimate_lib.estimate(plan, results, mode)
            row["normalized"][key] = est.ms / m
            row["bricks"][key] = est.bricks
            row["shares"][key] = {s.label: s.share for s in est.sources}
            if by_pass is not None:
                row["matched"][key] = _matched(
                    est.ms, plan, results, passes, by_pass, name
                )
        rows.append(row)
        print(f"{name}: done", flush=True)
    _chosen(rows, "normalized")
    if by_pass is not None:
        _chosen(rows, "matched")
    columns.append("chosen")

    print(
        f"\nStore {db}: {settings.key()}, machine {fp.id}; "
        f"{len(rows)} models; normalized = estimate / measured "
        f"({mode})\n"
    )
    print(
        "| model | measured ms | "
        + " | ".join(columns)
        + " | fewest: share by G | bricks G="
        + f"{top} / fewest |"
    )
    print("|---|---:|" + "---:|" * len(columns) + "---|---:|")
    for r in rows:
        shares = ", ".join(
            f"{k} {100 * v:.0f}%"
            for k, v in sorted(r["shares"]["fewest"].items())
        )
        print(
            f"| {r['model']} | {r['measured_ms']:.2f} | "
            + " | ".join(f"{r['normalized'][c]:.3f}" for c in columns)
            + f" | {shares} | {r['bricks'][f'G={top}']} / "
            f"{r['bricks']['fewest']} |"
        )
    for field, title in (
        ("normalized", "measured: the store's end-to-end medians"),
        ("matched", "measured: the same pass as each brick (--report)"),
    ):
        if field == "matched" and by_pass is None:
            continue
        print(f"\n{title}\n")
        print("| estimate | within 0.90-1.10 | geomean | range |")
        print("|---|---:|---:|---:|")
        for c in columns:
            print(figures.summary_row(c, [r[field][c] for r in rows]))
    print(
        f"\nCover time per model (dynamic programming, signatures and "
        f"estimate; models already walked): "
        f"{figures.seconds_summary(seconds)}. From a model-config .json "
        f"file (read, walked, covered, estimated; nothing timed): "
        f"{figures.seconds_summary(from_file)}"
    )
    shutil.rmtree(tmp_configs)
    eval_flags.write_json(rows)


def _chosen(rows, field):
    """Per model, the objective that fits the other models best."""
    from dlbricks_tf.estimating.cover import OBJECTIVES

    for r in rows:
        others = [o for o in rows if o is not r]

        def fit(objective, others=others):
            return sum(abs(math.log(o[field][objective])) for o in others)

        best = min(OBJECTIVES, key=fit)
        r[field]["chosen"] = r[field][best]
        r.setdefault("chosen_objective", {})[field] = best


if __name__ == "__main__":
    sweep_flags.set_default(["1", "2", "3"])
    app.run(main)
