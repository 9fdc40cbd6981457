"""The models a job times: by keras.applications name, file, or builder.

`resolve_models` turns names and paths into `ModelSource`s without
importing TensorFlow, so a caller can check them before fixing the thread
pools; a source builds its model when asked (`ModelSource.build`) and is
decomposed at its `input_shapes` (`ModelSource.decompose`). A model whose
inputs leave dimensions open (a transformer's sequence length) carries
the sizes it is cut and timed at in its name ("bert@128"), so the same
model at two lengths keeps two results in the store.

Example:
    sources = resolve_models(["MobileNetV2", "my_model.keras"])
    model = sources[0].build()
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf import errors
from dlbricks_tf.models import corpus

MODEL_FILE_SUFFIXES = (".keras", ".h5", ".hdf5", ".json")


class ModelSourceError(errors.Error):
    """A model given by name or path cannot be found or loaded."""


def shape_label(input_shapes: Mapping[str, Sequence[int]] | None) -> str:
    """The suffix input shapes add to a model's name: "@128", "" for none.

    "*" gives its dimensions alone, a named input NAME=DIMS; dimensions are
    joined by "x" ("@token_ids=128,image=224x224x3"), names sorted.
    """
    if not input_shapes:
        return ""

    def dims(shape) -> str:
        return "x".join(str(d) for d in shape)

    parts = [dims(input_shapes["*"])] if "*" in input_shapes else []
    parts += [
        f"{name}={dims(shape)}"
        for name, shape in sorted(input_shapes.items())
        if name != "*"
    ]
    return "@" + ",".join(parts)


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """A model to cut and time: an application, a file, or a builder.

    Attributes:
        name: The name in reports and in the store (the application's name,
            or the file's stem), with its input shapes if any ("bert@128").
        path: The model file, or None.
        builder: Returns the model, for a model built in code (it wins over
            `name` as an application name); None for an application or a
            file.
        input_shapes: ((input name, shape without the batch), ...): the
            sizes of the inputs' open dimensions the model is cut and
            timed at; "*" names every input not named. Empty: as built.
    """

    name: str
    path: str | None = None
    builder: Callable[[], Any] | None = dataclasses.field(
        default=None, compare=False
    )
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @property
    def shapes(self) -> dict[str, tuple[int, ...]] | None:
        """`input_shapes` as {input name: shape}, or None if there is none."""
        return dict(self.input_shapes) or None

    def at_shapes(
        self, input_shapes: Mapping[str, Sequence[int]] | None
    ) -> ModelSource:
        """This model at fixed input shapes, named after them ("bert@128").

        Nothing is checked here: a name or shape that does not fit the
        model's inputs is refused when it is cut or timed.
        """
        if not input_shapes:
            return self
        builder = self.builder
        if builder is None and self.path is None:
            builder = functools.partial(corpus.application, self.name)
        return dataclasses.replace(
            self,
            name=self.name + shape_label(input_shapes),
            builder=builder,
            input_shapes=tuple(
                (name, tuple(int(d) for d in shape))
                for name, shape in sorted(input_shapes.items())
            ),
        )

    def build(self, safe_mode: bool = True):
        """Returns the runnable `keras.Model` (weights are not needed).

        Raises:
            ModelSourceError: If the file cannot be loaded.
            LoadError: If the file is unreadable or over a limit of
                `dlbricks_tf.limits`.
        """
        if self.builder is not None:
            return self.builder()
        if self.path is None:
            return corpus.application(self.name)
        import keras

        from dlbricks_tf.cutting import loading

        # The file's sizes, nesting and layer count are checked first (see
        # dlbricks_tf.limits): Keras reads whatever the file holds.
        try:
            config = loading.read_config(self.path)
        except errors.Error as e:
            raise ModelSourceError(str(e)) from e
        try:
            if self.path.endswith(".json"):
                return keras.saving.deserialize_keras_object(
                    config, safe_mode=safe_mode
                )
            return keras.saving.load_model(
                self.path, compile=False, safe_mode=safe_mode
            )
        except Exception as e:  # Keras raises many types for bad files.
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            hint = ""
            if "Could not locate" in first:  # An unregistered custom class.
                hint = (
                    " Import the module that registers it first "
                    "(--import=your.module on the command line)."
                )
            raise ModelSourceError(
                f"Cannot load model file {self.path!r}: "
                f"{type(e).__name__}: {first}{hint}"
            ) from e

    def decompose(
        self,
        granularity: int,
        safe_mode: bool = True,
        fuse: bool = False,
        *,
        input_shapes=None,
    ):
        """Decomposes the model; a file is read for its config only.

        `fuse` keeps fusion units whole and `input_shapes` fixes open input
        dimensions (default: the source's own; see
        `dlbricks_tf.decompose`).
        """
        from dlbricks_tf.cutting.decompose import decompose

        target = self.path if self.path is not None else self.build()
        return decompose(
            target,
            granularity,
            safe_mode=safe_mode,
            fuse=fuse,
            input_shapes=input_shapes or self.shapes,
        )


def resolve_models(
    specs: Sequence[str],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> list[ModelSource]:
    """Turns names and paths into model sources, without importing Keras.

    Args:
        specs: `keras.applications` names (e.g. "ResNet50") or paths of
            `.keras`, `.h5` or config `.json` files.
        input_shapes: Sizes of the models' open input dimensions,
            {input name: shape without the batch} ("*": every input not
            named); see `ModelSource.at_shapes`.

    Returns:
        One source per spec, in order; files named by their stem, made
        unique with a suffix ("model", "model-2") when stems repeat, and
        followed by the input shapes ("model@128").

    Raises:
        ModelSourceError: If there is no spec, a file does not exist, or a
            name is not an application.
    """
    if not specs:
        raise ModelSourceError(
            "No models given: pass --models with keras.applications names "
            "or model file paths."
        )
    sources: list[ModelSource] = []
    taken: set[str] = set()
    for spec in specs:
        spec = spec.strip()
        if spec in corpus.APPLICATIONS:
            name, path = spec, None
        elif spec.lower().endswith(MODEL_FILE_SUFFIXES) or os.sep in spec:
            if not os.path.isfile(spec):
                raise ModelSourceError(
                    f"Model file {spec!r} does not exist: check the path "
                    "given to --models."
                )
            name, path = Path(spec).stem, spec
        else:
            raise ModelSourceError(
                f"Unknown model {spec!r}: use a keras.applications name "
                f"such as ResNet50 (see --helpfull) or the path of a "
                f"{'/'.join(MODEL_FILE_SUFFIXES)} file."
            )
        unique, n = name, 1
        while unique in taken:
            n += 1
            unique = f"{name}-{n}"
        taken.add(unique)
        sources.append(ModelSource(unique, path).at_shapes(input_shapes))
    return sources
