"""TensorBoard output: images, Markdown tables, scalars, HParams and graphs.

One `tf.summary` file writer per run folder: TensorBoard lists each folder
under a log directory as a run, and overlays the runs' scalars of the same
tag. The helpers are generic (a tag, a value, a step), so any stage of the
pipeline can add its views here.

HParams follow TensorBoard's layout: `write_hparams_config` in one run
(say `hparams`) declares the hyperparameters and metric tags, and each
session is a sub-run (`hparams/G=1`) holding `write_hparams` and the metric
scalars. A run holds at most one graph (`write_model_graph`).

TensorFlow is imported on first use, not with this module.

Example:
    with run_writer("out/tensorboard", "analysis") as writer:
        write_image(writer, "similarity", png_bytes)
        write_table(writer, "repeatability", ["model", "calls"], rows)
        write_scalar(writer, "speedup", 4.4, step=1)
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any


def markdown_table(
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    align: Sequence[str] | None = None,
) -> str:
    """A GitHub-flavoured Markdown table.

    Floats are written with 4 significant digits, None as an empty cell,
    and `|` in cells is escaped.

    Args:
        header: Column titles.
        rows: One sequence of cells per row, as long as `header`.
        align: Per column "l" or "r"; numbers right, text left by default.

    Returns:
        The table, one line per row, without a trailing newline.

    Raises:
        ValueError: If a row's length differs from the header's.
    """
    for row in rows:
        if len(row) != len(header):
            raise ValueError(
                f"A row has {len(row)} cells for {len(header)} columns: "
                f"{list(row)!r}"
            )
    if align is None:
        first = rows[0] if rows else [""] * len(header)
        align = ["r" if _is_number(c) else "l" for c in first]
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = [_line(header), _line(rule)]
    lines += [_line([_cell(c) for c in row]) for row in rows]
    return "\n".join(lines)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.4g}"
    return str(value).replace("|", "\\|")


def _line(cells: Sequence[Any]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


@contextlib.contextmanager
def run_writer(log_dir: str | os.PathLike, run: str) -> Iterator[Any]:
    """A `tf.summary` file writer for the run folder `log_dir/run`.

    The writer is flushed and closed on exit.

    Args:
        log_dir: The folder to point TensorBoard at (`--logdir`).
        run: The run's name, a sub-folder of `log_dir`.

    Yields:
        The `tf.summary.SummaryWriter`.
    """
    import tensorflow as tf

    writer = tf.summary.create_file_writer(os.path.join(log_dir, run))
    try:
        yield writer
    finally:
        writer.flush()
        writer.close()


def write_image(
    writer: Any,
    tag: str,
    png: bytes,
    *,
    step: int = 0,
    description: str | None = None,
) -> None:
    """Writes a PNG as an image summary (decoded to RGB or RGBA pixels)."""
    import tensorflow as tf

    image = tf.image.decode_png(png)
    with writer.as_default():
        tf.summary.image(
            tag, image[tf.newaxis], step=step, description=description
        )


def write_text(
    writer: Any,
    tag: str,
    text: str,
    *,
    step: int = 0,
    description: str | None = None,
) -> None:
    """Writes Markdown as a text summary (TensorBoard renders it)."""
    import tensorflow as tf

    with writer.as_default():
        tf.summary.text(tag, text, step=step, description=description)


def write_table(
    writer: Any,
    tag: str,
    header: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    step: int = 0,
    description: str | None = None,
) -> None:
    """Writes a Markdown table (see `markdown_table`) as a text summary."""
    write_text(
        writer,
        tag,
        markdown_table(header, rows),
        step=step,
        description=description,
    )


def write_scalar(
    writer: Any,
    tag: str,
    value: float,
    *,
    step: int = 0,
    description: str | None = None,
) -> None:
    """Writes one scalar at one step."""
    import tensorflow as tf

    with writer.as_default():
        tf.summary.scalar(tag, value, step=step, description=description)


def write_scalars(
    writer: Any,
    tag: str,
    values: Mapping[int, float],
    *,
    description: str | None = None,
) -> None:
    """Writes a series of scalars, {step: value}, under one tag.

    Non-finite values (nan, inf) are skipped: TensorBoard cannot plot them.
    """
    for step, value in sorted(values.items()):
        if math.isfinite(value):
            write_scalar(writer, tag, value, step=step, description=description)


def write_hparams_config(
    writer: Any,
    hparams: Mapping[str, Sequence[Any]],
    metrics: Mapping[str, str],
) -> None:
    """Declares an HParams experiment: its hyperparameters and metrics.

    Args:
        writer: The writer of the experiment's run (the parent of the
            sessions' runs).
        hparams: {name: the values tried}; values of one type (int, float,
            str or bool).
        metrics: {scalar tag: display name}; the sessions log these tags.
    """
    from tensorboard.plugins.hparams import api as hp

    domains = [
        hp.HParam(name, hp.Discrete(sorted(set(values))))
        for name, values in hparams.items()
    ]
    with writer.as_default():
        hp.hparams_config(
            hparams=domains,
            metrics=[hp.Metric(t, display_name=d) for t, d in metrics.items()],
        )


def write_hparams(
    writer: Any, hparams: Mapping[str, Any], *, trial_id: str | None = None
) -> None:
    """Records one session's hyperparameter values (its run's writer)."""
    from tensorboard.plugins.hparams import api as hp

    with writer.as_default():
        hp.hparams(dict(hparams), trial_id=trial_id)


def write_model_graph(writer: Any, model: Any, batch_size: int = 1) -> None:
    """Writes the op graph of a Keras model called in inference mode.

    Ops are grouped by layer name scopes, so TensorBoard's graph dashboard
    shows one node per layer, which expands into its ops.

    Args:
        writer: The run's writer (a run shows one graph).
        model: A built `keras.Model` with fixed input shapes but the batch.
        batch_size: The batch dimension to trace with.
    """
    import tensorflow as tf

    specs = [
        tf.TensorSpec((batch_size, *x.shape[1:]), x.dtype) for x in model.inputs
    ]

    @tf.function(input_signature=specs, autograph=False)
    def call(*xs):
        return model(list(xs) if len(xs) > 1 else xs[0], training=False)

    graph = call.get_concrete_function().graph
    with writer.as_default():
        tf.summary.graph(graph)
