"""Decomposes keras.applications at G = 1..6: repetition and speed figures.

The paper's motivating analysis ("10,815 layers, only 1,529 unique (14%)"
over 50 MXNet models) on our corpus, plus the cost of decomposing: for every
model and G, the time `dlbricks_tf.decompose` takes over the time Keras
takes to construct the same model, both measured in this run.

    python benchmarks/decompose_corpus.py             # all 40, G = 1..6
    python benchmarks/decompose_corpus.py --models=ResNet50,VGG16 --g=1,3

Prints a per-model table and a per-G corpus table; writes them as JSON
with --json_out. --models and G (--g, an alias of --granularity) are the
command line's flags, with defaults of their own here.
"""

from __future__ import annotations

import gc
import json
import math
import os
import sys
import time

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import repeat_flags  # noqa: E402
from dlbricks_tf.cli import model_flags  # noqa: E402
from dlbricks_tf.models import corpus  # noqa: E402

_G = flags.DEFINE_alias("g", "granularity")
# Shown by --helpshort.
for _name in ("models", "granularity", "repeats"):
    flags.declare_key_flag(_name)
_JSON_OUT = flags.DEFINE_string("json_out", None, "Write the figures here.")


def _timed(fn):
    gc.collect()  # A collection inside the timed region measures the GC.
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def _model_figures(name: str, granularities: list[int]) -> dict:
    from dlbricks_tf import decompose

    # Rounds of (construct, decompose at every G): this machine has slow
    # phases (2x for tens of seconds), and a ratio of two minima taken in
    # different phases would measure the phases. Each round samples both.
    construct_s = math.inf
    best = dict.fromkeys(granularities, math.inf)
    last = {}
    for _ in range(repeat_flags.REPEATS.value):
        model = None  # Let the previous round's model go first.
        model, seconds = _timed(lambda: corpus.application(name))
        construct_s = min(construct_s, seconds)
        for g in granularities:
            d, seconds = _timed(
                lambda g=g, m=model: decompose(m, granularity=g)
            )
            best[g] = min(best[g], seconds)
            last[g] = d
    rows = []
    for g in granularities:
        d = last[g]
        signatures = [b.signature for b in d.bricks]
        rows.append(
            {
                "granularity": g,
                "bricks": len(d.bricks),
                "unique": len(set(signatures)),
                "signatures": sorted(set(signatures)),
                "decompose_s": best[g],
                "ratio": best[g] / construct_s,
            }
        )
    return {
        "model": name,
        "calls": d.num_calls,
        "construct_s": construct_s,
        "per_g": rows,
    }


def _linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Slope through the origin and R^2 of y = slope * x."""
    slope = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(
        x * x for x in xs
    )
    mean = sum(ys) / len(ys)
    total = sum((y - mean) ** 2 for y in ys)
    residual = sum((y - slope * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return slope, 1 - residual / total if total else 1.0


def main(argv):
    del argv
    from dlbricks_tf import stats

    granularities = model_flags.granularities()
    names = model_flags.MODELS.value
    # Pay TensorFlow's one-time start-up before anything is timed.
    corpus.application("MobileNetV3Small")
    figures = []
    for i, name in enumerate(names, 1):
        f = _model_figures(name, granularities)
        figures.append(f)
        g1 = f["per_g"][0]
        print(
            f"[{i}/{len(names)}] {name}: {f['calls']} calls, "
            f"{g1['unique']} unique at G={g1['granularity']}, construct "
            f"{f['construct_s']:.2f} s, decompose at most "
            f"{max(r['ratio'] for r in f['per_g']):.1%} of it",
            flush=True,
        )

    print("\nPer model (bricks / unique bricks at each G; decompose time as")
    print("a share of Keras's construction time, the largest over G):\n")
    head = " | ".join(f"G={g}" for g in granularities)
    print(
        f"| model | calls | unique calls (G=1) | % unique | {head} | "
        "construct s | decompose/construct (max over G) |"
    )
    print("|---|---:|---:|---:|" + "---:|" * len(granularities) + "---:|---:|")
    for f in figures:
        g1 = f["per_g"][0]
        cells = " | ".join(f"{r['bricks']}/{r['unique']}" for r in f["per_g"])
        print(
            f"| {f['model']} | {f['calls']} | {g1['unique']} | "
            f"{100 * g1['unique'] / f['calls']:.1f}% | {cells} | "
            f"{f['construct_s']:.2f} | "
            f"{max(r['ratio'] for r in f['per_g']):.2%} |"
        )

    print("\nCorpus (unique = distinct signatures across all models):\n")
    print(
        "| G | calls | bricks | unique bricks | % unique | "
        "decompose/construct max | geomean |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    total_calls = sum(f["calls"] for f in figures)
    corpus_rows = []
    for k, g in enumerate(granularities):
        rows = [f["per_g"][k] for f in figures]
        unique = set().union(*(r["signatures"] for r in rows))
        bricks = sum(r["bricks"] for r in rows)
        ratios = [r["ratio"] for r in rows]
        geomean = stats.geomean(ratios)
        corpus_rows.append(
            {
                "granularity": g,
                "calls": total_calls,
                "bricks": bricks,
                "unique": len(unique),
                "max_ratio": max(ratios),
                "geomean_ratio": geomean,
            }
        )
        print(
            f"| {g} | {total_calls} | {bricks} | {len(unique)} | "
            f"{100 * len(unique) / bricks:.1f}% | {max(ratios):.2%} | "
            f"{geomean:.2%} |"
        )

    calls = [f["calls"] for f in figures for _ in f["per_g"]]
    seconds = [r["decompose_s"] for f in figures for r in f["per_g"]]
    slope, r2 = _linear_fit(calls, seconds)
    print(
        f"\nDecompose time vs layer calls: {1e6 * slope:.0f} us per call, "
        f"R^2 = {r2:.3f} for a line through the origin "
        f"({len(calls)} model x G points)."
    )
    if _JSON_OUT.value:
        for f in figures:
            for r in f["per_g"]:
                r.pop("signatures")
        with open(_JSON_OUT.value, "w") as out:
            json.dump(
                {
                    "models": figures,
                    "corpus": corpus_rows,
                    "us_per_call": 1e6 * slope,
                    "r2": r2,
                },
                out,
                indent=1,
            )


if __name__ == "__main__":
    flags.FLAGS.set_default("models", list(corpus.APPLICATIONS))
    for _name in ("granularity", "g"):  # --help shows the alias's default.
        flags.FLAGS.set_default(_name, ["1", "2", "3", "4", "5", "6"])
    app.run(main)
