"""`dlbricks decompose`: each model's bricks and the unique counts."""

from __future__ import annotations

from absl import flags

from dlbricks_tf.cli import shared_flags, startup
from dlbricks_tf.reporting import report

LIST_BRICKS = flags.DEFINE_bool(
    "list_bricks", True, "decompose: list every brick, not only counts."
)


def decompose(sources, gs, safe_mode) -> None:
    """Prints the bricks (layers, classes, inputs, signature) per G."""

    startup.start_tensorflow()
    for g in gs:
        ds = {s.name: shared_flags.decompose(s, g, safe_mode) for s in sources}
        print(f"# G={g}\n")
        print(report.format_decompositions(ds, bricks=LIST_BRICKS.value))
        print()
