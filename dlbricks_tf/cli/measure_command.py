"""`dlbricks measure`: the end-to-end latency of each model, into --db.

On --backend=onnxruntime each model is converted to ONNX under --out/onnx
first, and timed as `run` times it there.
"""

from __future__ import annotations

import os

from dlbricks_tf.cli import outputs, progress, startup, timing_flags
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.running import steps


def measure(sources, gs, safe_mode) -> None:
    """Times every model end to end and prints a table of the timings."""
    del gs  # Whole models are not cut.

    out, db, _ = outputs.paths()
    settings = startup.start_backend()
    options, _ = timing_flags.options(settings.protocol)
    with outputs.open_store(db) as store:
        fp = system_fingerprint()
        measured = steps.measure_models(
            sources,
            settings,
            fp,
            store,
            options,
            safe_mode=safe_mode,
            progress=progress.Progress(),
            onnx_folder=os.path.join(out, "onnx"),
            scale=timing_flags.reference_scale(store, settings, fp),
        )
    print("| model | median ms | min ms | 95% CI ms | samples | noisy |")
    print("|---|---:|---:|---|---:|---|")
    for name, t in measured.items():
        print(
            f"| {name} | {t.median_ms:.3f} | {t.min_ms:.3f} "
            f"| {t.ci_low_ms:.3f}-{t.ci_high_ms:.3f} | {t.samples} "
            f"| {'yes' if t.noisy else 'no'} |"
        )
    print(f"\nStore: {db}")
