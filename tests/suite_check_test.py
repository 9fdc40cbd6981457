"""Tests of dlbricks_tf/portable/suite_check.py: checks before bricks run.

A suite exported from the test models (real SavedModels and ONNX files)
passes every check on both backends. Then its author plants, as an author
can (updating the manifest's digests): a SavedModel that also writes a file
(`tf.io.write_file`), one that calls Python (`tf.py_function`), an ONNX
file whose external data lies outside the suite, one with a custom
operator domain, and a brick file that is a symlink out of the suite
folder. Each is refused with its reason; through `bench --suite`, the
planted brick is recorded as failed and not run (no file is written),
and every other brick is timed.

Example:
    python -m pytest tests/suite_check_test.py -p no:cacheprovider
"""

import json
import os
import shutil
import sqlite3
from pathlib import Path

import onnx
import pytest
import tensorflow as tf
from onnx import external_data_helper

import dlbricks_tf
from dlbricks_tf.cutting import suite
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import timing
from dlbricks_tf.portable import export, suite_bench, suite_check, suite_dir
from tests import cli, models


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    decompositions = {
        name: dlbricks_tf.decompose(models.ALL[name]()[0], 1)
        for name in ("chain", "residual", "multi_io")
    }
    folder = tmp_path_factory.mktemp("check") / "suite"
    export.export_suite(suite.build_suite(decompositions), folder)
    return folder


def _copy(exported: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "suite"
    shutil.copytree(exported, folder, symlinks=True)
    return folder


def _same_shape_entry(folder: Path) -> suite_dir.SuiteDirEntry:
    """A float brick whose one output has its one input's shape."""
    for entry in suite_dir.load_suite(folder).entries:
        if (
            len(entry.inputs) == len(entry.outputs) == 1
            and entry.inputs[0].shape == entry.outputs[0].shape
            and entry.inputs[0].dtype == "float32"
        ):
            return entry
    raise AssertionError("no brick with one same-shaped input and output")


def _redigest(folder: Path, signature: str) -> None:
    """Updates a brick's digests in the manifest, as its author can."""
    path = folder / suite_dir.MANIFEST
    manifest = json.loads(path.read_text())
    for raw in manifest["bricks"]:
        if raw["signature"] == signature:
            for key, rel in raw["files"].items():
                if rel is not None:
                    target = suite_dir.digest_file(folder / rel, key)
                    raw["sha256"][key] = suite_dir.sha256(target)
    path.write_text(json.dumps(manifest))


def _plant_saved_model(entry, side_effect) -> None:
    """Replaces a brick's SavedModel by y = x plus `side_effect(x)`."""
    spec = entry.inputs[0]
    specs = {
        "input_0": tf.TensorSpec(
            (None, *spec.shape[1:]), spec.dtype, name="input_0"
        )
    }

    @tf.function(input_signature=[specs])
    def serving_default(inputs):
        x = inputs["input_0"]
        with tf.control_dependencies([side_effect(x)]):
            return {"output_0": tf.identity(x)}

    module = tf.Module()
    module.serving_default = serving_default
    shutil.rmtree(entry.saved_model)
    tf.saved_model.save(
        module,
        entry.saved_model,
        signatures={"serving_default": serving_default},
    )


def test_exported_suite_passes_every_check(exported):
    s = suite_dir.load_suite(exported)
    assert len(s) > 10
    assert suite_check.refusals(s, "tf") == {}
    assert suite_check.refusals(s, "onnxruntime") == {}
    ops = set()
    for entry in s.entries:
        for names in suite_check.saved_model_ops(entry.saved_model).values():
            ops |= names
    assert {"Conv2D", "SaveV2", "RestoreV2"} <= ops


def test_write_file_savedmodel_is_refused(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    entry = _same_shape_entry(folder)
    target = tmp_path / "written.txt"
    _plant_saved_model(
        entry, lambda x: tf.io.write_file(str(target), tf.strings.as_string(1))
    )
    _redigest(folder, entry.signature)
    s = suite_dir.load_suite(folder)  # The digests match: the author's.
    refused = suite_check.refusals(s, "tf")
    assert list(refused) == [entry.signature]
    assert "WriteFile" in refused[entry.signature]
    assert not target.exists()


def test_py_function_savedmodel_is_refused(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    entry = _same_shape_entry(folder)
    _plant_saved_model(
        entry, lambda x: tf.py_function(lambda t: t, [x], tf.float32)
    )
    reason = suite_check.check_saved_model(entry.saved_model)
    assert reason and "PyFunc" in reason


def test_onnx_external_data_outside_the_suite_is_refused(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    entry = next(
        e
        for e in suite_dir.load_suite(folder).entries
        if e.onnx and onnx.load(e.onnx).graph.initializer
    )
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"\0" * 4096)
    model = onnx.load(entry.onnx)
    tensor = model.graph.initializer[0]
    location = os.path.relpath(outside, os.path.dirname(entry.onnx))
    assert location.startswith("..")
    external_data_helper.set_external_data(tensor, location=location)
    tensor.ClearField("raw_data")
    tensor.ClearField("float_data")
    onnx.save(model, entry.onnx)
    _redigest(folder, entry.signature)
    s = suite_dir.load_suite(folder)
    refused = suite_check.refusals(s, "onnxruntime")
    assert list(refused) == [entry.signature]
    assert "outside its brick's folder" in refused[entry.signature]
    # The tf backend runs the SavedModel, not the ONNX file.
    assert suite_check.refusals(s, "tf") == {}


def test_onnx_custom_domain_is_refused(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    entry = next(e for e in suite_dir.load_suite(folder).entries if e.onnx)
    model = onnx.load(entry.onnx)
    model.graph.node[0].domain = "com.example"
    model.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
    onnx.save(model, entry.onnx)
    reason = suite_check.check_onnx(entry.onnx)
    assert reason and "com.example" in reason


def test_symlink_out_of_the_suite_is_refused(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    entry = suite_dir.load_suite(folder).entries[0]
    outside = tmp_path / "elsewhere.keras"
    shutil.move(entry.keras, outside)
    os.symlink(outside, entry.keras)
    s = suite_dir.load_suite(folder)  # Same bytes, same digest.
    for backend in ("tf", "onnxruntime"):
        refused = suite_check.refusals(s, backend)
        assert list(refused) == [entry.signature]
        assert "outside the suite folder" in refused[entry.signature]


def test_symlink_inside_the_suite_is_accepted(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    entry = suite_dir.load_suite(folder).entries[0]
    kept = Path(folder) / "kept.keras"
    shutil.move(entry.keras, kept)
    os.symlink(kept, entry.keras)
    assert suite_check.refusals(suite_dir.load_suite(folder), "tf") == {}


def test_measurer_refuses_and_unsafe_runs(exported, tmp_path):
    folder = _copy(exported, tmp_path)
    entry = _same_shape_entry(folder)
    target = tmp_path / "written.txt"
    _plant_saved_model(
        entry, lambda x: tf.io.write_file(str(target), tf.strings.as_string(1))
    )
    settings = settings_lib.RunSettings.default(1, intra_op_threads=1)
    measure = suite_bench.measurer(
        settings, check_settings=False, suite_folder=str(folder)
    )
    with pytest.raises(suite_check.RefusedBrickError, match="WriteFile"):
        measure(entry)
    assert not target.exists()
    # --unsafe_suite: the user trusts the suite, and it runs as written.
    fast = timing.TimingOptions(
        min_samples=3, max_samples=3, max_seconds=0.1, target_sample_ms=0.5
    )
    unsafe = suite_bench.measurer(
        settings, fast, check_settings=False, unsafe=True
    )
    assert unsafe(entry).samples >= 3
    assert target.exists()


def test_bench_records_a_planted_brick_as_failed_and_times_the_rest(
    exported, tmp_path
):
    folder = _copy(exported, tmp_path)
    entry = _same_shape_entry(folder)
    target = tmp_path / "written.txt"
    _plant_saved_model(
        entry, lambda x: tf.io.write_file(str(target), tf.strings.as_string(1))
    )
    _redigest(folder, entry.signature)
    total = len(suite_dir.load_suite(folder))
    db = tmp_path / "store.sqlite"
    proc = cli.dlbricks(
        "bench", f"--suite={folder}", "--backend=tf", f"--db={db}", *cli.FAST
    )
    assert proc.returncode == 1, proc.stderr
    assert f"checked {total} bricks, refused 1" in proc.stdout
    assert not target.exists()
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dlbricks: error: ")
    with sqlite3.connect(db) as con:
        timed = {
            r[0] for r in con.execute("SELECT signature FROM brick_results")
        }
        failed = dict(
            con.execute("SELECT signature, reason FROM brick_failures")
        )
    assert timed == set(suite_dir.load_suite(folder).signatures) - {
        entry.signature
    }
    assert list(failed) == [entry.signature]
    assert "WriteFile" in failed[entry.signature]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
