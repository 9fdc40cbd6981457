"""`dlbricks analyze`: the corpus figures that motivate DLBricks.

Repeatability, layer types, similarity and reuse of --models (default:
the 40 keras.applications), and the trade-off over G when --db holds
timings, as files under <out>/analysis (`dlbricks_tf.analyzing.analyze`).
"""

from __future__ import annotations

import functools
import os

from absl import app

from dlbricks_tf.cli import outputs, shared_flags, startup
from dlbricks_tf.models import corpus


def analyze(sources, gs, safe_mode) -> None:
    """Writes the analysis files and prints where they are."""
    del safe_mode  # run_analysis reads model files in safe mode.
    from dlbricks_tf.analyzing import analyze as analyze_lib

    if shared_flags.FUSE.value:
        raise app.UsageError(
            "analyze cuts models by layer calls; --fuse is for run, "
            "decompose, bench, estimate, export and report --compare."
        )
    out, db, _ = outputs.paths()
    startup.start_tensorflow()
    models = {
        s.name: s.path or functools.partial(corpus.application, s.name)
        for s in sources
    }
    target = os.path.join(out, "analysis")
    result = analyze_lib.run_analysis(
        models,
        target,
        granularity=gs[0],
        store_path=db if os.path.isfile(db) else None,
    )
    print(f"\n{len(result.files)} files written under {target}")
    tb = os.path.join(target, "tensorboard")
    print(f"TensorBoard: tensorboard --logdir {tb}", flush=True)
