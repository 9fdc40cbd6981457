"""Tests of dlbricks_tf/limits.py: what a reader accepts from a file.

Each limit is tried on real files written by Keras, `export_suite` and
`Recipe.save`: with the limit set exactly to what the file holds, it is
read; one below, it is refused with one line naming the flag that raises
the limit. The attacks that motivated the limits (JSON nested 200,000
deep, a config.json that inflates to 100 MiB) are refused under the
default limits before the bytes are read, and through the command line in
one line.

Example:
    python -m pytest tests/limits_test.py -p no:cacheprovider
"""

import json
import zipfile

import h5py
import keras
import pytest

import dlbricks_tf
from dlbricks_tf import errors, limits
from dlbricks_tf.cutting import loading, suite
from dlbricks_tf.portable import export, recipe
from dlbricks_tf.portable import suite_dir as suite_dir_lib
from tests import cli


def _model() -> keras.Model:
    inp = keras.Input((6,))
    x = keras.layers.Dense(5, activation="relu")(inp)
    return keras.Model(inp, keras.layers.Dense(2)(x), name="tiny")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("limits")
    model = _model()
    paths = {
        "keras": folder / "tiny.keras",
        "h5": folder / "tiny.h5",
        "json": folder / "tiny.json",
        "suite": folder / "suite",
        "recipe": folder / f"tiny{recipe.SUFFIX}",
    }
    model.save(paths["keras"])
    model.save(paths["h5"])
    paths["json"].write_text(model.to_json())
    d = dlbricks_tf.decompose(model, 1)
    export.export_suite(suite.build_suite({"tiny": d}), paths["suite"])
    recipe.from_decomposition("tiny", d).save(paths["recipe"])
    return paths


def _config_bytes(files, kind: str) -> bytes:
    if kind == "keras":
        with zipfile.ZipFile(files["keras"]) as z:
            return z.read("config.json")
    if kind == "h5":
        with h5py.File(files["h5"], "r") as f:
            text = f.attrs["model_config"]
        return text.encode() if isinstance(text, str) else bytes(text)
    return files[kind].read_bytes()


def _read(files, kind: str):
    if kind == "suite":
        return suite_dir_lib.load_suite(files["suite"])
    if kind == "recipe":
        return recipe.load(files["recipe"])
    return loading.load(str(files[kind]))


def _manifest(files) -> bytes:
    return (files["suite"] / suite_dir_lib.MANIFEST).read_bytes()


def _refused(files, kind: str, flag: str, **limit) -> str:
    with limits.using(limits.Limits(**limit)):
        with pytest.raises(errors.Error) as info:
            _read(files, kind)
    message = str(info.value)
    assert flag in message and "\n" not in message, message
    return message


def _accepted(files, kind: str, **limit) -> None:
    with limits.using(limits.Limits(**limit)):
        _read(files, kind)


@pytest.mark.parametrize("kind", ["keras", "h5", "json", "suite", "recipe"])
def test_document_size_at_and_over_the_limit(files, kind):
    size = len(
        _manifest(files) if kind == "suite" else _config_bytes(files, kind)
    )
    _accepted(files, kind, file_bytes=size)
    _refused(files, kind, "--max_file_mb", file_bytes=size - 1)


@pytest.mark.parametrize("kind", ["keras", "h5", "json", "suite", "recipe"])
def test_json_depth_at_and_over_the_limit(files, kind):
    text = _manifest(files) if kind == "suite" else _config_bytes(files, kind)
    depth = limits.json_depth(text)
    assert depth == _python_depth(json.loads(text))
    _accepted(files, kind, json_depth=depth)
    _refused(files, kind, "--max_json_depth", json_depth=depth - 1)


@pytest.mark.parametrize("kind", ["keras", "h5", "json"])
def test_layer_count_at_and_over_the_limit(files, kind):
    layers = len(json.loads(_config_bytes(files, kind))["config"]["layers"])
    assert layers == 3  # Input and two Dense.
    _accepted(files, kind, layers=layers)
    message = _refused(files, kind, "--max_layers", layers=layers - 1)
    assert "holds 3 layers" in message


def test_nested_models_count_their_layers(files, tmp_path):
    inner = _model()
    inp = keras.Input((6,))
    outer = keras.Model(inp, keras.layers.Dense(1)(inner(inp)))
    path = tmp_path / "nested.keras"
    outer.save(path)
    # Outer: Input, the nested model, Dense; inner: 3.
    assert loading.count_layers(loading.load(str(path)).entry) == 6
    with limits.using(limits.Limits(layers=5)):
        with pytest.raises(errors.LoadError, match="--max_layers"):
            loading.load(str(path))


@pytest.mark.parametrize("kind", ["suite", "recipe"])
def test_brick_count_at_and_over_the_limit(files, kind):
    count = len(_read(files, kind).signatures)
    assert count == 2  # The two Dense layers (the Input is no brick).
    _accepted(files, kind, bricks=count)
    _refused(files, kind, "--max_bricks", bricks=count - 1)


def test_keras_member_size_at_and_over_the_limit(files):
    with zipfile.ZipFile(files["keras"]) as z:
        largest = max(i.file_size for i in z.infolist())
    _accepted(files, "keras", member_bytes=largest)
    message = _refused(
        files, "keras", "--max_member_mb", member_bytes=largest - 1
    )
    assert "model.weights.h5" in message


def test_deeply_nested_json_is_refused_before_parsing(tmp_path):
    path = tmp_path / "deep.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", "[" * 200_000)
    assert path.stat().st_size < 1000
    with pytest.raises(errors.LoadError) as info:
        loading.load(str(path))
    assert "nests JSON 200,000 deep" in str(info.value)
    assert "--max_json_depth" in str(info.value)


def test_zip_bomb_is_refused_from_its_directory(tmp_path):
    path = tmp_path / "bomb.keras"
    inflated = 100 * limits.MIB  # Over the default 64 MiB.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", b" " * inflated)
    assert path.stat().st_size < limits.MIB
    with pytest.raises(errors.LoadError) as info:
        loading.load(str(path))
    assert "config.json is 100.0 MiB" in str(info.value)
    assert "--max_file_mb" in str(info.value)


def test_zip_member_that_lies_about_its_size_is_read_only_to_the_limit(
    tmp_path,
):
    # A directory entry that announces a smaller member than the stream
    # holds: the read stops at the limit, whatever the header says.
    path = tmp_path / "liar.keras"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("config.json", b" " * 5000)
    data = bytearray(path.read_bytes())
    real = (5000).to_bytes(4, "little")
    fake = (100).to_bytes(4, "little")
    assert data.count(real) == 4  # Sizes in the local and central headers.
    path.write_bytes(bytes(data).replace(real, fake))
    with limits.using(limits.Limits(file_bytes=1000)):
        with pytest.raises(errors.LoadError):
            loading.load(str(path))


@pytest.mark.parametrize(
    "text, depth",
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'["[[[", "\\"[[", [["]]"]]]', 3),  # Brackets in strings.
        (b'"\\\\"[[', 2),  # An escaped backslash ends the string.
        (b'"' + b"[" * 50, 0),  # An unterminated string.
        (b"]]][[", 0),  # Malformed: never below the start.
    ],
)
def test_json_depth_ignores_strings(text, depth):
    assert limits.json_depth(text) == depth


def test_json_depth_is_linear_on_unterminated_strings():
    # Quadratic scanning would take minutes here: one string per quote,
    # each running to the end of the text.
    text = b'"\\' * 2_000_000 + b"[["
    assert limits.json_depth(text) == 0


def test_json_number_of_too_many_digits_is_one_error(tmp_path):
    path = tmp_path / "digits.json"
    path.write_text('{"layers": [], "n": ' + "9" * 5000 + "}")
    with pytest.raises(errors.LoadError, match="not valid JSON"):
        loading.load(str(path))


def _python_depth(value) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_python_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_python_depth, value), default=0)
    return 0


def test_command_line_refuses_in_one_line(tmp_path):
    deep = tmp_path / "deep.keras"
    with zipfile.ZipFile(deep, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", "[" * 200_000)
    proc = cli.dlbricks("decompose", f"--models={deep}")
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("dlbricks: error: ")
    assert "--max_json_depth" in lines[0]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
