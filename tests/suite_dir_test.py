"""Tests of dlbricks_tf/portable/suite_dir.py: reading and checking a folder.

A suite of three small models (float, integer-id and mask inputs) is
exported once; each test breaks a copy of it in one way, or reads it.

Example:
    python -m pytest tests/suite_dir_test.py -p no:cacheprovider
"""

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest

import dlbricks_tf
from dlbricks_tf.cutting import suite, synthetic
from dlbricks_tf.machine import settings
from dlbricks_tf.measuring import timing
from dlbricks_tf.portable import export, feed_order, suite_bricks, suite_dir
from tests import models

G = 2
AGAIN = "re-export the suite with `dlbricks export`"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    unique = suite.build_suite(
        {
            name: dlbricks_tf.decompose(models.ALL[name]()[0], G)
            for name in ("chain", "residual", "multi_io")
        }
    )
    folder = tmp_path_factory.mktemp("suite_dir") / "suite"
    export.export_suite(unique, folder, granularity=G)
    return unique, folder


@pytest.fixture
def copy(exported, tmp_path):
    target = tmp_path / "suite"
    shutil.copytree(exported[1], target)
    return target


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _write(folder: Path, manifest: dict) -> None:
    (folder / "manifest.json").write_text(json.dumps(manifest))


def test_entries_are_typed_and_sorted(exported):
    unique, folder = exported
    loaded = suite_dir.load_suite(folder)
    assert loaded.granularity == G and loaded.opset == 18
    assert loaded.folder == str(folder.absolute())
    assert loaded.signatures == tuple(sorted(unique.signatures))
    assert dict(loaded.tool_versions)["keras"] == keras.__version__
    by_sig = {e.signature: e.brick for e in unique.entries}
    for entry in loaded.entries:
        brick = by_sig[entry.signature]
        assert entry.layers == len(brick.layers)
        assert entry.classes == brick.class_names
        assert [(i.name, i.shape, i.dtype) for i in entry.inputs] == [
            (f"input_{n}", (None, *spec.shape), spec.dtype)
            for n, spec in enumerate(brick.inputs)
        ]
        assert [o.name for o in entry.outputs] == [
            f"output_{n}" for n in range(len(brick.output_ids))
        ]
        for path in (entry.saved_model, entry.keras, entry.onnx):
            assert Path(path).is_absolute() and Path(path).exists()
        assert hash(entry) == hash(entry)  # Frozen, hashable.
    embedding = next(e for e in loaded.entries if e.classes == ("Embedding",))
    assert embedding.inputs[0].dtype == "int32"
    assert embedding.id_bounds == (20,)  # Embedding(20, 4) in multi_io.
    mask = next(e for e in loaded.entries if "Cast" in e.classes)
    assert [i.dtype for i in mask.inputs] == ["bool"]
    assert mask.id_bounds == (None,)
    assert loaded.entry(embedding.signature) is embedding
    with pytest.raises(KeyError):
        loaded.entry("0000")


def test_shards_are_those_of_the_suite(exported):
    unique, folder = exported
    loaded = suite_dir.load_suite(folder)
    for count in (1, 2, 3, 4, len(loaded) + 2):
        seen: list[str] = []
        for index in range(count):
            part = loaded.shard(index, count)
            want = unique.shard(index, count).signatures
            assert part.signatures == want
            assert part.granularity == G
            seen += part.signatures
        assert sorted(seen) == sorted(loaded.signatures)
        assert len(seen) == len(set(seen))
    for index, count in ((0, 0), (2, 2), (-1, 3)):
        with pytest.raises(ValueError, match="index"):
            loaded.shard(index, count)


def test_load_saved_model_runs_like_the_brick(exported):
    _, folder = exported
    loaded = suite_dir.load_suite(folder)
    for i, entry in enumerate(loaded.entries):
        model = suite_bricks.load_saved_model(entry, batch_size=3)
        assert isinstance(model, keras.Model)
        assert [tuple(t.shape) for t in model.inputs] == [
            (3, *spec.shape[1:]) for spec in entry.inputs
        ]
        brick = keras.saving.load_model(entry.keras)
        xs = synthetic.synthetic_inputs(brick, batch_size=3, seed=i)
        x = xs if len(xs) > 1 else xs[0]
        got = keras.tree.flatten(model(x))
        want = keras.tree.flatten(brick(x))
        assert len(got) == len(want) == len(entry.outputs)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(
                np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6
            )


def test_timer_times_a_loaded_brick(exported):
    _, folder = exported
    entry = suite_dir.load_suite(folder).entries[0]
    model = suite_bricks.load_saved_model(entry, batch_size=1)
    run = settings.RunSettings.default(1)
    options = timing.TimingOptions(
        min_samples=3, max_samples=3, max_seconds=0.5, target_sample_ms=0.2
    )
    timer = timing.Timer(model, run, options, check_settings=False)
    while not timer.done:
        timer.sample()
    result = timer.result()
    # The brick takes microseconds: under load, its loop overhead (which is
    # subtracted) can exceed it in most samples, never in all.
    assert result.samples == 3
    assert result.max_ms > 0 and result.median_ms >= 0


def test_dynamic_batch_and_bad_batch(exported):
    _, folder = exported
    entry = suite_dir.load_suite(folder).entries[0]
    model = suite_bricks.load_saved_model(entry, batch_size=None)
    assert model.inputs[0].shape[0] is None
    with pytest.raises(ValueError, match="batch_size"):
        suite_bricks.load_saved_model(entry, batch_size=0)


def _error(folder) -> str:
    with pytest.raises(suite_dir.SuiteError) as info:
        suite_dir.load_suite(folder)
    message = str(info.value)
    assert "\n" not in message
    assert isinstance(info.value, dlbricks_tf.Error)
    return message


def test_missing_folder_and_manifest(tmp_path, copy):
    assert "does not exist" in _error(tmp_path / "nope")
    (copy / "manifest.json").unlink()
    message = _error(copy)
    assert "no manifest.json" in message and AGAIN in message


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda m: "{", "not valid JSON"),
        (lambda m: dict(m, format="dlbricks-recipe"), "not a dlbricks-suite"),
        (lambda m: dict(m, format_version=2), "format_version 2"),
        (lambda m: dict(m, bricks={}), "no 'bricks' list"),
        (lambda m: dict(m, opset="18"), "malformed granularity, split"),
        (lambda m: dict(m, split="fusion"), "malformed granularity, split"),
        (lambda m: dict(m, bricks=m["bricks"] * 2), "twice"),
    ],
)
def test_bad_manifests(copy, change, words):
    changed = change(_manifest(copy))
    if isinstance(changed, str):
        (copy / "manifest.json").write_text(changed)
    else:
        _write(copy, changed)
    assert words in _error(copy)


def test_malformed_entries_name_the_brick(copy):
    manifest = _manifest(copy)
    b = manifest["bricks"][0]
    b["files"]["keras"] = "../../elsewhere/brick.keras"
    _write(copy, manifest)
    message = _error(copy)
    assert b["signature"] in message and "leaves the suite folder" in message
    b["files"]["keras"] = f"bricks/{b['signature']}/brick.keras"
    b["inputs"][0]["shape"] = "big"
    _write(copy, manifest)
    assert "malformed manifest entry" in _error(copy)
    b["signature"] = "../x"
    _write(copy, manifest)
    assert "brick 0 has no valid signature" in _error(copy)


@pytest.mark.parametrize("key", ["saved_model", "keras", "onnx"])
def test_missing_and_altered_files_name_brick_and_file(copy, key):
    manifest = _manifest(copy)
    b = manifest["bricks"][-1]
    path = copy / b["files"][key]
    if key == "saved_model":
        path = path / "saved_model.pb"
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    message = _error(copy)
    assert b["signature"] in message and path.name in message
    assert "does not match its SHA-256" in message and AGAIN in message
    # Without verification the altered file passes; a missing one never.
    assert len(suite_dir.load_suite(copy, verify=False)) == len(
        manifest["bricks"]
    )
    path.unlink()
    message = _error(copy)
    assert f"{path.name} is missing" in message and b["signature"] in message


def test_missing_variables_folder(copy):
    b = _manifest(copy)["bricks"][0]
    shutil.rmtree(copy / b["files"]["saved_model"] / "variables")
    message = _error(copy)
    assert "variables is missing" in message and b["signature"] in message


def _feedable(a, b) -> bool:
    outs = {(tuple(y.shape[1:]), y.dtype) for y in a.outputs}
    return any(
        (tuple(x.shape[1:]), x.dtype) in outs
        for x in b.inputs
        if x.dtype.startswith("float")
    )


def _fed(entries) -> int:
    return sum(
        _feedable(a, b) for a, b in zip(entries, entries[1:], strict=False)
    )


def test_chains_take_a_suite_in_an_order_that_feeds(exported):
    loaded = suite_dir.load_suite(exported[1])
    chained = loaded.chain_order(loaded.signatures)
    assert sorted(e.signature for e in chained) == list(loaded.signatures)
    assert _fed(chained) > _fed(loaded.entries)


def test_bricks_left_to_time_are_ordered_among_themselves(exported):
    # As a resumed run finds them: every other brick of the order stored.
    loaded = suite_dir.load_suite(exported[1])
    left = loaded.chain_order(loaded.signatures)[1::2]
    reordered = loaded.chain_order({e.signature for e in left})
    assert sorted(e.signature for e in reordered) == sorted(
        e.signature for e in left
    )
    assert reordered == tuple(
        feed_order.ordered(sorted(left, key=lambda e: e.signature))
    )
    assert reordered != left  # Made anew, not cut out of the whole order.


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
