"""Recipes: a model as the list of its bricks' signatures, kept private.

A shared suite folder holds the unique bricks and nothing of the models. A
recipe is the other half, kept by the model's owner: the model's name, G,
the signature of each of its bricks in topological order (repeats
included) and the brick DAG. With the suite's timings from any machine, a
recipe rebuilds the model's latency without the model:
`estimate.estimate(recipe, results)` takes a `Recipe` as it takes a
`Decomposition`.

The file is JSON (`<model>.recipe.json`):

    {"format": "dlbricks-recipe", "format_version": 1, "model": "ResNet50",
     "granularity": 1, "bricks": ["3f0c...", ...],
     "dependencies": [[], [0], ...]}

This module is pure Python: no TensorFlow is imported.

Example:
    from_decomposition("ResNet50", d).save("ResNet50.recipe.json")
    est = estimate(load("ResNet50.recipe.json"), store.results(s, fp))
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from dlbricks_tf import errors, json_files, limits
from dlbricks_tf.cutting.split import SPLITS, split_name

FORMAT = "dlbricks-recipe"
FORMAT_VERSION = 1
SUFFIX = ".recipe.json"
_AGAIN = "write it again with `dlbricks export`."


class RecipeError(errors.Error):
    """A recipe file is missing or malformed."""


_HEADER = json_files.Header(
    FORMAT,
    FORMAT_VERSION,
    RecipeError,
    kind="file",
    instead=f"give a {SUFFIX} file written by `dlbricks export`",
    again=_AGAIN,
)


class _Decomposition(Protocol):
    granularity: int
    fuse: bool
    bricks: Sequence[Any]
    dependencies: Sequence[Sequence[int]]


@dataclasses.dataclass(frozen=True)
class RecipeBrick:
    """One brick of a recipe: its signature only."""

    signature: str


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A model as its bricks' signatures and the brick DAG.

    Attributes:
        name: The model's name.
        granularity: G the model was cut at.
        bricks: The bricks in topological order, repeats included.
        dependencies: For brick i, the indices (< i) of the bricks it reads.
        split: How it was cut: "plain" (G layer calls) or "fused" (G
            fusion units, `decompose(..., fuse=True)`).
    """

    name: str
    granularity: int
    bricks: tuple[RecipeBrick, ...]
    dependencies: tuple[tuple[int, ...], ...]
    split: str = "plain"

    @property
    def signatures(self) -> tuple[str, ...]:
        """The bricks' signatures, in order."""
        return tuple(b.signature for b in self.bricks)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of the recipe."""
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model": self.name,
            "granularity": self.granularity,
            "split": self.split,
            "bricks": list(self.signatures),
            "dependencies": [list(d) for d in self.dependencies],
        }

    def save(self, path: str | os.PathLike) -> None:
        """Writes the recipe as JSON (temporary file, then replace).

        Raises:
            RecipeError: If the file cannot be written.
        """
        path = Path(path)
        try:
            fd, tmp = tempfile.mkstemp(
                prefix=f".tmp-{path.name}-", dir=path.parent
            )
        except OSError as e:
            raise RecipeError(
                f"Cannot write recipe {str(path)!r}: {e.strerror}; choose "
                "another folder."
            ) from e
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.to_dict(), f, indent=1)
                f.write("\n")
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it private.
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def from_decomposition(name: str, decomposition: _Decomposition) -> Recipe:
    """The recipe of a decomposed model.

    Args:
        name: The model's name (e.g. `ModelSource.name`).
        decomposition: Its `Decomposition` (`granularity`, `bricks` with
            `signature`, `dependencies`).

    Returns:
        The recipe.
    """
    return Recipe(
        name=name,
        granularity=decomposition.granularity,
        bricks=tuple(RecipeBrick(b.signature) for b in decomposition.bricks),
        dependencies=tuple(tuple(d) for d in decomposition.dependencies),
        split=split_name(decomposition.fuse),
    )


def load(path: str | os.PathLike) -> Recipe:
    """Reads and checks a recipe file.

    Args:
        path: A `.recipe.json` file written by `Recipe.save`.

    Returns:
        The recipe.

    Raises:
        RecipeError: If the file is missing, not JSON, of another format or
            version, or its fields are malformed; one line naming the file.
    """
    shown = repr(str(path))
    what = f"Recipe {shown}"
    try:
        text = limits.read_file(path, what, RecipeError)
    except FileNotFoundError:
        raise RecipeError(
            f"Recipe {shown} does not exist: check the path given to --recipe."
        ) from None
    except OSError as e:
        raise RecipeError(f"Cannot read recipe {shown}: {e}") from e
    data = _HEADER.parse(text, what, shown, named=what)
    if isinstance(data.get("bricks"), list):
        limits.check_count("bricks", len(data["bricks"]), what, RecipeError)
    problem = _problem(data)
    if problem:
        raise RecipeError(f"Recipe {shown}: {problem}; {_AGAIN}")
    return Recipe(
        name=data["model"],
        granularity=data["granularity"],
        bricks=tuple(RecipeBrick(s) for s in data["bricks"]),
        dependencies=tuple(tuple(d) for d in data["dependencies"]),
        split=data.get("split", "plain"),
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a recipe's fields, or None."""
    model = data.get("model")
    if not isinstance(model, str) or not model:
        return f"'model' must be a non-empty string, not {model!r}"
    g = data.get("granularity")
    if not _is_int(g) or g < 1:
        return f"'granularity' must be an integer of 1 or more, not {g!r}"
    split = data.get("split", "plain")
    if split not in SPLITS:
        return f"'split' must be 'plain' or 'fused', not {split!r}"
    bricks = data.get("bricks")
    if (
        not isinstance(bricks, list)
        or not bricks
        or not all(isinstance(s, str) and s for s in bricks)
    ):
        return "'bricks' must be a non-empty list of signature strings"
    deps = data.get("dependencies")
    if not isinstance(deps, list) or len(deps) != len(bricks):
        return (
            f"'dependencies' must be a list of one list per brick "
            f"({len(bricks)})"
        )
    for i, d in enumerate(deps):
        if not isinstance(d, list) or not all(
            _is_int(j) and 0 <= j < i for j in d
        ):
            return (
                f"dependencies[{i}] must list indices of earlier bricks "
                f"(0..{i - 1}), not {d!r}"
            )
    return None
