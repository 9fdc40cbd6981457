"""Export a suite of unique bricks to a folder that can be shared.

Every brick of a `Suite` is built once, anonymously (layers `layer_0`, ...,
inputs `input_0`, ..., model `brick`; see `Brick.build`), with fresh
weights, and written three ways under `<folder>/bricks/<signature>/`:

* `saved_model/`: a SavedModel whose `serving_default` signature takes
  `input_0`, `input_1`, ... (dynamic batch) and returns a dict `output_0`,
  `output_1`, ...; the same function is the module's `serving_default`
  attribute, so `keras.layers.TFSMLayer(path, "serving_default")` can call
  it with a dict of inputs.
* `brick.keras`: the Keras model.
* `brick.onnx`: the model through tf2onnx (see `onnx_convert`), inputs
  `input_i`, outputs renamed `output_i`, checked before it is kept (ONNX
  checker, an ONNX Runtime session, outputs equal to Keras's). A brick
  that cannot be converted, or whose file fails a check, is still
  exported, with `onnx` null in its manifest entry and the reason in
  `onnx_error`.

All three hold the same weights. `<folder>/manifest.json` lists every brick:
its signature, number of layer calls, class names, input and output specs,
file paths (relative to the folder) and SHA-256 digests. No model name,
layer name or weight of a source model is written anywhere: a suite can be
published while the models stay private. (A Lambda or custom layer carries
its own code, as any Keras file does.)

Exporting resumes: each brick is written to a temporary folder and renamed
into place, with its own record (`brick.json`); a rerun skips every brick
whose record and digests check out, and the manifest is written last, in
one atomic replace. One exporter per folder at a time.

Example:
    suite = build_suite({name: decompose(m, 2) for name, m in models})
    summary = export_suite(suite, "suite", granularity=2)
    summary.written, summary.skipped
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from dlbricks_tf import errors
from dlbricks_tf.cutting import synthetic
from dlbricks_tf.measuring import onnx_convert
from dlbricks_tf.portable.suite_dir import (
    BRICKS,
    FILES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    SuiteError,
    digest_file,
    read_entry,
    sha256,
)

RECORD = "brick.json"
_TMP_PREFIX = ".tmp-"

# progress(done, total): bricks exported or found complete so far.
Progress = Callable[[int, int], None]


class ExportError(errors.Error):
    """A suite cannot be exported (a brick does not build or save)."""


@dataclasses.dataclass(frozen=True)
class ExportSummary:
    """What `export_suite` did.

    Attributes:
        folder: The suite folder.
        manifest: Path of `manifest.json`.
        written: Signatures exported by this call.
        skipped: Signatures already complete in the folder, kept.
        no_onnx: Signatures tf2onnx could not convert (no `brick.onnx`).
        wall_s: Seconds spent.
        no_onnx_reasons: Why, for each of `no_onnx`, in the same order.
    """

    folder: str
    manifest: str
    written: tuple[str, ...]
    skipped: tuple[str, ...]
    no_onnx: tuple[str, ...]
    wall_s: float
    no_onnx_reasons: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        """Bricks in the manifest."""
        return len(self.written) + len(self.skipped)


def tool_versions() -> dict[str, str]:
    """Versions of the tools that wrote a suite ("" if not installed)."""
    versions = {"dlbricks_tf": _version("dlbricks-tf")}
    versions["python"] = platform.python_version()
    for name in ("tensorflow", "keras", "tf2onnx", "onnx", "onnxruntime"):
        versions[name] = _version(name)
    return versions


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


def export_suite(
    suite: Any,
    folder: str | os.PathLike,
    *,
    granularity: int | None = None,
    split: str = "plain",
    opset: int = onnx_convert.MAX_OPSET,
    progress: Progress | None = None,
) -> ExportSummary:
    """Writes every brick of a suite, and the manifest, to a folder.

    Args:
        suite: A `dlbricks_tf.cutting.suite.Suite` (entries with
            `signature` and a buildable `brick`). Its model names and counts
            are not written.
        folder: The suite folder; created if missing. Bricks already
            complete in it are kept.
        granularity: G the suite was cut at, recorded in the manifest.
        split: How it was cut, recorded too: "plain" (G layer calls) or
            "fused" (G fusion units, `decompose(..., fuse=True)`).
        opset: ONNX opset, at most `onnx_convert.MAX_OPSET`.
        progress: Called with (done, total) after each brick.

    Returns:
        The summary.

    Raises:
        ExportError: If a brick cannot be built or saved, or the folder
            cannot be written.
        ValueError: If `opset` is out of range.

    Example:
        >>> summary = export_suite(suite, "out/suite", granularity=1)
        >>> load_suite("out/suite").signatures  # dlbricks_tf.portable.suite_dir
    """
    if not 1 <= opset <= onnx_convert.MAX_OPSET:
        raise ValueError(
            f"opset must be in 1..{onnx_convert.MAX_OPSET}. "
            f"Received: opset={opset}"
        )
    start = time.perf_counter()
    root = Path(folder)
    bricks_dir = root / BRICKS
    try:
        bricks_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ExportError(
            f"Cannot create suite folder {str(root)!r}: {e.strerror}; "
            "choose another folder."
        ) from e
    _remove_stale_temporaries(bricks_dir, "")
    _remove_stale_temporaries(root, MANIFEST)
    entries = sorted(suite.entries, key=lambda e: e.signature)
    records, written, skipped, no_onnx, reasons = [], [], [], [], []
    for done, entry in enumerate(entries, start=1):
        record = complete_record(bricks_dir / entry.signature, opset)
        if record is not None:
            skipped.append(entry.signature)
        else:
            record = _export_brick(entry, bricks_dir, opset)
            written.append(entry.signature)
        if record["files"]["onnx"] is None:
            no_onnx.append(entry.signature)
            reasons.append(record.get("onnx_error") or "unknown reason")
        records.append(record)
        if progress is not None:
            progress(done, len(entries))
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "granularity": granularity,
        "split": split,
        "opset": opset,
        "tool_versions": tool_versions(),
        "bricks": [_public(r) for r in records],
    }
    path = root / MANIFEST
    write_json_atomic(path, manifest)
    return ExportSummary(
        folder=str(root),
        manifest=str(path),
        written=tuple(written),
        skipped=tuple(skipped),
        no_onnx=tuple(no_onnx),
        wall_s=time.perf_counter() - start,
        no_onnx_reasons=tuple(reasons),
    )


def write_json_atomic(path: str | os.PathLike, data: Any) -> None:
    """Writes JSON to a temporary file beside `path`, then replaces it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(
        prefix=f"{_TMP_PREFIX}{path.name}-", dir=path.parent
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.chmod(tmp, _mode(0o666))  # mkstemp makes it private (0600).
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _mode(mode: int) -> int:
    """`mode` less this process's umask: what a plain open() would give."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def complete_record(brick_dir: Path, opset: int) -> dict[str, Any] | None:
    """A brick folder's record if its files are there and digests match.

    Args:
        brick_dir: `<suite folder>/bricks/<signature>`.
        opset: The ONNX opset the record must have been written with.

    Returns:
        The record (the brick's manifest entry plus the opset), or None if
        the folder is missing, incomplete, of another opset or altered.
    """
    try:
        record = json.loads((brick_dir / RECORD).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("opset") != opset:
        return None
    if record.get("signature") != brick_dir.name:
        return None
    # Written before ONNX files were checked (no `onnx_error` key): its
    # file may not load, so the brick is exported again.
    if "onnx_error" not in record:
        return None
    try:
        read_entry(_public(record), brick_dir.parent.parent)
    except SuiteError:
        return None
    return record


def _public(record: dict[str, Any]) -> dict[str, Any]:
    """The manifest entry of a brick record."""
    return {k: v for k, v in record.items() if k != "opset"}


def _remove_stale_temporaries(folder: Path, name: str) -> None:
    """Removes what an export stopped half way left behind in `folder`."""
    for path in folder.glob(f"{_TMP_PREFIX}{name}*"):
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _export_brick(entry: Any, bricks_dir: Path, opset: int) -> dict:
    signature = entry.signature
    brick = entry.brick
    try:
        model = brick.build(None, anonymous=True)
    except Exception as e:  # Keras raises many types.
        raise ExportError(
            f"Brick {signature} ({', '.join(brick.class_names)}) does not "
            f"build with a dynamic batch: {type(e).__name__}: "
            f"{_first_line(e)}"
        ) from e
    tmp = Path(
        tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{signature}-", dir=bricks_dir)
    )
    try:
        inputs, outputs = _specs(model)
        _save_saved_model(model, tmp / FILES["saved_model"], signature)
        _save_keras(model, tmp / FILES["keras"], signature)
        onnx_error = _save_onnx(model, tmp / FILES["onnx"], opset)
        has_onnx = onnx_error is None
        rel = f"{BRICKS}/{signature}"
        record = {
            "signature": signature,
            "layers": len(brick.layers),
            "classes": list(brick.class_names),
            "inputs": inputs,
            "outputs": outputs,
            "files": {
                key: f"{rel}/{name}" if key != "onnx" or has_onnx else None
                for key, name in FILES.items()
            },
            "sha256": {
                key: sha256(digest_file(tmp / FILES[key], key))
                if key != "onnx" or has_onnx
                else None
                for key in FILES
            },
            "onnx_error": onnx_error,
            "opset": opset,
        }
        write_json_atomic(tmp / RECORD, record)
        os.chmod(tmp, _mode(0o777))  # mkdtemp makes it private (0700).
        target = bricks_dir / signature
        if target.exists():  # Incomplete or altered: replaced whole.
            shutil.rmtree(target)
        os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return record


def _specs(model: Any) -> tuple[list[dict], list[dict]]:
    bounds = synthetic.id_bounds(model)
    inputs = [
        {
            "name": f"input_{i}",
            "shape": list(t.shape),
            "dtype": str(t.dtype),
            "high": bound,
        }
        for i, (t, bound) in enumerate(zip(model.inputs, bounds, strict=True))
    ]
    outputs = [
        {"name": f"output_{i}", "shape": list(t.shape), "dtype": str(t.dtype)}
        for i, t in enumerate(model.outputs)
    ]
    return inputs, outputs


def _save_saved_model(model: Any, path: Path, signature: str) -> None:
    import keras
    import tensorflow as tf

    names = [f"input_{i}" for i in range(len(model.inputs))]
    specs = {
        name: tf.TensorSpec((None, *t.shape[1:]), t.dtype, name=name)
        for name, t in zip(names, model.inputs, strict=True)
    }

    # One dict argument: the signature's inputs are named by the specs, and
    # TFSMLayer can call the attribute with a dict (a signature function
    # takes keyword arguments only).
    @tf.function(input_signature=[specs])
    def serving_default(inputs):
        xs = [inputs[name] for name in names]
        outputs = model(xs if len(xs) > 1 else xs[0], training=False)
        return {
            f"output_{i}": y for i, y in enumerate(keras.tree.flatten(outputs))
        }

    module = tf.Module()
    module.brick_variables = list(model.variables)
    module.serving_default = serving_default
    try:
        tf.saved_model.save(
            module, str(path), signatures={"serving_default": serving_default}
        )
    except Exception as e:  # TensorFlow raises many types.
        raise ExportError(
            f"Cannot save brick {signature} as a SavedModel: "
            f"{type(e).__name__}: {_first_line(e)}"
        ) from e


def _save_keras(model: Any, path: Path, signature: str) -> None:
    try:
        model.save(str(path))
    except Exception as e:  # Keras raises many types.
        raise ExportError(
            f"Cannot save brick {signature} as a .keras file: "
            f"{type(e).__name__}: {_first_line(e)}"
        ) from e


def _save_onnx(model: Any, path: Path, opset: int) -> str | None:
    """Converts to a checked ONNX file, outputs named output_i.

    Returns:
        None if the file was written, else why not (one line); no file is
        left behind then.
    """
    try:
        info = onnx_convert.to_onnx(model, path, opset=opset)
        import onnx

        proto = onnx.load(str(path))
        name_outputs(
            proto.graph, [f"output_{i}" for i in range(len(info.output_names))]
        )
        onnx_convert.check_proto(proto)
        onnx.save(proto, str(path))
    except onnx_convert.ConversionError as e:
        path.unlink(missing_ok=True)
        return " ".join(str(e).split())
    return None


def name_outputs(graph: Any, names: Sequence[str]) -> None:
    """Names an ONNX graph's outputs in place, through Identity nodes.

    An Identity node per output leaves every other use of the old name
    (another node's input, a graph input passed through) intact; ONNX
    Runtime removes it when it optimises the graph.
    """
    from onnx import helper

    for output, name in zip(graph.output, names, strict=True):
        if output.name == name:
            continue
        graph.node.append(
            helper.make_node("Identity", [output.name], [name], name=name)
        )
        output.name = name


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""
