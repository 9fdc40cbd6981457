"""dlbricks_tf: benchmark Keras models on CPUs from their unique bricks.

DLBricks (ICPE '20) cuts each model into small runnable pieces of at most G
layer calls ("bricks"), keeps the unique ones across a corpus, times those
once per machine and rebuilds each model's latency from them.

Example:
    >>> import keras, dlbricks_tf
    >>> m = keras.applications.InceptionV3(weights=None)
    >>> d = dlbricks_tf.decompose(m, granularity=3)
    >>> for b in d.bricks:
    ...     print(b.layers, b.signature)
    >>> brick_model = d.bricks[5].build(batch_size=1)

The whole job (`dlbricks_tf.api`): time a corpus's unique bricks and its
models, and estimate each model from its bricks:

    >>> results = dlbricks_tf.run(["MobileNetV2", "ResNet50"], db="s.sqlite")
    >>> [(r.model, r.normalized) for r in results]

The modules are grouped by the stage of the pipeline they serve:
`models` (the models to time), `cutting`, `measuring`, `storing`,
`estimating`, `reporting`, `portable` (exported suites) and `analyzing`
(the corpus analysis); `machine` (run settings, fingerprint, thread pools)
and `drawing` (charts, TensorBoard output) serve several stages;
`running` is the whole job, `cli` the command line. What every stage uses
(`errors`, `limits`, `json_files`, `stats`) and `api` are modules of the
package itself.

The public API is imported on first use: importing the package, any of
its subpackages, or a module that needs no Keras (such as the store or
`dlbricks_tf.measuring.ort_timing`) does not import TensorFlow.
"""

import importlib
import sys
import types

# Public name -> the module that defines it.
_PUBLIC = {
    "Brick": "dlbricks_tf.cutting.brick",
    "Decomposition": "dlbricks_tf.cutting.decompose",
    "DecompositionError": "dlbricks_tf.errors",
    "Error": "dlbricks_tf.errors",
    "LoadError": "dlbricks_tf.errors",
    "MeasurementError": "dlbricks_tf.measuring.sampling",
    "MemoryLimitError": "dlbricks_tf.measuring.memory",
    "MissingResultsError": "dlbricks_tf.estimating.estimate",
    "ModelResult": "dlbricks_tf.api",
    "ModelSource": "dlbricks_tf.models.sources",
    "ModelSourceError": "dlbricks_tf.models.sources",
    "RunSettings": "dlbricks_tf.machine.settings",
    "StoreError": "dlbricks_tf.storing.database",
    "TensorSpec": "dlbricks_tf.cutting.graph",
    "ThreadPoolError": "dlbricks_tf.machine.process",
    "Timing": "dlbricks_tf.stats",
    "configure": "dlbricks_tf.api",
    "decompose": "dlbricks_tf.cutting.decompose",
    "estimate": "dlbricks_tf.api",
    "measure": "dlbricks_tf.api",
    "run": "dlbricks_tf.api",
}

__all__ = sorted(_PUBLIC)


class _Package(types.ModuleType):
    """This package, whose public names are imported when first read."""

    def __getattr__(self, name: str):
        if name not in _PUBLIC:
            raise AttributeError(
                f"module {self.__name__!r} has no attribute {name!r}"
            )
        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        super().__setattr__(name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *_PUBLIC})


sys.modules[__name__].__class__ = _Package
