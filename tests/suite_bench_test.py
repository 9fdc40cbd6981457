"""bench --suite on both backends, estimate from recipes, report --compare.

One small model is exported (`dlbricks export`); the suite is then timed
with no access to the model, on TensorFlow (SavedModels) and on ONNX
Runtime (ONNX files), the ONNX half in two shards merged afterwards. Its
recipe is estimated on each backend, and `report --compare` names the
fastest backend and writes TensorBoard event files that are read back.
The same bricks timed by `run`, `bench --models` and `bench --suite` go
through one path (`brick_timing.time_bricks`) to the same store keys.
"""

import collections
from pathlib import Path

import pytest
from tensorboard.backend.event_processing import event_accumulator

from dlbricks_tf.cutting import description
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.measuring import brick_timing
from dlbricks_tf.portable import recipe as recipe_lib
from dlbricks_tf.portable import suite_bench, suite_dir
from dlbricks_tf.storing.store import LAYOUT_PREFIX, Store
from tests import models
from tests.cli import FAST, dlbricks


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("suite_bench")
    model = models.residual()[0]
    path = folder / "resnetish.keras"
    model.save(path)
    out = folder / "out"
    proc = dlbricks(
        "export", f"--models={path}", "--granularity=2", f"--out={out}"
    )
    assert proc.returncode == 0, proc.stderr
    return out, out / "suite", out / "recipes" / "resnetish.recipe.json"


@pytest.fixture(scope="module")
def timed(exported):
    """The suite timed on tf into one store, on ORT in two merged shards."""
    out, suite, _ = exported
    db = out / "all.sqlite"
    procs = {"tf": dlbricks("bench", f"--suite={suite}", f"--db={db}", *FAST)}
    for i in range(2):
        procs[f"ort{i}"] = dlbricks(
            "bench",
            f"--suite={suite}",
            "--backend=onnxruntime",
            f"--shard_index={i}",
            "--num_shards=2",
            f"--db={out / f'ort{i}.sqlite'}",
            *FAST,
        )
    procs["merge"] = dlbricks(
        "merge",
        f"--db={db}",
        str(out / "ort0.sqlite"),
        str(out / "ort1.sqlite"),
    )
    return db, procs


def _settings(backend):
    return RunSettings.default(1, intra_op_threads=1, backend=backend)


def test_suite_is_timed_on_both_backends(exported, timed):
    _, suite, _ = exported
    db, procs = timed
    for name, proc in procs.items():
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stderr == "", name
    signatures = set(suite_dir.load_suite(suite).signatures)
    fp = system_fingerprint()
    with Store(db) as store:
        for backend in ("tf", "onnxruntime"):
            results = store.results(_settings(backend), fp)
            assert set(results) == signatures, backend
            assert all(
                t.median_ms >= 0 and t.samples > 0 for t in results.values()
            )
        rows = store.rows("brick")
    # The NCHWc reorders ONNX Runtime's chains ran are kept beside the
    # bricks, apart from them (`ort_layout`), on that backend only.
    layout = [r for r in rows if r["signature"].startswith(LAYOUT_PREFIX)]
    assert {r["settings"]["backend"] for r in layout} <= {"onnxruntime"}
    rows = [r for r in rows if r not in layout]
    # Exactly once per signature and backend: the shards were disjoint.
    keys = [(r["signature"], r["settings"]["backend"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * len(signatures)
    assert "shard 0 of 2" in procs["ort0"].stdout
    assert "to time" in procs["tf"].stdout


def test_rerun_times_only_noisy_bricks(exported, timed):
    # Settled results are kept; noisy ones (likely with these tiny caps)
    # are measured again, by design.
    _, suite, _ = exported
    db, _ = timed
    with Store(db) as store:
        results = store.results(_settings("tf"), system_fingerprint())
    noisy = sum(t.noisy for t in results.values())
    proc = dlbricks("bench", f"--suite={suite}", f"--db={db}", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert f"; {noisy} to time" in proc.stdout


def test_estimate_from_recipe_on_each_backend(exported, timed):
    _, _, recipe = exported
    db, _ = timed
    for backend in ("tf", "onnxruntime"):
        proc = dlbricks(
            "estimate", f"--recipe={recipe}", f"--db={db}",
            f"--backend={backend}", "--intra_op_threads=1",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "resnetish" in proc.stdout
        assert f"{backend}-b1-t1x1" in proc.stdout


def test_report_compare_names_the_fastest(exported, timed):
    out, _, recipe = exported
    db, _ = timed
    logdir = out / "tb"
    proc = dlbricks(
        "report", "--compare", f"--recipe={recipe}", f"--db={db}",
        f"--logdir={logdir}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "resnetish" in line]
    assert len(lines) == 1
    cells = [c.strip() for c in lines[0].strip("|").split("|")]
    ort_ms, tf_ms = (float(c.split()[0]) for c in cells[1:3])
    # Columns are ordered by backend: onnxruntime first, then tf.
    assert cells[3].startswith("onnxruntime" if tf_ms > ort_ms else "tf")
    acc = event_accumulator.EventAccumulator(
        str(logdir / "compare"), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    scalars = [t for t in acc.Tags()["tensors"] if t.startswith("estimate_ms")]
    assert len(scalars) == 2


def test_run_and_both_benches_store_the_same_keys(
    exported, tmp_path, monkeypatch
):
    out, suite, _ = exported
    model = out.parent / "resnetish.keras"
    calls = collections.Counter()
    timed_by = [""]

    def time_bricks(*args, **kwargs):
        calls[timed_by[0]] += 1
        return real(*args, **kwargs)

    real = brick_timing.time_bricks
    monkeypatch.setattr(brick_timing, "time_bricks", time_bricks)
    commands = {
        "run": (
            ["run", f"--models={model}", f"--out={tmp_path / 'run'}"]
            + ["--graphs=0", "--granularity=2"]
        ),
        "bench --models": ["bench", f"--models={model}", "--granularity=2"],
        "bench --suite": ["bench", f"--suite={suite}"],
    }
    fp = system_fingerprint()
    keys = {}
    texts = {}
    for name, args in commands.items():
        db = tmp_path / "run" / "store.sqlite"
        if name != "run":
            db = tmp_path / f"{name.split('--')[1]}.sqlite"
            args = [*args, f"--db={db}"]
        timed_by[0] = name
        proc = dlbricks(*args, *FAST)
        assert proc.returncode == 0, (name, proc.stderr)
        with Store(db) as store:
            keys[name] = {
                (
                    r["signature"],
                    RunSettings.from_dict(r["settings"]).key(),
                    r["fingerprint_id"],
                )
                for r in store.rows("brick")
            }
            texts[name] = store.descriptions(_settings("tf"), fp)
    assert set(calls) == set(commands)  # Each through the one path.
    settings = _settings("tf")
    expected = {
        (signature, settings.key(), fp.id)
        for signature in suite_dir.load_suite(suite).signatures
    }
    assert keys == dict.fromkeys(commands, expected)
    # Each path keeps what every brick it timed computes, read back as the
    # brick it is filed under. A suite brick's outputs have the specs its
    # manifest records, which its model's config may not, so the texts of
    # the bricks cut from the model are the same only from run and bench.
    assert texts["run"] == texts["bench --models"]
    for name, described in texts.items():
        assert set(described) == {s for s, _, _ in expected}, name
        for signature, text in described.items():
            description.parse(text, signature)


def test_measurer_times_a_saved_model_in_process(exported):
    # The library path the CLI uses, on TF, without a subprocess.
    _, suite, _ = exported
    entry = suite_dir.load_suite(suite).entries[0]
    from dlbricks_tf.measuring import timing

    options = timing.TimingOptions(
        min_samples=3, max_samples=5, max_seconds=0.2
    )
    measure = suite_bench.measurer(
        _settings("tf"), options, check_settings=False
    )
    result = measure(entry)
    # At least the floor of samples, unless some were left out as
    # disturbed before the cap of 5.
    assert result.samples >= 1 and result.min_ms <= result.max_ms


def test_recipe_names_only_suite_bricks(exported):
    _, suite, recipe = exported
    loaded = recipe_lib.load(recipe)
    assert set(loaded.signatures) <= set(suite_dir.load_suite(suite).signatures)


def _break_onnx(suite: Path, signature: str) -> bytes:
    """Gives a brick an ONNX file ONNX Runtime refuses; returns the old one.

    An `Erfc` node (no ONNX opset has it) is what tf2onnx once wrote for an
    exact GELU; the manifest's digest is updated, so the suite loads.
    """
    import onnx

    path = suite / "bricks" / signature / "brick.onnx"
    original = path.read_bytes()
    proto = onnx.load_from_string(original)
    proto.graph.node[0].op_type = "Erfc"
    path.write_bytes(proto.SerializeToString())
    _rehash(suite, signature)
    return original


def _rehash(suite: Path, signature: str) -> None:
    import json

    manifest = json.loads((suite / "manifest.json").read_text())
    for brick in manifest["bricks"]:
        if brick["signature"] == signature:
            brick["sha256"]["onnx"] = suite_dir.sha256(
                suite / "bricks" / signature / "brick.onnx"
            )
    (suite / "manifest.json").write_text(json.dumps(manifest))


def test_a_broken_brick_is_recorded_and_the_rest_timed(exported, tmp_path):
    import shutil

    _, source, recipe = exported
    suite = tmp_path / "suite"
    shutil.copytree(source, suite)
    signatures = suite_dir.load_suite(suite).signatures
    broken = signatures[len(signatures) // 2]
    original = _break_onnx(suite, broken)
    db = tmp_path / "ort.sqlite"
    args = [f"--suite={suite}", "--backend=onnxruntime", f"--db={db}", *FAST]
    proc = dlbricks("bench", *args)
    assert proc.returncode == 1, proc.stderr
    n = len(signatures)
    assert f"timed {n - 1}, already stored 0, failed 1," in proc.stdout
    assert f"brick {broken} failed: " in proc.stdout
    assert "Erfc" in proc.stdout
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dlbricks: error: 1 brick(s)")
    assert broken in err[0]
    settings = _settings("onnxruntime")
    fp = system_fingerprint()
    with Store(db) as store:
        results = store.results(settings, fp)
        assert set(results) == set(signatures) - {broken}
        assert list(store.failures(settings, fp)) == [broken]
        assert "Erfc" in store.failures(settings, fp)[broken]

    # estimate names the failed brick and its reason, in one line.
    proc = dlbricks(
        "estimate", f"--recipe={recipe}", f"--db={db}",
        "--backend=onnxruntime", "--intra_op_threads=1",
    )  # fmt: skip
    assert proc.returncode == 1
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "1 brick(s) failed when timed: " in err[0]
    assert broken in err[0] and "Erfc" in err[0]

    # A rerun tries the failed brick again (with the noisy ones, which
    # these tiny caps make likely); fixed, it is timed.
    (suite / "bricks" / broken / "brick.onnx").write_bytes(original)
    _rehash(suite, broken)
    proc = dlbricks("bench", *args)
    assert proc.returncode == 0, proc.stderr
    todo = 1 + sum(t.noisy for t in results.values())
    assert f"; {todo} to time" in proc.stdout
    assert f"timed {todo}, already stored {n - todo}, failed 0," in proc.stdout
    with Store(db) as store:
        assert set(store.results(settings, fp)) == set(signatures)
        assert store.failures(settings, fp) == {}


def test_a_store_of_a_suite_alone_teaches_the_predictor(tmp_path):
    """bench --suite keeps each brick's description (read from its
    `.keras` file): `estimate --predict` learns from them with no source
    model, and prices a model none of the suite's bricks came from."""
    paths = []
    for build in (models.chain, models.residual, models.shared_and_ops):
        model = build()[0]
        paths.append(str(tmp_path / f"{model.name}.keras"))
        model.save(paths[-1])
    out = tmp_path / "out"
    proc = dlbricks(
        "export", f"--models={paths[0]},{paths[1]}", "--granularity=1",
        f"--out={out}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    suite = suite_dir.load_suite(out / "suite")
    assert len(suite) >= 10  # What a predictor needs.
    db = tmp_path / "suite.sqlite"
    proc = dlbricks("bench", f"--suite={out / 'suite'}", f"--db={db}", *FAST)
    assert proc.returncode == 0, proc.stderr
    with Store(db) as store:
        assert store.described() == set(suite.signatures)
    proc = dlbricks(
        "estimate", "--predict", f"--models={paths[2]}", f"--db={db}",
        f"--out={tmp_path / 'estimates'}",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        f"Predictor: learning from the descriptions of the {len(suite)} "
        "timed bricks; no model walked"
    ) in proc.stdout
    row = next(
        x for x in proc.stdout.splitlines() if x.startswith("| shared_and_ops")
    )
    assert "predicted 100%" in row


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
