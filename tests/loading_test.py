"""Tests of dlbricks_tf/cutting/loading.py: models from files, configs only."""

import json
import zipfile

import pytest

import dlbricks_tf
from dlbricks_tf.cutting import loading
from tests import models


def _layers(d):
    return [name for b in d.bricks for name in b.layers]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model, _ = models.residual()
    folder = tmp_path_factory.mktemp("saved")
    model.save(folder / "m.keras")
    model.save(folder / "m.h5")
    (folder / "m.json").write_text(model.to_json())
    (folder / "bare.json").write_text(json.dumps(model.get_config()))
    return model, folder


@pytest.mark.parametrize("name", ["m.keras", "m.h5", "m.json", "bare.json"])
def test_files_decompose_like_the_model_in_memory(saved, name):
    model, folder = saved
    want = dlbricks_tf.decompose(model, granularity=2)
    got = dlbricks_tf.decompose(folder / name, granularity=2)
    assert _layers(got) == _layers(want)
    assert [b.signature for b in got.bricks] == [
        b.signature for b in want.bricks
    ]
    assert got.bricks[0].build() is not None


def test_keras_archive_weights_are_never_read(saved, tmp_path):
    # Replace the archive's weights with garbage: decomposing still works.
    model, folder = saved
    path = tmp_path / "garbage_weights.keras"
    with zipfile.ZipFile(folder / "m.keras") as src:
        with zipfile.ZipFile(path, "w") as dst:
            for item in src.infolist():
                data = src.read(item)
                if item.filename.endswith(".h5"):
                    data = b"not an hdf5 file"
                dst.writestr(item, data)
    d = dlbricks_tf.decompose(path)
    assert _layers(d) == _layers(dlbricks_tf.decompose(model))


def test_missing_file(tmp_path):
    with pytest.raises(dlbricks_tf.LoadError, match="does not exist"):
        dlbricks_tf.decompose(tmp_path / "nope.keras")


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_truncated_file(saved, tmp_path, suffix):
    _, folder = saved
    data = (folder / f"m{suffix}").read_bytes()
    path = tmp_path / f"cut{suffix}"
    path.write_bytes(data[: len(data) // 3])
    with pytest.raises(dlbricks_tf.LoadError, match="corrupt"):
        dlbricks_tf.decompose(path)


def test_malformed_json(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"class_name": "Functional", "config": {')
    with pytest.raises(dlbricks_tf.LoadError, match="malformed JSON"):
        dlbricks_tf.decompose(path)


def test_json_that_is_no_model(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"hello": 1}')
    with pytest.raises(dlbricks_tf.LoadError, match="no model config|not hold"):
        dlbricks_tf.decompose(path)


def test_unknown_extension_and_type(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"x")
    with pytest.raises(dlbricks_tf.LoadError, match="unknown extension"):
        dlbricks_tf.decompose(path)
    with pytest.raises(dlbricks_tf.LoadError, match="type int"):
        dlbricks_tf.decompose(42)


@pytest.mark.parametrize("kind", sorted(models.ALL))
def test_every_kind_round_trips_through_a_keras_file(kind, tmp_path):
    model, _ = models.ALL[kind]()
    path = tmp_path / f"{kind}.keras"
    model.save(path)
    want = dlbricks_tf.decompose(model, granularity=2)
    got = dlbricks_tf.decompose(path, granularity=2, safe_mode=False)
    assert _layers(got) == _layers(want)
    assert [b.signature for b in got.bricks] == [
        b.signature for b in want.bricks
    ]


@pytest.mark.parametrize("kind", sorted(models.ALL))
def test_model_config_equals_keras_get_config(kind):
    # loading.model_config skips Keras's final deep copy; nothing else.
    model, _ = models.ALL[kind]()
    want = json.dumps(model.get_config(), sort_keys=True, default=str)
    got = json.dumps(loading.model_config(model), sort_keys=True, default=str)
    assert got == want


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
