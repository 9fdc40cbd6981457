"""A suite folder: the format `export_suite` writes, read back and checked.

`load_suite` reads `<folder>/manifest.json`, checks its format and version,
and that every file it lists is there with the SHA-256 digest it records;
anything wrong is a `SuiteError` of one line that names the brick, the file
and what to do. The result is typed (`SuiteDir`, `SuiteDirEntry`) and can be
cut into the same shards as the `Suite` it was exported from.
`dlbricks_tf.portable.suite_bricks` turns a brick's files into a
`keras.Model` that the timing harness can time.

This module imports no TensorFlow: a manifest can be read and checked
without it.

Example:
    suite = load_suite("out/suite")
    for entry in suite.shard(0, 4).entries:
        print(entry.signature, entry.saved_model)
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Collection, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from dlbricks_tf import errors, json_files, limits
from dlbricks_tf.cutting.split import SPLITS
from dlbricks_tf.cutting.suite import shard_of
from dlbricks_tf.portable import feed_order

FORMAT = "dlbricks-suite"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
BRICKS = "bricks"
# Manifest key -> name inside a brick's folder.
FILES = {
    "saved_model": "saved_model",
    "keras": "brick.keras",
    "onnx": "brick.onnx",
}
# The file of a SavedModel whose digest the manifest records.
SAVED_MODEL_PB = "saved_model.pb"
_SIGNATURE = re.compile(r"^[A-Za-z0-9_-]+$")
AGAIN = "re-export the suite with `dlbricks export`."


class SuiteError(errors.Error):
    """A suite folder is missing, malformed or does not match its manifest."""


_HEADER = json_files.Header(
    FORMAT,
    FORMAT_VERSION,
    SuiteError,
    kind="manifest",
    instead="point to a folder written by `dlbricks export`",
    again=AGAIN,
)


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One input of a brick.

    Attributes:
        name: `input_0`, `input_1`, ...: the SavedModel signature's and the
            ONNX file's input name.
        shape: Shape with the batch dimension first (None: dynamic).
        dtype: Keras dtype name, e.g. "float32".
        high: Exclusive upper bound of the ids of an integer input that
            feeds an Embedding (or CategoryEncoding); None otherwise.
    """

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    high: int | None = None


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    """One output of a brick (`output_0`, ...; shape with batch first)."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class SuiteDirEntry:
    """One brick of a suite folder.

    Attributes:
        signature: The brick's signature (its folder's name).
        layers: Layer calls in the brick.
        classes: The class of each call, in order.
        inputs: Input specs, in `input_i` order.
        outputs: Output specs, in `output_i` order.
        saved_model: Absolute path of the SavedModel folder.
        keras: Absolute path of the `.keras` file.
        onnx: Absolute path of the `.onnx` file (None: tf2onnx could not
            convert the brick).
        onnx_error: Why there is no `.onnx` file, if the manifest says.
    """

    signature: str
    layers: int
    classes: tuple[str, ...]
    inputs: tuple[InputSpec, ...]
    outputs: tuple[OutputSpec, ...]
    saved_model: str
    keras: str
    onnx: str | None
    onnx_error: str | None = None

    @property
    def id_bounds(self) -> tuple[int | None, ...]:
        """`high` of each input, as the timing harness takes them."""
        return tuple(i.high for i in self.inputs)


@dataclasses.dataclass(frozen=True)
class SuiteDir:
    """The bricks of a suite folder, sorted by signature.

    Attributes:
        folder: The suite folder (absolute).
        granularity: G the suite was cut at (None if not recorded).
        split: How: "plain" (G layer calls) or "fused" (G fusion units).
        opset: ONNX opset of the `.onnx` files.
        tool_versions: (tool, version) pairs of the exporting tools.
        entries: One entry per brick, sorted by signature.
    """

    folder: str
    granularity: int | None
    opset: int
    tool_versions: tuple[tuple[str, str], ...]
    entries: tuple[SuiteDirEntry, ...]
    split: str = "plain"

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def signatures(self) -> tuple[str, ...]:
        """The signatures, sorted."""
        return tuple(e.signature for e in self.entries)

    def chain_order(
        self, signatures: Collection[str]
    ) -> tuple[SuiteDirEntry, ...]:
        """The entries of `signatures` in the order chains take them: each
        brick after one whose outputs can feed it, where the manifest's
        specs allow (`feed_order.ordered`), not by signature.

        The order is made among these entries alone, not cut out of the
        whole suite's: a run that resumes with half the suite stored
        still chains each brick after one that feeds it where it can,
        not beside the gaps the stored bricks would leave.
        """
        return tuple(
            feed_order.ordered(
                [e for e in self.entries if e.signature in signatures]
            )
        )

    def entry(self, signature: str) -> SuiteDirEntry:
        """The entry of a signature.

        Raises:
            KeyError: If the suite has no such brick.
        """
        for e in self.entries:
            if e.signature == signature:
                return e
        raise KeyError(signature)

    def shard(self, index: int, count: int) -> SuiteDir:
        """Returns shard `index` of `count`: the split of `Suite.shard`.

        Entries sorted by signature, every `count`-th from `index`, so a
        worker given a suite folder times the same bricks as one given the
        models.

        Raises:
            ValueError: If not 0 <= index < count.
        """
        entries = shard_of(self.entries, index, count)
        return dataclasses.replace(self, entries=entries)


def sha256(path: str | os.PathLike) -> str:
    """Hex SHA-256 digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def digest_file(path: str | os.PathLike, key: str) -> Path:
    """The file whose digest the manifest keeps for a listed path.

    Args:
        path: A brick's file as listed (a SavedModel folder for
            "saved_model").
        key: "saved_model", "keras" or "onnx".
    """
    path = Path(path)
    return path / SAVED_MODEL_PB if key == "saved_model" else path


def load_suite(folder: str | os.PathLike, *, verify: bool = True) -> SuiteDir:
    """Reads and checks a suite folder written by `export_suite`.

    Args:
        folder: The suite folder.
        verify: Check every file's SHA-256 digest (reads every byte).

    Returns:
        The suite, entries sorted by signature.

    Raises:
        SuiteError: The folder or manifest is missing or malformed, of
            another format or version, or a listed file is missing or
            altered; the message names the brick and the file.

    Example:
        >>> suite = load_suite("out/suite")
        >>> suite.signatures[:3]
    """
    root = Path(folder).absolute()
    path = root / MANIFEST
    if not root.is_dir():
        raise SuiteError(
            f"Suite folder {str(root)!r} does not exist: check the path, or "
            "write one with `dlbricks export`."
        )
    what = f"Manifest {str(path)!r}"
    try:
        text = limits.read_file(path, what, SuiteError)
    except FileNotFoundError:
        raise SuiteError(
            f"Suite folder {str(root)!r} has no {MANIFEST}: it is not a "
            f"suite, or its export did not finish; {AGAIN}"
        ) from None
    except OSError as e:
        raise SuiteError(f"Cannot read {str(path)!r}: {e}; {AGAIN}") from e
    manifest = _HEADER.parse(text, what, repr(str(path)))
    bricks = manifest.get("bricks")
    if not isinstance(bricks, list):
        raise SuiteError(f"{str(path)!r} has no 'bricks' list; {AGAIN}")
    limits.check_count("bricks", len(bricks), what, SuiteError)
    entries = []
    seen: set[str] = set()
    for i, raw in enumerate(bricks):
        entry = read_entry(raw, root, verify=verify, where=f"brick {i}")
        if entry.signature in seen:
            raise SuiteError(
                f"{str(path)!r} lists brick {entry.signature} twice; {AGAIN}"
            )
        seen.add(entry.signature)
        entries.append(entry)
    granularity = manifest.get("granularity")
    opset = manifest.get("opset")
    versions = manifest.get("tool_versions") or {}
    split = manifest.get("split", "plain")
    if (
        not (granularity is None or _is_int(granularity))
        or split not in SPLITS
        or not _is_int(opset)
        or not isinstance(versions, dict)
    ):
        raise SuiteError(
            f"{str(path)!r} has a malformed granularity, split, opset or "
            f"tool_versions; {AGAIN}"
        )
    return SuiteDir(
        folder=str(root),
        granularity=granularity,
        opset=opset,
        tool_versions=tuple(
            sorted((str(k), str(v)) for k, v in versions.items())
        ),
        entries=tuple(sorted(entries, key=lambda e: e.signature)),
        split=split,
    )


def read_entry(
    raw: Any, root: Path, *, verify: bool = True, where: str = "brick"
) -> SuiteDirEntry:
    """Parses and checks one manifest entry of the suite folder `root`.

    Args:
        raw: The entry's JSON value.
        root: The suite folder the entry's paths are relative to.
        verify: Check the files' SHA-256 digests.
        where: How to name the entry while its signature is unknown.

    Returns:
        The typed entry, with absolute paths.

    Raises:
        SuiteError: If the entry is malformed or a file is missing or
            altered.
    """
    signature = _get(raw, "signature")
    if not isinstance(signature, str) or not _SIGNATURE.match(signature):
        raise SuiteError(
            f"Suite {str(root)!r}: {where} has no valid signature "
            f"({signature!r}); {AGAIN}"
        )
    name = f"Suite {str(root)!r}: brick {signature}"
    try:
        files = raw["files"]
        digests = raw["sha256"]
        entry = SuiteDirEntry(
            signature=signature,
            layers=_int(raw["layers"]),
            classes=tuple(_str(c) for c in raw["classes"]),
            inputs=tuple(
                InputSpec(
                    name=_str(s["name"]),
                    shape=_shape(s["shape"]),
                    dtype=_str(s["dtype"]),
                    high=None if s.get("high") is None else _int(s["high"]),
                )
                for s in raw["inputs"]
            ),
            outputs=tuple(
                OutputSpec(
                    name=_str(s["name"]),
                    shape=_shape(s["shape"]),
                    dtype=_str(s["dtype"]),
                )
                for s in raw["outputs"]
            ),
            saved_model=_path(root, files["saved_model"]),
            keras=_path(root, files["keras"]),
            onnx=None if files["onnx"] is None else _path(root, files["onnx"]),
            onnx_error=(
                None
                if raw.get("onnx_error") is None
                else _str(raw["onnx_error"])
            ),
        )
        if not isinstance(digests, Mapping):
            raise TypeError("sha256 is not an object")
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise SuiteError(
            f"{name}: malformed manifest entry ({type(e).__name__}: {e}); "
            f"{AGAIN}"
        ) from e
    if not entry.inputs or not entry.outputs:
        raise SuiteError(f"{name}: no inputs or no outputs listed; {AGAIN}")
    for key in FILES:
        path = getattr(entry, key)
        if path is None:
            continue
        target = digest_file(path, key)
        shown = os.path.relpath(target, root)
        try:
            present = target.is_file()
            variables = (Path(path) / "variables").is_dir()
        except OSError as e:  # A name too long for the file system.
            raise SuiteError(
                f"{name}: file {shown[:100]} cannot be opened ({e.strerror})"
                f"; {AGAIN}"
            ) from e
        if not present:
            raise SuiteError(f"{name}: file {shown} is missing; {AGAIN}")
        if key == "saved_model" and not variables:
            raise SuiteError(
                f"{name}: folder {os.path.relpath(path, root)}/variables is "
                f"missing; {AGAIN}"
            )
        if verify and sha256(target) != digests.get(key):
            raise SuiteError(
                f"{name}: file {shown} does not match its SHA-256 in the "
                f"manifest (altered or corrupt); {AGAIN}"
            )
    return entry


def _get(value: Any, key: str) -> Any:
    return value.get(key) if isinstance(value, dict) else None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: Any) -> int:
    if not _is_int(value):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _shape(value: Any) -> tuple[int | None, ...]:
    if not isinstance(value, list) or not value:
        raise TypeError(f"expected a shape list, got {value!r}")
    return tuple(None if d is None else _int(d) for d in value)


def _path(root: Path, relative: Any) -> str:
    """The absolute path of a listed file; it must stay inside `root`."""
    rel = PurePosixPath(_str(relative))
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise ValueError(f"path {str(rel)!r} leaves the suite folder")
    return str(root.joinpath(*rel.parts))
