"""Tests for dlbricks_tf/api.py: docs/usage.md's Python example, small models.

Real timings into a real store; no timing threshold.
"""

import math

import pytest

import dlbricks_tf
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.storing.store import Store
from tests import models

# At import, before any test runs TensorFlow: every test module that
# fixes the pools asks for the same sizes, which is a no-op after the first.
SETTINGS = dlbricks_tf.configure(intra_op_threads=1, inter_op_threads=1)


@pytest.fixture
def files(tmp_path):
    chain, _ = models.chain()
    residual, _ = models.residual()
    paths = []
    for name, model in (("chain", chain), ("residual", residual)):
        path = tmp_path / f"{name}.keras"
        model.save(path)
        paths.append(str(path))
    return paths


def test_the_readme_example_times_measures_and_estimates(files, tmp_path):
    db = str(tmp_path / "s.sqlite")
    settings = SETTINGS
    results = dlbricks_tf.run(
        files, db=db, granularity=[1, 2], settings=settings
    )
    assert [(r.model, r.granularity) for r in results] == [
        ("chain", 1),
        ("residual", 1),
        ("chain", 2),
        ("residual", 2),
    ]
    for r in results:
        assert isinstance(r, dlbricks_tf.ModelResult)
        assert r.measured_ms > 0 and r.low_ms <= r.estimated_ms <= r.high_ms
        assert r.normalized == pytest.approx(r.estimated_ms / r.measured_ms)
        assert r.failed_bricks == {}
        # A range wider than +-10% says why (two models: one other each,
        # too few to widen a range, so the bricks' bounds are the range).
        est = r.estimated_ms
        half = max(est - r.low_ms, r.high_ms - est) / est
        assert bool(r.range_flag) == (half > 0.1)
    # The store now holds every brick: estimating times nothing and gives
    # the same estimates.
    again = dlbricks_tf.estimate(files, db=db, granularity=2, settings=settings)
    by_model = {r.model: r for r in results if r.granularity == 2}
    for row in again:
        assert row.estimated_ms == pytest.approx(
            by_model[row.model].estimated_ms
        )
    # The reference is on by default, as for the command line: the store
    # holds this machine's reference state.
    with Store(db) as store:
        assert store.reference_state(settings, system_fingerprint()) > 0
    measured = dlbricks_tf.measure(files[:1], db=db, settings=settings)
    assert set(measured) == {"chain"}
    assert isinstance(measured["chain"], dlbricks_tf.Timing)
    assert measured["chain"].mean_ms > 0


def test_errors_a_caller_catches_are_exported(tmp_path):
    for name in (
        "Error",
        "MeasurementError",
        "MissingResultsError",
        "ModelSourceError",
        "StoreError",
        "ThreadPoolError",
    ):
        assert issubclass(getattr(dlbricks_tf, name), dlbricks_tf.Error)
    with pytest.raises(dlbricks_tf.ModelSourceError):
        dlbricks_tf.estimate(["NoSuchNet"], db=str(tmp_path / "s.sqlite"))
    empty = str(tmp_path / "empty.sqlite")
    with pytest.raises(dlbricks_tf.MissingResultsError):
        dlbricks_tf.estimate(["MobileNetV2"], db=empty)


def test_other_thread_pools_are_refused_in_one_line():
    other = SETTINGS.intra_op_threads + 1
    with pytest.raises(dlbricks_tf.ThreadPoolError) as error:
        dlbricks_tf.configure(intra_op_threads=other)
    assert len(str(error.value).splitlines()) == 1


def test_a_result_is_within_only_with_a_measurement():
    r = dlbricks_tf.ModelResult("m", 1, 2.0, 2.1, 2.0, 2.2, 1.05)
    assert r.within
    assert not dlbricks_tf.ModelResult("m", 1, None, 2.1, 2, 2.2, None).within
    nan = dlbricks_tf.ModelResult("m", 1, 2.0, math.nan, 0, 0, math.nan)
    assert not nan.within


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
