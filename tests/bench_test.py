"""Tests for dlbricks_tf/bench.py, end to end on a tiny model.

Brick timings rebuild the tiny model's latency; the test checks the
protocol and that the estimate is a positive number of the measured one's
order (a loose ratio, never a time threshold).
"""

import pytest

import dlbricks_tf
from dlbricks_tf import bench, timing
from dlbricks_tf import estimate as estimate_lib
from dlbricks_tf import settings as settings_lib
from dlbricks_tf import suite as suite_lib
from dlbricks_tf.fingerprint import system_fingerprint
from dlbricks_tf.store import Store
from tests import models


def _settings():
    try:
        settings_lib.configure_threads(1, 1)
        checked = True
    except settings_lib.ThreadPoolError:
        checked = False  # An earlier test ran TensorFlow first.
    return settings_lib.RunSettings(
        1, 1, 1, onednn=settings_lib.onednn_enabled()
    ), checked


SETTINGS, CHECKED = _settings()
FAST = timing.TimingOptions(
    min_samples=5, max_samples=15, max_seconds=0.3, target_sample_ms=1.0
)


def test_time_suite_stores_skips_and_estimates(tmp_path):
    model, _ = models.chain()
    d = dlbricks_tf.decompose(model, granularity=2)
    suite = suite_lib.build_suite({d.name: d})
    fp = system_fingerprint()
    seen = []
    with Store(tmp_path / "s.sqlite") as store:
        first = bench.time_suite(
            suite,
            store,
            SETTINGS,
            fp,
            FAST,
            accept_noisy=True,
            check_settings=CHECKED,
            on_result=lambda s, t: seen.append(s),
        )
        assert set(first.timed) == set(suite.signatures) == set(seen)
        assert first.skipped == () and first.wall_s > 0
        again = bench.time_suite(
            suite, store, SETTINGS, fp, FAST, accept_noisy=True
        )
        assert again.timed == () and set(again.skipped) == set(seen)
        results = store.results(SETTINGS, fp)

    est = estimate_lib.estimate(d, results)
    par = estimate_lib.estimate(d, results, mode="parallel")
    measured = timing.time_model(model, SETTINGS, FAST, check_settings=CHECKED)
    assert est.ms > 0 and measured.median_ms > 0
    assert 0 < par.ms <= est.ms + 1e-12
    assert est.low_ms <= est.ms <= est.high_ms
    assert 0.05 < est.ms / measured.median_ms < 20  # Same order only.


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
