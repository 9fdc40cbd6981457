"""Corpus analysis of keras.applications: the paper's Figs. 5-7 and reuse.

Decomposes every model (nothing is timed unless --store names a results
store, for the trade-off figures), writes CSV, JSON, PNG charts and
TensorBoard logs under --out, and prints the repeatability table next to
the paper's numbers (50 MXNet models: 10,815 layers, 1,529 unique, 14%).

    python benchmarks/analyze_corpus.py                 # all 40, G = 1
    python benchmarks/analyze_corpus.py --models=ResNet50,VGG16 \
        --granularity=3 --out=/tmp/analysis
    tensorboard --logdir dlbricks_out/analysis/tensorboard

--models, --granularity, --out and --db (or --store) are the command
line's flags, with defaults of their own here.
"""

from __future__ import annotations

import functools
import os
import sys

# A script, not the library: quiet TensorFlow's C++ start-up logs before
# the first import of it.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlbricks_tf.cli import model_flags, shared_flags  # noqa: E402
from dlbricks_tf.models import corpus  # noqa: E402

# The store of the trade-off figures (optional): --db, also --store here.
flags.DEFINE_alias("store", "db")
# Shown by --helpshort.
for _name in ("models", "granularity", "out", "db"):
    flags.declare_key_flag(_name)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    names = model_flags.MODELS.value
    unknown = [m for m in names if m not in corpus.APPLICATIONS]
    if unknown:
        raise app.UsageError(
            f"Unknown models {unknown}; choose from "
            f"{', '.join(corpus.APPLICATIONS)}."
        )
    granularity = model_flags.one_granularity()
    from dlbricks_tf.analyzing.analyze import PAPER_CORPUS, run_analysis
    from dlbricks_tf.drawing import summaries

    models = {
        name: functools.partial(corpus.application, name) for name in names
    }
    result = run_analysis(
        models,
        shared_flags.OUT.value,
        granularity,
        store_path=shared_flags.DB.value,
    )
    c = result.corpus
    print("\nRepeatability of layer calls (G=1, unique = distinct brick")
    print("signatures):\n")
    rows = [
        [r.model, r.calls, r.unique, f"{r.percent_unique:.1f}%"]
        for r in result.repeatability
    ]
    print(
        summaries.markdown_table(
            ["model", "layer calls", "unique calls", "% unique"],
            rows,
            align=["l", "r", "r", "r"],
        )
    )
    print("\nAcross the corpus, next to the paper:\n")
    print(
        summaries.markdown_table(
            ["corpus", "models", "layer calls", "unique", "% unique"],
            [
                [
                    "keras.applications (this run)",
                    len(result.repeatability),
                    f"{c.calls:,}",
                    f"{c.unique:,}",
                    f"{c.percent_unique:.1f}%",
                ],
                [
                    PAPER_CORPUS.model,
                    50,
                    f"{PAPER_CORPUS.calls:,}",
                    f"{PAPER_CORPUS.unique:,}",
                    f"{PAPER_CORPUS.percent_unique:.1f}%",
                ],
            ],
            align=["l", "r", "r", "r", "r"],
        )
    )
    if result.tradeoff:
        print("\nTrade-off (from the store):\n")
        print(
            summaries.markdown_table(
                ["system", "G", "models", "geomean estimate/measured",
                 "speed-up"],
                [[s.system, s.granularity, len(s.models), s.geomean,
                  s.speedup] for s in result.tradeoff],
            )
        )  # fmt: skip
    print(f"\nWrote {len(result.files)} files under {result.out_dir}:")
    print("  " + ", ".join(f for f in result.files if "/" not in f))
    print(
        f"  tensorboard --logdir {os.path.join(result.out_dir, 'tensorboard')}"
    )


if __name__ == "__main__":
    flags.FLAGS.set_default("models", list(corpus.APPLICATIONS))
    flags.FLAGS.set_default("out", "./dlbricks_out/analysis")
    app.run(main)
