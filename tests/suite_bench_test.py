"""bench --suite on both backends, estimate from recipes, report --compare.

One small model is exported (`dlbricks export`); the suite is then timed
with no access to the model, on TensorFlow (SavedModels) and on ONNX
Runtime (ONNX files), the ONNX half in two shards merged afterwards. Its
recipe is estimated on each backend, and `report --compare` names the
fastest backend and writes TensorBoard event files that are read back.
"""

import pytest
from tensorboard.backend.event_processing import event_accumulator

from dlbricks_tf import recipe as recipe_lib
from dlbricks_tf import suite_bench, suite_dir
from dlbricks_tf.fingerprint import system_fingerprint
from dlbricks_tf.settings import RunSettings
from dlbricks_tf.store import Store
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


def test_measurer_times_a_saved_model_in_process(exported):
    # The library path the CLI uses, on TF, without a subprocess.
    _, suite, _ = exported
    entry = suite_dir.load_suite(suite).entries[0]
    from dlbricks_tf import timing

    options = timing.TimingOptions(
        min_samples=3, max_samples=5, max_seconds=0.2
    )
    measure = suite_bench.measurer(
        _settings("tf"), options, check_settings=False
    )
    result = measure(entry)
    assert result.samples >= 3 and result.min_ms <= result.max_ms


def test_recipe_names_only_suite_bricks(exported):
    _, suite, recipe = exported
    loaded = recipe_lib.load(recipe)
    assert set(loaded.signatures) <= set(suite_dir.load_suite(suite).signatures)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
