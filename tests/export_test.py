"""Tests of dlbricks_tf/portable/export.py: a suite folder that others can run.

Two small models get private names (a marker no file may contain), their
unique bricks are exported, and a separate Python process that cannot
import this project runs every SavedModel and ONNX file; its outputs must
match the Keras bricks. The `export` and `estimate --recipe` commands run
in this process (`tests/cli.py`).

Example:
    python -m pytest tests/export_test.py -p no:cacheprovider
"""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import keras
import numpy as np
import pytest

import dlbricks_tf
from dlbricks_tf import stats
from dlbricks_tf.cutting import suite, synthetic
from dlbricks_tf.machine import fingerprint, settings
from dlbricks_tf.portable import export, suite_dir
from dlbricks_tf.storing import store
from tests import models
from tests.cli import dlbricks

MARK = "zqxprivate"  # In every source name; in no exported byte.
G = 2


def private(builder) -> keras.Model:
    """A test model whose model, layer and input names all carry MARK."""
    config = builder()[0].get_config()
    names = {layer["name"] for layer in config["layers"]} | {config["name"]}
    text = json.dumps(config)
    for name in sorted(names, key=len, reverse=True):
        text = text.replace(f'"{name}"', f'"{MARK}_{name}"')
    model = keras.Model.from_config(json.loads(text))
    assert model.name.startswith(MARK)
    assert all(layer.name.startswith(MARK) for layer in model.layers)
    return model


@pytest.fixture(scope="module")
def sources():
    return {
        m.name: m for m in (private(models.chain), private(models.residual))
    }


@pytest.fixture(scope="module")
def decompositions(sources):
    return {n: dlbricks_tf.decompose(m, G) for n, m in sources.items()}


@pytest.fixture(scope="module")
def exported(decompositions, tmp_path_factory):
    folder = tmp_path_factory.mktemp("export") / "suite"
    unique = suite.build_suite(decompositions)
    calls = []
    summary = export.export_suite(
        unique,
        folder,
        granularity=G,
        progress=lambda done, total: calls.append((done, total)),
    )
    return unique, folder, summary, calls


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def test_manifest_lists_every_unique_brick(exported):
    unique, folder, summary, calls = exported
    m = _manifest(folder)
    assert m["format"] == "dlbricks-suite" and m["format_version"] == 1
    assert m["granularity"] == G and m["opset"] == 18
    assert m["split"] == "plain"
    assert set(m["tool_versions"]) == {
        "dlbricks_tf",
        "python",
        "tensorflow",
        "keras",
        "tf2onnx",
        "onnx",
        "onnxruntime",
    }
    assert m["tool_versions"]["keras"] == keras.__version__
    signatures = [b["signature"] for b in m["bricks"]]
    assert signatures == sorted(unique.signatures)
    assert summary.written == tuple(signatures) and summary.skipped == ()
    assert summary.no_onnx == ()
    assert calls == [(i, len(unique)) for i in range(1, len(unique) + 1)]
    for b in m["bricks"]:
        brick = next(
            e.brick for e in unique.entries if e.signature == b["signature"]
        )
        assert b["layers"] == len(brick.layers)
        assert b["classes"] == list(brick.class_names)
        assert b["inputs"] == [
            {
                "name": f"input_{i}",
                "shape": [None, *spec.shape],
                "dtype": spec.dtype,
                "high": None,
            }
            for i, spec in enumerate(brick.inputs)
        ]
        assert [o["name"] for o in b["outputs"]] == [
            f"output_{i}" for i in range(len(brick.output_ids))
        ]
        assert all(o["shape"][0] is None for o in b["outputs"])
        base = f"bricks/{b['signature']}"
        assert b["files"] == {
            "saved_model": f"{base}/saved_model",
            "keras": f"{base}/brick.keras",
            "onnx": f"{base}/brick.onnx",
        }
        assert b["sha256"] == {
            "saved_model": suite_dir.sha256(
                folder / base / "saved_model" / "saved_model.pb"
            ),
            "keras": suite_dir.sha256(folder / base / "brick.keras"),
            "onnx": suite_dir.sha256(folder / base / "brick.onnx"),
        }


def _all_bytes(folder: Path):
    """(name, bytes) of every file, and of every member of a .keras zip."""
    for path in sorted(folder.rglob("*")):
        yield str(path.relative_to(folder)), b""
        if path.is_file():
            yield str(path), path.read_bytes()
            if path.suffix == ".keras":
                with zipfile.ZipFile(path) as z:
                    for member in z.namelist():
                        yield f"{path}:{member}", z.read(member)


def test_no_source_name_is_in_any_file(exported, sources):
    _, folder, _, _ = exported
    # Every source layer, input and model name carries MARK. (Unmarked
    # class-derived names such as "conv2d" do appear: Keras names the
    # groups of a .keras weights file after the layer classes.)
    needles = [MARK.encode(), *(n.encode() for n in sources)]
    checked = 0
    for name, data in _all_bytes(folder):
        for needle in needles:
            assert needle not in name.encode(), name
            assert needle not in data, (name, needle)
        checked += 1
    assert checked > 5 * len(_manifest(folder)["bricks"])


def test_keras_file_is_anonymous_and_same_as_saved_model(exported):
    _, folder, _, _ = exported
    for b in _manifest(folder)["bricks"]:
        model = keras.saving.load_model(folder / b["files"]["keras"])
        assert model.name == "brick"
        for layer in model.layers:
            assert re.fullmatch(r"(input|layer)_\d+", layer.name), layer.name
        assert [t.shape for t in model.inputs] == [
            tuple(i["shape"]) for i in b["inputs"]
        ]


def test_anonymous_build_names_layers_in_call_order():
    model, _ = models.shared_and_ops()
    d = dlbricks_tf.decompose(model, granularity=2)
    shared = next(b for b in d.bricks if b.layers == ("shared", "shared"))
    built = shared.build(None, anonymous=True)
    assert built.name == "brick"
    assert [layer.name for layer in built.layers] == ["input_0", "layer_0"]
    plain = shared.build(1)
    assert plain.name == f"brick_{shared.signature}"
    assert "shared" in [layer.name for layer in plain.layers]
    many = max(d.bricks, key=lambda b: len(set(b.layers)))
    # Raw keras.ops calls are operations, not layers.
    names = [op.name for op in many.build(None, anonymous=True).operations]
    inputs = [f"input_{i}" for i in range(len(many.inputs))]
    layers = [f"layer_{i}" for i in range(len(set(many.layers)))]
    assert names == inputs + layers


_CONSUMER = r'''
"""Runs a suite folder's bricks as a consumer without dlbricks_tf would."""
import importlib.abc
import json
import sys


class _Refuse(importlib.abc.MetaPathFinder):
    # dlbricks_tf is pip-installed in editable mode: refuse it (and the
    # repository's packages) so the files must stand on their own.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("dlbricks_tf", "tests", "tools"):
            raise ImportError(f"{name} must not be needed")
        return None


sys.meta_path.insert(0, _Refuse())

import numpy as np
import onnxruntime as ort
import tensorflow as tf

suite, inputs_path, out_path = sys.argv[1:]
with open(f"{suite}/manifest.json") as f:
    manifest = json.load(f)
data = np.load(inputs_path)
out, meta = {}, {}
for b in manifest["bricks"]:
    sig = b["signature"]
    feeds = {i["name"]: data[f"{sig}__{i['name']}"] for i in b["inputs"]}
    loaded = tf.saved_model.load(f"{suite}/{b['files']['saved_model']}")
    fn = loaded.signatures["serving_default"]
    result = fn(**{k: tf.constant(v) for k, v in feeds.items()})
    for o in b["outputs"]:
        out[f"{sig}__tf__{o['name']}"] = result[o["name"]].numpy()
    session = ort.InferenceSession(
        f"{suite}/{b['files']['onnx']}", providers=["CPUExecutionProvider"]
    )
    names = [o.name for o in session.get_outputs()]
    for name, value in zip(names, session.run(None, feeds)):
        out[f"{sig}__onnx__{name}"] = value
    specs = fn.structured_input_signature[1]
    meta[sig] = {
        "tf_inputs": sorted(specs),
        "tf_batch": [specs[k].shape[0] for k in sorted(specs)],
        "tf_outputs": sorted(result),
        "onnx_inputs": [i.name for i in session.get_inputs()],
        "onnx_batch": [i.shape[0] for i in session.get_inputs()],
        "onnx_outputs": names,
    }
assert not any(m.startswith("dlbricks_tf") for m in sys.modules)
np.savez(out_path, **out)
with open(out_path + ".json", "w") as f:
    json.dump(meta, f)
'''


def test_saved_model_and_onnx_run_without_the_project(exported, tmp_path):
    _, folder, _, _ = exported
    bricks = _manifest(folder)["bricks"]
    feeds, expected = {}, {}
    for i, b in enumerate(bricks):
        model = keras.saving.load_model(folder / b["files"]["keras"])
        xs = synthetic.synthetic_inputs(model, batch_size=3, seed=i)
        for spec, x in zip(b["inputs"], xs, strict=True):
            feeds[f"{b['signature']}__{spec['name']}"] = x
        ys = keras.tree.flatten(model(xs if len(xs) > 1 else xs[0]))
        expected[b["signature"]] = [np.asarray(y) for y in ys]
    np.savez(tmp_path / "inputs.npz", **feeds)
    script = tmp_path / "consumer.py"
    script.write_text(_CONSUMER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    out = tmp_path / "outputs.npz"
    proc = subprocess.run(
        [sys.executable, str(script), str(folder), "inputs.npz", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    meta = json.loads(Path(f"{out}.json").read_text())
    for b in bricks:
        sig = b["signature"]
        names = [o["name"] for o in b["outputs"]]
        inputs = [i["name"] for i in b["inputs"]]
        assert meta[sig]["tf_inputs"] == sorted(inputs)
        assert meta[sig]["tf_batch"] == [None] * len(inputs)
        assert meta[sig]["tf_outputs"] == sorted(names)
        assert meta[sig]["onnx_inputs"] == inputs
        assert all(not isinstance(d, int) for d in meta[sig]["onnx_batch"])
        assert meta[sig]["onnx_outputs"] == names
        for name, want in zip(names, expected[sig], strict=True):
            np.testing.assert_allclose(
                got[f"{sig}__tf__{name}"], want, rtol=1e-5, atol=1e-6
            )
            np.testing.assert_allclose(
                got[f"{sig}__onnx__{name}"], want, rtol=1e-4, atol=1e-5
            )


def _copy(folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "suite"
    shutil.copytree(folder, target)
    return target


def test_rerun_skips_complete_bricks_and_redoes_broken_ones(exported, tmp_path):
    unique, folder, _, _ = exported
    folder = _copy(folder, tmp_path)
    bricks = _manifest(folder)["bricks"]
    keras_file = folder / bricks[0]["files"]["keras"]
    before = keras_file.stat().st_mtime_ns
    stale = folder / "bricks" / ".tmp-deadbeef-1234"
    stale.mkdir()
    stale_manifest = folder / ".tmp-manifest.json-1234"
    stale_manifest.write_text("{")
    again = export.export_suite(unique, folder, granularity=G)
    assert again.written == () and len(again.skipped) == len(unique)
    assert keras_file.stat().st_mtime_ns == before
    assert not stale.exists() and not stale_manifest.exists()

    broken = bricks[1]
    onnx_file = folder / broken["files"]["onnx"]
    onnx_file.write_bytes(onnx_file.read_bytes() + b"\0")
    with pytest.raises(suite_dir.SuiteError) as info:
        suite_dir.load_suite(folder)
    message = str(info.value)
    assert broken["signature"] in message and "brick.onnx" in message
    assert "re-export the suite with `dlbricks export`" in message
    assert "\n" not in message

    fixed = export.export_suite(unique, folder, granularity=G)
    assert fixed.written == (broken["signature"],)
    assert len(suite_dir.load_suite(folder)) == len(unique)


def test_deleted_brick_file_is_named(exported, tmp_path):
    _, folder, _, _ = exported
    folder = _copy(folder, tmp_path)
    b = _manifest(folder)["bricks"][-1]
    (folder / b["files"]["saved_model"] / "saved_model.pb").unlink()
    with pytest.raises(suite_dir.SuiteError, match="missing") as info:
        suite_dir.load_suite(folder)
    assert b["signature"] in str(info.value)
    assert "saved_model.pb" in str(info.value)


def test_bad_opset_is_refused(exported, tmp_path):
    unique, _, _, _ = exported
    with pytest.raises(ValueError, match="opset"):
        export.export_suite(unique, tmp_path / "s", opset=19)


def test_old_record_without_onnx_check_is_exported_again(exported, tmp_path):
    # A record written before ONNX files were checked has no onnx_error.
    unique, folder, _, _ = exported
    folder = _copy(folder, tmp_path)
    old = _manifest(folder)["bricks"][0]["signature"]
    path = folder / "bricks" / old / export.RECORD
    record = json.loads(path.read_text())
    assert record["onnx_error"] is None
    del record["onnx_error"]
    path.write_text(json.dumps(record))
    again = export.export_suite(unique, folder, granularity=G)
    assert again.written == (old,)


def test_gelu_converts_and_an_unconvertible_brick_is_named(tmp_path):
    from dlbricks_tf.measuring import timing
    from dlbricks_tf.portable import suite_bench
    from dlbricks_tf.running import bench

    inp = keras.Input((16,))
    x = keras.layers.Dense(32, activation="gelu")(inp)  # Exact GELU: Erfc.
    model = keras.Model(inp, keras.ops.erfinv(keras.ops.tanh(x)))
    unique = suite.build_suite({"m": dlbricks_tf.decompose(model, 1)})
    summary = export.export_suite(unique, tmp_path / "suite", granularity=1)
    loaded = suite_dir.load_suite(tmp_path / "suite")
    by_class = {e.classes[0]: e for e in loaded.entries}
    assert set(by_class) == {"Dense", "Tanh", "Erfinv"}
    erfinv = by_class["Erfinv"]
    assert erfinv.onnx is None and "Erfinv" in erfinv.onnx_error
    assert summary.no_onnx == (erfinv.signature,)
    assert summary.no_onnx_reasons == (erfinv.onnx_error,)
    raw = {b["signature"]: b for b in _manifest(tmp_path / "suite")["bricks"]}
    assert raw[erfinv.signature]["files"]["onnx"] is None
    assert raw[by_class["Dense"].signature]["onnx_error"] is None

    # On ONNX Runtime, the GELU brick times and the other is recorded.
    ort = settings.RunSettings.default(
        1, intra_op_threads=1, backend="onnxruntime"
    )
    options = timing.TimingOptions(min_samples=3, max_samples=5)
    fp = fingerprint.system_fingerprint()
    with store.Store(tmp_path / "s.sqlite") as db:
        result = bench.time_suite(
            loaded, db, ort, fp, measure=suite_bench.measurer(ort, options)
        )
        assert set(result.timed) == set(loaded.signatures) - {erfinv.signature}
        ((failed, reason),) = result.failed
        assert failed == erfinv.signature and "Erfinv" in reason
        assert db.failures(ort, fp) == {failed: reason}


# The command line: export, then estimate from the recipes alone.


@pytest.fixture(scope="module")
def cli_export(sources, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    paths = []
    for name, model in sources.items():
        paths.append(str(folder / f"{name}.keras"))
        model.save(paths[-1])
    out = folder / "out"
    proc = dlbricks(
        "export", f"--models={','.join(paths)}", f"--granularity={G}",
        f"--out={out}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_export_command_writes_suite_and_recipes(cli_export, sources):
    out, proc = cli_export
    assert proc.stderr == ""
    loaded = suite_dir.load_suite(out / "suite")
    assert loaded.granularity == G and loaded.split == "plain"
    recipes = sorted((out / "recipes").iterdir())
    assert [p.name for p in recipes] == sorted(
        f"{n}.recipe.json" for n in sources
    )
    assert f"Suite: {out / 'suite'}: {len(loaded)} bricks" in proc.stdout
    assert f"Recipes (private): 2 in {out / 'recipes'}" in proc.stdout
    for name, data in _all_bytes(out / "suite"):
        assert MARK not in name and MARK.encode() not in data, name
    # Every brick a recipe names is in the suite.
    for path in recipes:
        signatures = json.loads(path.read_text())["bricks"]
        assert set(signatures) <= set(loaded.signatures)


def test_estimate_command_from_recipes(cli_export, tmp_path):
    from dlbricks_tf.portable import recipe

    out, _ = cli_export
    recipes = sorted(str(p) for p in (out / "recipes").iterdir())
    run = settings.RunSettings.default(
        1, intra_op_threads=1, backend="onnxruntime"
    )
    fp = fingerprint.system_fingerprint()
    loaded = suite_dir.load_suite(out / "suite")
    db = tmp_path / "store.sqlite"
    ms = {s: 0.25 * (i + 1) for i, s in enumerate(loaded.signatures)}
    with store.Store(db) as s:
        for sig, value in ms.items():
            s.put(sig, run, fp, _timing(value))
    args = [f"--recipe={','.join(recipes)}", f"--db={db}"]
    args += ["--intra_op_threads=1", "--backend=onnxruntime"]
    proc = dlbricks("estimate", *args)
    assert proc.returncode == 0, proc.stderr
    for path in recipes:
        r = recipe.load(path)
        want = sum(ms[b.signature] for b in r.bricks)
        row = next(
            line for line in proc.stdout.splitlines() if f"| {r.name} |" in line
        )
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1:3] == [str(G), "sequential"]
        assert float(cells[3]) == pytest.approx(want, abs=1e-3)

    # The tf backend has no timing in this store: one line names them.
    code, _, err = _run("estimate", *args[:-1])
    assert code == 1 and err.startswith("dlbricks: error: Model ")
    assert "have no timing" in err and len(err.strip().splitlines()) == 1

    code, _, err = _run("estimate", *args, "--models=ResNet50")
    assert code == 2 and "not both" in err

    bad = tmp_path / "bad.recipe.json"
    bad.write_text("{")
    code, _, err = _run("estimate", f"--recipe={bad}", f"--db={db}")
    assert code == 1 and err.startswith(f"dlbricks: error: Recipe '{bad}'")


def test_export_command_refuses_bad_combinations(tmp_path):
    code, _, err = _run("export", "--granularity=1,2", f"--out={tmp_path}")
    assert code == 2 and "one --granularity" in err
    code, _, err = _run(
        "export",
        f"--suite={tmp_path / 's'}",
        f"--recipes={tmp_path / 's' / 'r'}",
    )
    assert code == 2 and "must not be inside" in err
    assert not (tmp_path / "s").exists()


def _run(*args) -> tuple[int, str, str]:
    """`dlbricks ARGS` in this process: (exit code, stdout, stderr)."""
    proc = dlbricks(*args)
    return proc.returncode, proc.stdout, proc.stderr


def _timing(ms: float) -> stats.Timing:
    return stats.Timing(
        min_ms=ms * 0.8,
        median_ms=ms,
        trimmed_mean_ms=ms,
        max_ms=ms * 1.5,
        samples=20,
        ci_low_ms=ms * 0.9,
        ci_high_ms=ms * 1.1,
        noisy=False,
    )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
