"""`dlbricks export`: a shareable suite folder and private recipes.

Writes the unique bricks of --models at one G to --suite (SavedModel,
.keras and ONNX each, fresh weights, no names) and one recipe per model
to --recipes, which must not be inside the suite: recipes name the
models.
"""

from __future__ import annotations

import os

from absl import app, flags, logging

from dlbricks_tf.cli import outputs, progress, shared_flags, startup
from dlbricks_tf.cutting import split as split_lib
from dlbricks_tf.cutting import suite
from dlbricks_tf.portable import recipe

RECIPES = flags.DEFINE_string(
    "recipes",
    None,
    "export: folder of the per-model recipes, <model>.recipe.json "
    "(default: <out>/recipes). They name the models: keep them private.",
)


def export(sources, gs, safe_mode) -> None:
    """Exports the suite and the recipes, and prints what was written."""
    from dlbricks_tf.portable import export as export_lib

    if len(gs) > 1:
        raise app.UsageError("export takes one --granularity.")
    out = shared_flags.OUT.value
    folder = shared_flags.SUITE.value or os.path.join(out, "suite")
    recipes_dir = RECIPES.value or os.path.join(out, "recipes")
    inside = os.path.relpath(
        os.path.abspath(recipes_dir), os.path.abspath(folder)
    )
    if inside == os.curdir or not inside.startswith(os.pardir):
        raise app.UsageError(
            "--recipes must not be inside --suite: the suite is meant to be "
            "shared and recipes name the models."
        )
    outputs.make_dirs(folder, recipes_dir)
    startup.start_tensorflow()
    if startup.quiet():  # TensorFlow's SavedModel writer logs INFO per file.
        logging.set_verbosity(logging.WARNING)
    g = gs[0]
    decompositions = {
        s.name: shared_flags.decompose(s, g, safe_mode) for s in sources
    }
    unique = suite.build_suite(decompositions)
    print(
        f"G={g}: {len(unique)} unique bricks of {unique.total_bricks} in "
        f"{len(decompositions)} model(s); suite {folder}",
        flush=True,
    )
    bar = progress.Progress(f"G={g}: ", verb="exported")
    summary = export_lib.export_suite(
        unique,
        folder,
        granularity=g,
        split=split_lib.split_name(shared_flags.FUSE.value),
        progress=lambda done, total: bar("suite", done, total),
    )
    paths = []
    for name, d in decompositions.items():
        path = os.path.join(recipes_dir, f"{name}{recipe.SUFFIX}")
        recipe.from_decomposition(name, d).save(path)
        paths.append(path)
    print(
        f"Suite: {summary.folder}: {summary.total} bricks, "
        f"{len(summary.written)} written, {len(summary.skipped)} already "
        f"there ({summary.wall_s:.1f} s); manifest {summary.manifest}"
    )
    if summary.no_onnx:
        print(
            f"Without ONNX (written with onnx null; --backend=onnxruntime "
            f"records them as failed): {len(summary.no_onnx)} brick(s):"
        )
        pairs = list(zip(summary.no_onnx, summary.no_onnx_reasons, strict=True))
        for signature, reason in pairs[:10]:
            print(f"  {signature}: {reason}")
        if len(pairs) > 10:
            print(f"  ... and {len(pairs) - 10} more (see the manifest)")
    print(f"Recipes (private): {len(paths)} in {recipes_dir}")
    for path in paths:
        print(f"  {path}")
