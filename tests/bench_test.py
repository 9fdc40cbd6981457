"""Tests for dlbricks_tf/running/bench.py, end to end on a tiny model.

Brick timings rebuild the tiny model's latency; the test checks the
protocol and that the estimate is a positive number of the measured one's
order (a loose ratio, never a time threshold).
"""

import collections
import dataclasses
import signal
import sqlite3

import pytest

import dlbricks_tf
from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import timing
from dlbricks_tf.running import bench
from dlbricks_tf.storing.store import Store
from tests import models

# The loop protocol (one traced loop per brick): chains are tested in
# tests/chain_test.py.
SETTINGS, CHECKED = models.settings(protocol="loop")
FAST = timing.TimingOptions(
    min_samples=5, max_samples=15, max_seconds=0.3, target_sample_ms=1.0
)
# A precision no interval can reach: every timing ends noisy at the cap.
NEVER_SETTLES = dataclasses.replace(
    FAST,
    precision=-1.0,
    absolute_precision_ms=-1.0,
    min_samples=3,
    max_samples=4,
    max_seconds=0.1,
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
        assert store.described() == set(seen)  # Kept with each timing.
        # As a store written before descriptions were kept: a bench that
        # times nothing gives its bricks theirs.
        with sqlite3.connect(tmp_path / "s.sqlite") as db:
            db.execute("DELETE FROM brick_descriptions")
        again = bench.time_suite(
            suite, store, SETTINGS, fp, FAST, accept_noisy=True
        )
        assert again.timed == () and set(again.skipped) == set(seen)
        assert store.descriptions(SETTINGS, fp) == {
            e.signature: e.brick.describe() for e in suite.entries
        }
        results = store.results(SETTINGS, fp)

    est = estimate_lib.estimate(d, results)
    par = estimate_lib.estimate(d, results, mode="parallel")
    measured = timing.time_model(model, SETTINGS, FAST, check_settings=CHECKED)
    assert est.ms > 0 and measured.median_ms > 0
    assert 0 < par.ms <= est.ms + 1e-12
    assert est.low_ms <= est.ms <= est.high_ms
    assert 0.05 < est.ms / measured.median_ms < 20  # Same order only.


def _chain_suite(granularity=1):
    model, _ = models.chain()
    d = dlbricks_tf.decompose(model, granularity=granularity)
    return suite_lib.build_suite({d.name: d})


def test_noisy_brick_is_measured_twice_and_stored_flagged(tmp_path):
    suite = _chain_suite(granularity=3)
    fp = system_fingerprint()
    path = tmp_path / "s.sqlite"
    calls = collections.Counter()

    def measure(entry):  # The default measurement, counted.
        calls[entry.signature] += 1
        model = entry.brick.build(batch_size=SETTINGS.batch_size)
        return timing.time_model(
            model, SETTINGS, NEVER_SETTLES, check_settings=CHECKED
        )

    with Store(path) as store:
        summary = bench.time_suite(
            suite, store, SETTINGS, fp, NEVER_SETTLES, measure=measure
        )
        results = store.results(SETTINGS, fp)
    assert calls == dict.fromkeys(suite.signatures, 2)
    assert summary.timed == suite.signatures
    assert summary.remeasured == suite.signatures
    assert summary.noisy == suite.signatures
    assert summary.measurements == 2 * len(suite)
    assert all(results[s].noisy for s in suite.signatures)
    # Each stored timing is one measurement's: at most the cap of samples
    # (fewer if some were left out as disturbed).
    assert all(1 <= results[s].samples <= 4 for s in suite.signatures)
    with sqlite3.connect(path) as db:
        flagged = db.execute(
            "SELECT COUNT(*) FROM brick_results WHERE noisy = 1"
        ).fetchone()[0]
    assert flagged == len(suite)


def test_settled_brick_is_measured_once(tmp_path):
    suite = _chain_suite(granularity=3)
    # Settles as soon as it may: any interval is narrow enough.
    easy = dataclasses.replace(
        FAST, min_samples=3, max_samples=50, absolute_precision_ms=1e9
    )
    with Store(tmp_path / "s.sqlite") as store:
        summary = bench.time_suite(
            suite,
            store,
            SETTINGS,
            system_fingerprint(),
            easy,
            check_settings=CHECKED,
        )
    assert summary.remeasured == () and summary.noisy == ()
    assert summary.measurements == len(suite) == len(summary.timed)


def test_signal_stops_after_the_brick_in_flight(tmp_path):
    suite = _chain_suite()
    assert len(suite) >= 3
    fp = system_fingerprint()
    committed = []

    def on_result(signature, result):
        committed.append(signature)
        if len(committed) == 1:  # Arrives while a brick is in flight.
            signal.raise_signal(signal.SIGINT)

    previous = signal.getsignal(signal.SIGINT)
    with Store(tmp_path / "s.sqlite") as store:
        with bench.StopSignals() as stop:
            summary = bench.time_suite(
                suite,
                store,
                SETTINGS,
                fp,
                NEVER_SETTLES,
                accept_noisy=True,
                check_settings=CHECKED,
                on_result=on_result,
                stop=stop,
            )
        stored = store.results(SETTINGS, fp)
    assert stop.received == signal.SIGINT and stop.name == "SIGINT"
    assert summary.stopped
    assert summary.timed == tuple(committed) == suite.signatures[:1]
    assert summary.remeasured == summary.timed  # Never settles: twice.
    assert set(stored) == set(committed)
    assert signal.getsignal(signal.SIGINT) is previous


def test_a_second_signal_acts_at_once():
    # A second signal meets the handler that was there before: make that
    # Python's default (a shell starts background jobs with SIGINT ignored,
    # and Python keeps it so). raise_signal runs the handler before it
    # returns, in this thread.
    original = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with bench.StopSignals() as stop:
            signal.raise_signal(signal.SIGINT)
            assert stop() and stop.received == signal.SIGINT
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
        assert not bench.StopSignals()()
    finally:
        signal.signal(signal.SIGINT, original)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
