"""A suite folder's bricks as runnable `keras.Model`s.

`load_saved_model` wraps a brick's SavedModel in a `keras.Model` (through
`keras.layers.TFSMLayer`); `load_keras_brick` rebuilds a brick from its
`.keras` file in Keras's safe mode. Either can be timed by the timing
harness. `describe` reads what a brick computes from its `.keras` file's
config, for the store to keep beside its timing. Keras, and so
TensorFlow, is imported on first use: reading and checking the manifest
(`dlbricks_tf.portable.suite_dir`) needs neither.

Example:
    suite = load_suite("out/suite")
    for entry in suite.shard(0, 4).entries:
        model = load_saved_model(entry, batch_size=1)
"""

from __future__ import annotations

from dlbricks_tf.portable.suite_dir import AGAIN, SuiteDirEntry, SuiteError


def load_saved_model(entry: SuiteDirEntry, batch_size: int | None = 1):
    """A `keras.Model` that runs a brick's SavedModel.

    The model has one `keras.Input` per manifest input (its shape, with
    `batch_size` as the batch dimension), calls the SavedModel's
    `serving_default` through `keras.layers.TFSMLayer`, and returns the
    outputs in `output_i` order: one tensor, or a list.

    Args:
        entry: A brick of a `SuiteDir`.
        batch_size: The batch dimension (None: dynamic).

    Returns:
        The model; `dlbricks_tf.measuring.timing.Timer` can time it.

    Raises:
        SuiteError: If the SavedModel cannot be loaded.
        ValueError: If `batch_size` is not None or 1 or more.
    """
    if batch_size is not None and batch_size < 1:
        raise ValueError(
            f"batch_size must be 1 or more. Received: {batch_size}"
        )
    import keras

    inputs = {
        spec.name: keras.Input(
            batch_shape=(batch_size, *spec.shape[1:]),
            dtype=spec.dtype,
            name=spec.name,
        )
        for spec in entry.inputs
    }
    try:
        layer = keras.layers.TFSMLayer(
            entry.saved_model, call_endpoint="serving_default"
        )
        results = layer(inputs)
    except Exception as e:  # TensorFlow raises many types.
        text = str(e).strip()
        raise SuiteError(
            f"Brick {entry.signature}: cannot load its SavedModel "
            f"{entry.saved_model!r}: {type(e).__name__}: "
            f"{text.splitlines()[0] if text else ''}; {AGAIN}"
        ) from e
    outputs = [results[spec.name] for spec in entry.outputs]
    xs = list(inputs.values())
    return keras.Model(
        inputs=xs[0] if len(xs) == 1 else xs,
        outputs=outputs[0] if len(outputs) == 1 else outputs,
        name="brick",
    )


def load_keras_brick(entry: SuiteDirEntry, batch_size: int | None = 1):
    """A brick rebuilt from its `.keras` file, in Keras's safe mode.

    Fresh layers from their configs, with the file's weights; no code from
    the file runs (a `Lambda` is refused). The inputs keep the open batch
    dimension the export gave them (the timing harness fixes it).

    Args:
        entry: A brick of a `SuiteDir`.
        batch_size: Unused: kept for symmetry with `load_saved_model`.

    Raises:
        SuiteError: If the file cannot be loaded.
    """
    del batch_size  # The exported brick's batch dimension is open.
    import keras

    try:
        return keras.saving.load_model(
            entry.keras, compile=False, safe_mode=True
        )
    except Exception as e:  # Keras raises many types for bad files.
        text = str(e).strip()
        raise SuiteError(
            f"Brick {entry.signature}: cannot load its Keras file "
            f"{entry.keras!r}: {type(e).__name__}: "
            f"{text.splitlines()[0] if text else ''}; {AGAIN}"
        ) from e


def describe(entry: SuiteDirEntry) -> str:
    """A suite brick's description, from its `.keras` file's config.

    What `Brick.describe` gives of the brick cut in memory (see
    `dlbricks_tf.cutting.description`), so that a store timing the suite
    keeps what a predictor learns from. Only the file's config is read, in
    safe mode (no weight, no code of the file); the specs of the outputs,
    which a lone model's config does not record, are the manifest's.

    Raises:
        DescriptionError: The file's brick is not the one the manifest
            names (another signature).
        DecompositionError: As `decompose` of the file (LoadError for a
            file that does not read, a limit it exceeds).
    """
    import dataclasses

    from dlbricks_tf.cutting import description
    from dlbricks_tf.cutting.decompose import Cutter, model_graph
    from dlbricks_tf.cutting.graph import TensorSpec

    graph, factory = model_graph(entry.keras, safe_mode=True)
    specs = list(graph.specs)
    if len(graph.outputs) == len(entry.outputs):
        for t, spec in zip(graph.outputs, entry.outputs, strict=True):
            if specs[t] is None:
                specs[t] = TensorSpec(tuple(spec.shape[1:]), spec.dtype)
    graph = dataclasses.replace(graph, specs=tuple(specs))
    brick = Cutter(graph, factory).brick(0, len(graph.calls))
    if brick.signature != entry.signature:
        raise description.DescriptionError(
            f"Brick {entry.signature}: its Keras file {entry.keras!r} holds "
            f"brick {brick.signature}; {AGAIN}"
        )
    return brick.describe()
