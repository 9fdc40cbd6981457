"""Reads a model's serialized config from memory or from a file.

Only the config is read: a `.keras` archive's `config.json`, an `.h5` file's
`model_config` attribute, or a config JSON file. No weight is loaded, so a
private model's weights never need to leave its file.

A model file may come from anyone: every size is checked against
`dlbricks_tf.limits` before the bytes are read (a `.keras` member's
uncompressed size, a config's size, its JSON nesting, its layer count).

A Functional subclass whose `get_config()` holds its constructor arguments
instead of its layer graph (keras_hub's backbones: `BertBackbone`,
`GPT2Backbone`, `GemmaBackbone`, ...) is walked through its live graph,
`keras.Model(m.inputs, m.outputs)`. From a file, such a model is first
rebuilt from its config by its registered class (its constructor runs;
no weight is read), which is why its module must have been imported
(`import keras_hub`, or `--import=keras_hub` on the command line).
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
import zlib
from collections.abc import Mapping
from typing import Any

import keras
from keras.src.models import functional as functional_lib
from keras.src.ops import function as function_lib
from keras.src.saving import serialization_lib

from dlbricks_tf import limits
from dlbricks_tf.errors import DecompositionError, LoadError


@dataclasses.dataclass(frozen=True)
class Source:
    """A model's config and what is known about where it came from.

    Attributes:
        entry: the serialized model, `{"class_name": ..., "config": {...}}`.
        live_classes: for a model in memory, each call's class by qualified
            layer name (empty for files).
        trusted: the model was in memory, so its code already runs here.
    """

    entry: dict
    live_classes: Mapping[str, type]
    trusted: bool


def load(model_or_path: Any, safe_mode: bool = True) -> Source:
    """Returns the config of a `keras.Model` or of a model file.

    Args:
        model_or_path: a Functional or Sequential `keras.Model`, or the path
            of a `.keras`, `.h5`/`.hdf5` or config `.json` file.
        safe_mode: refuse Lambda layers when a model of a file has to be
            rebuilt from its class (see the module docstring).

    Raises:
        LoadError: the file is missing, corrupt or of an unknown kind.
        DecompositionError: the model has no serializable layer graph.
    """
    if isinstance(model_or_path, keras.Model):
        return _from_model(model_or_path)
    if isinstance(model_or_path, str | os.PathLike):
        path = os.fspath(model_or_path)
        entry = _read_file(path)
        if _has_graph(entry):
            return Source(entry, {}, False)
        source = _from_model(_rebuild(entry, path, safe_mode))
        return dataclasses.replace(source, trusted=False)
    raise LoadError(
        f"Cannot decompose an object of type {type(model_or_path).__name__}: "
        "pass a keras.Model or the path of a .keras, .h5 or .json file."
    )


def model_config(model: keras.Model) -> dict:
    """`model.get_config()`, faster for a plain Functional model.

    Keras's `Functional.get_config` ends with a deep copy of the whole
    config, about a third of its time; the walk only reads the config, so
    for a plain Functional model this builds the same config, the same way,
    without that copy. Anything else goes through `get_config()`.
    """
    if type(model) is not functional_lib.Functional:
        return model.get_config()
    own_nodes = model._nodes  # noqa: SLF001
    reindex = {}
    for operation in model.operations:
        kept = 1 if isinstance(operation, functional_lib.Functional) else 0
        for index, _ in enumerate(operation._inbound_nodes):  # noqa: SLF001
            key = function_lib.make_node_key(operation, index)
            if key in own_nodes:
                reindex[key] = kept
                kept += 1
    layers = []
    for operation in model.operations:
        nodes = []
        for index, node in enumerate(operation._inbound_nodes):  # noqa: SLF001
            if function_lib.make_node_key(operation, index) in own_nodes:
                data = functional_lib.serialize_node(node, own_nodes=own_nodes)
                if data is not None:
                    nodes.append(data)
        entry = serialization_lib.serialize_keras_object(operation)
        entry["name"] = operation.name
        entry["inbound_nodes"] = nodes
        layers.append(entry)

    def tensor_config(tensor):
        operation, node_index, tensor_index = tensor._keras_history  # noqa: SLF001
        key = function_lib.make_node_key(operation, node_index)
        return [operation.name, reindex[key], tensor_index]

    return {
        "name": model.name,
        "trainable": model.trainable,
        "layers": layers,
        "input_layers": keras.tree.map_structure(
            tensor_config,
            model._inputs_struct,  # noqa: SLF001
        ),
        "output_layers": keras.tree.map_structure(
            tensor_config,
            model._outputs_struct,  # noqa: SLF001
        ),
    }


def _has_graph(entry: dict) -> bool:
    config = entry.get("config")
    return isinstance(config, dict) and isinstance(config.get("layers"), list)


def _rebuild(entry: dict, path: str, safe_mode: bool) -> keras.Model:
    """A model of a file whose config holds no layer graph, from its class."""
    name = entry.get("registered_name") or entry.get("class_name")
    try:
        model = serialization_lib.deserialize_keras_object(
            entry, safe_mode=safe_mode
        )
    except Exception as e:  # Keras raises TypeError, ValueError, ...
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        raise DecompositionError(
            f"Model file '{path}' holds a {name!r} whose config is not a "
            f"layer graph, and it cannot be rebuilt from its class: {first} "
            "If a module registers the class (keras_hub, your own), import "
            "it first (on the command line: --import=keras_hub or "
            "--import=your.module)."
        ) from e
    if not isinstance(model, keras.Model):
        raise DecompositionError(
            f"Model file '{path}' holds a {name!r}, which is not a "
            "keras.Model; save the model itself."
        )
    return model


def _from_model(model: keras.Model) -> Source:
    try:
        config = model_config(model)
    except NotImplementedError as e:
        if isinstance(model, functional_lib.Functional):  # A layer's.
            raise DecompositionError(
                f"Model '{model.name}' ({type(model).__name__}) cannot be "
                f"serialized: a layer's get_config() is not implemented "
                f"({_first_line(e) or 'NotImplementedError'}); fix or "
                "upgrade the package that defines it."
            ) from e
        raise DecompositionError(
            f"Model '{model.name}' ({type(model).__name__}) has no config: "
            "it is a subclassed keras.Model. Rebuild it with the Functional "
            "API or keras.Sequential."
        ) from e
    except Exception as e:  # A layer's own get_config() may be broken.
        raise DecompositionError(
            f"Model '{model.name}' ({type(model).__name__}) cannot be "
            f"serialized: {type(e).__name__}: {_first_line(e)} (a layer's "
            "get_config() failed; fix or upgrade the package that "
            "defines it)."
        ) from e
    if (
        isinstance(config, dict)
        and "layers" not in config
        and isinstance(model, functional_lib.Functional)
        and type(model) is not functional_lib.Functional
    ):
        # A Functional subclass whose config holds constructor arguments
        # (keras_hub): the same live graph as a plain Functional model.
        plain = keras.Model(model.inputs, model.outputs, name=model.name)
        return _from_model(plain)
    class_name = (
        "Sequential" if isinstance(model, keras.Sequential) else "Functional"
    )
    if not isinstance(config, dict) or "layers" not in config:
        raise DecompositionError(
            f"Model '{model.name}' ({type(model).__name__}) has no layer "
            "graph in its config: it is a subclassed keras.Model. Rebuild it "
            "with the Functional API or keras.Sequential."
        )
    live: dict[str, type] = {}
    _collect_classes(model, "", live)
    return Source({"class_name": class_name, "config": config}, live, True)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def _collect_classes(model: keras.Model, prefix: str, out: dict) -> None:
    operations = (
        model.layers
        if isinstance(model, keras.Sequential)
        else model.operations
    )
    for op in operations:
        name = prefix + op.name
        if isinstance(op, keras.Sequential) or (
            isinstance(op, keras.Model) and hasattr(op, "operations")
        ):
            _collect_classes(op, name + "/", out)
        else:
            out[name] = type(op)


def read_config(path: str | os.PathLike) -> dict:
    """The serialized model a file holds, as written, within the limits.

    Nothing is rebuilt: `{"class_name": ..., "config": {...}}` as read.

    Raises:
        LoadError: the file is missing, corrupt, of an unknown kind or over
            a limit of `dlbricks_tf.limits`.
    """
    return _read_file(os.fspath(path))


def _read_file(path: str) -> dict:
    if not os.path.exists(path):
        raise LoadError(f"Model file '{path}' does not exist.")
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".keras":
        return _read_keras(path)
    if suffix in (".h5", ".hdf5"):
        return _read_h5(path)
    if suffix == ".json":
        return _read_json(path)
    raise LoadError(
        f"Model file '{path}' has an unknown extension {suffix!r}: use a "
        ".keras archive, an .h5 file or a model-config .json file."
    )


def _read_keras(path: str) -> dict:
    what = f"Model file {path!r}"
    try:
        with zipfile.ZipFile(path) as archive:
            # Sizes from the archive's directory, checked before any byte
            # is inflated; the read itself stops at the limit too, in case
            # the directory lies.
            for info in archive.infolist():
                limits.check_bytes(
                    "member_bytes",
                    info.file_size,
                    f"{what}: member {info.filename!r}",
                    LoadError,
                )
            info = archive.getinfo("config.json")
            limits.check_bytes(
                "file_bytes", info.file_size, f"{what}: config.json", LoadError
            )
            with archive.open(info) as member:
                text = limits.read_capped(
                    member, "file_bytes", f"{what}: config.json", LoadError
                )
    except (zipfile.BadZipFile, KeyError, OSError, EOFError) as e:
        raise LoadError(
            f"Model file '{path}' is not a readable .keras archive "
            f"(truncated or corrupt: {_first_line(e)}); save it again with "
            "model.save()."
        ) from e
    except (NotImplementedError, RuntimeError, ValueError, zlib.error) as e:
        # An unsupported compression or encryption, a corrupt stream.
        raise LoadError(
            f"Model file '{path}' is not a readable .keras archive "
            f"({type(e).__name__}: {_first_line(e)}); save it again with "
            "model.save()."
        ) from e
    return _parse(text, path)


def _read_h5(path: str) -> dict:
    import h5py  # Only .h5 files need it.

    what = f"Model file {path!r}: model_config"
    try:
        with h5py.File(path, "r") as f:
            if "model_config" not in f.attrs:
                text = None
            else:
                attribute = f.attrs.get_id("model_config")
                # A fixed-length string's size is known before reading it;
                # a variable-length one is stored in the file, so it is
                # never larger than the file, and is checked once read.
                if attribute.dtype.kind == "S":
                    limits.check_bytes(
                        "file_bytes",
                        attribute.dtype.itemsize
                        * _product(attribute.shape or ()),
                        what,
                        LoadError,
                    )
                text = f.attrs.get("model_config")
    except (OSError, KeyError, ValueError, TypeError, RuntimeError) as e:
        raise LoadError(
            f"Model file '{path}' is not a readable HDF5 file (truncated or "
            f"corrupt: {_first_line(e)}); save it again with model.save()."
        ) from e
    if text is None:
        raise LoadError(
            f"Model file '{path}' holds no model config (weights only?); "
            "save the whole model with model.save('model.h5')."
        )
    if not isinstance(text, str | bytes):
        raise LoadError(
            f"Model file '{path}' holds a model_config that is not text "
            f"({type(text).__name__}); save it again with model.save()."
        )
    return _parse(text, path)


def _read_json(path: str) -> dict:
    what = f"Model file {path!r}"
    try:
        text = limits.read_file(path, what, LoadError)
    except OSError as e:
        raise LoadError(f"Model file '{path}' cannot be read: {e}.") from e
    return _parse(text, path)


def _parse(text: str | bytes, path: str) -> dict:
    data = limits.parse_json(
        text,
        f"Model file {path!r}",
        LoadError,
        "; it holds malformed JSON: export the config again with "
        "model.to_json()",
    )
    if not isinstance(data, dict):
        raise LoadError(
            f"Model file '{path}' does not hold a Keras model config."
        )
    if "class_name" in data and isinstance(data.get("config"), dict):
        entry = data
    elif isinstance(data.get("layers"), list):
        kind = "Functional" if "input_layers" in data else "Sequential"
        entry = {"class_name": kind, "config": data}
    else:
        raise LoadError(
            f"Model file '{path}' does not hold a Keras model config (no "
            "'class_name'/'config' or 'layers'); export it with "
            "model.to_json()."
        )
    limits.check_count(
        "layers", count_layers(entry), f"Model file {path!r}", LoadError
    )
    return entry


def count_layers(entry: Any) -> int:
    """Layer entries in a serialized model, nested models' included.

    Iterative (a stack, not recursion): the JSON depth limit already bounds
    the nesting, but a count should not depend on it.
    """
    count, stack = 0, [entry]
    while stack:
        node = stack.pop()
        config = node.get("config") if isinstance(node, dict) else None
        layers = config.get("layers") if isinstance(config, dict) else None
        if not isinstance(layers, list):
            continue
        count += len(layers)
        stack.extend(layers)
    return count


def _product(shape: tuple[int, ...]) -> int:
    result = 1
    for n in shape:
        result *= int(n)
    return result


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
