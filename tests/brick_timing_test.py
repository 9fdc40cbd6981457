"""Tests for dlbricks_tf/measuring/brick_timing.py: the one timing path.

The same bricks go through it on every protocol and backend (TF chains,
a TF loop per brick, ONNX Runtime sessions) and from every caller (`run`'s
job, `bench --models`, `bench --suite`): each stores the same keys, with
real timers, a real store and real ONNX files. No timing threshold.
"""

import dataclasses
import functools
import os

import pytest

import dlbricks_tf
from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import brick_timing, onnx_files, sampling
from dlbricks_tf.running import bench, job
from dlbricks_tf.storing.store import Store
from tests import models

SETTINGS, CHECKED = models.settings()
LOOP = dataclasses.replace(SETTINGS, protocol="loop")
ORT = dataclasses.replace(SETTINGS, backend="onnxruntime", protocol="loop")
FAST = sampling.TimingOptions(
    min_samples=3, max_samples=6, max_seconds=0.2, target_sample_ms=0.5
)


def _suite(granularity=1):
    model, _ = models.chain()
    d = dlbricks_tf.decompose(model, granularity=granularity)
    return d, suite_lib.build_suite({d.name: d})


@pytest.mark.parametrize("settings", [SETTINGS, LOOP], ids=["chain", "loop"])
def test_every_brick_is_stored_and_a_broken_one_is_recorded(tmp_path, settings):
    d, suite = _suite()
    fp = system_fingerprint()

    def broken():
        raise ValueError("cannot build this one")

    bricks = [
        brick_timing.BrickToTime(
            e.signature, functools.partial(e.brick.build, 1)
        )
        for e in suite.entries
    ] + [brick_timing.BrickToTime("broken", broken)]
    seen, failed = [], []
    with Store(tmp_path / "s.sqlite") as store:
        summary = brick_timing.time_bricks(
            bricks,
            settings,
            fp,
            store,
            FAST,
            weights=brick_timing.model_weights(suite.entries),
            check_settings=CHECKED,
            on_result=lambda key, t: seen.append(key),
            on_failure=lambda key, reason: failed.append((key, reason)),
        )
        stored = store.results(settings, fp)
        failures = store.failures(settings, fp)
    assert set(summary.timed) == set(seen) == set(suite.signatures)
    assert set(stored) == set(suite.signatures)
    # A near-empty brick can read 0 once the loop's own cost is taken off
    # (on a loaded machine): a timing is stored for every brick, never < 0.
    assert all(t.median_ms >= 0 and t.mean_ms >= 0 for t in stored.values())
    assert failed == [("broken", "ValueError: cannot build this one")]
    assert failures == {"broken": "ValueError: cannot build this one"}
    assert summary.failed == tuple(failed)


def test_run_and_bench_store_the_same_keys(tmp_path):
    d, suite = _suite()
    fp = system_fingerprint()
    source = job.ModelSource("chain", builder=lambda: models.chain()[0])
    with Store(tmp_path / "run.sqlite") as store:
        job.run_granularity(
            [source], 1, SETTINGS, fp, store, FAST, check_settings=CHECKED
        )
        from_run = set(store.results(SETTINGS, fp))
    with Store(tmp_path / "bench.sqlite") as store:
        bench.time_suite(
            suite, store, SETTINGS, fp, FAST, check_settings=CHECKED
        )
        from_bench = set(store.results(SETTINGS, fp))
    assert from_run == from_bench == set(suite.signatures)


def test_a_stop_request_ends_after_the_brick_in_flight(tmp_path):
    _, suite = _suite()
    fp = system_fingerprint()
    bricks = [
        brick_timing.BrickToTime(
            e.signature, functools.partial(e.brick.build, 1)
        )
        for e in suite.entries
    ]
    done = []
    with Store(tmp_path / "s.sqlite") as store:
        summary = brick_timing.time_bricks(
            bricks,
            LOOP,
            fp,
            store,
            FAST,
            check_settings=CHECKED,
            stop=lambda: bool(done),
            on_result=lambda key, t: done.append(key),
        )
        assert summary.stopped and len(summary.timed) == 1
        assert list(store.results(LOOP, fp)) == list(summary.timed)


def test_onnx_runtime_times_the_bricks_through_the_same_path(tmp_path):
    pytest.importorskip("onnxruntime")
    _, suite = _suite()
    fp = system_fingerprint()
    folder = tmp_path / "onnx"
    bricks = [
        brick_timing.BrickToTime(
            e.signature,
            functools.partial(
                onnx_files.onnx_file,
                e.brick.build,
                folder,
                f"brick-{e.signature}",
                1,
            ),
        )
        for e in suite.entries
    ]
    with Store(tmp_path / "s.sqlite") as store:
        summary = brick_timing.time_bricks(bricks, ORT, fp, store, FAST)
        stored = store.results(ORT, fp)
        assert store.results(SETTINGS, fp) == {}  # Keyed by backend.
    assert set(summary.timed) == set(stored) == set(suite.signatures)
    files = sorted(folder.glob("*.onnx"))
    assert len(files) == len(suite)
    # Converted once per signature: a second run reuses every file.
    before = {f: os.stat(f).st_mtime_ns for f in files}
    entry = suite.entries[0]
    again = onnx_files.onnx_file(
        entry.brick.build, folder, f"brick-{entry.signature}", 1
    )
    assert os.stat(again.path).st_mtime_ns == before[type(files[0])(again.path)]


def test_a_runnable_of_the_wrong_backend_is_refused(tmp_path):
    model, _ = models.chain()
    with pytest.raises(sampling.MeasurementError, match="ONNX files"):
        brick_timing.model_timer(model, ORT)
    onnx = onnx_files.OnnxFile(str(tmp_path / "x.onnx"))
    with pytest.raises(sampling.MeasurementError, match="Keras models"):
        brick_timing.model_timer(onnx, SETTINGS, check_settings=False)


def test_failure_reason_is_one_line():
    error = RuntimeError("first line\nsecond line")
    assert brick_timing.failure_reason(error) == "RuntimeError: first line"
    assert bench.failure_reason is brick_timing.failure_reason


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
