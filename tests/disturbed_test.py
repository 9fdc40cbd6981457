"""Tests for dlbricks_tf/measuring/disturbed.py and the timers that use it.

A neighbour's burst is played by scaling some samples, on exact
arithmetic for the rule and the shared sampling protocol, and on one pass
of a real chain: what is left out, and that what is kept is the timing of
the machine undisturbed. No timing threshold.
"""

import pytest

from dlbricks_tf import stats
from dlbricks_tf.measuring import disturbed, sampling
from tests import models, scripted

SETTINGS, CHECKED = models.settings()


def test_a_quiet_timer_keeps_every_sample():
    quiet = [1.0, 1.1, 0.95, 1.2, 1.05, 1.0, 1.3, 0.98]
    assert disturbed.kept(quiet) == list(range(len(quiet)))


def test_a_burst_is_left_out():
    samples = [1.0, 1.02, 1.6, 1.7, 0.99, 1.65, 1.01, 1.0]
    assert disturbed.kept(samples) == [0, 1, 4, 6, 7]


def test_a_neighbour_busy_all_the_time_leaves_out_nothing():
    # The lower quartile is where the neighbour puts it: nothing to refuse.
    busy = [1.6, 1.65, 1.7, 1.62, 1.68, 1.6]
    assert disturbed.kept(busy) == list(range(len(busy)))


def test_too_few_samples_or_no_positive_quartile_keeps_them_all():
    assert disturbed.kept([1.0, 5.0, 9.0]) == [0, 1, 2]
    assert disturbed.kept([0.0, 0.0, 0.0, 0.0, 3.0]) == [0, 1, 2, 3, 4]
    assert disturbed.kept([]) == []


def test_the_ratio_is_the_bound():
    samples = [1.0, 1.0, 1.0, 1.0, 1.4, 1.41]
    assert disturbed.kept(samples) == [0, 1, 2, 3, 4]
    assert disturbed.kept(samples, ratio=1.5) == list(range(6))


def test_a_tally_adds_timers_up_and_has_no_share_of_nothing():
    tally = disturbed.Tally()
    assert tally.share is None
    tally.add(30, 3)
    tally.add(10, 1)
    assert (tally.taken, tally.left_out) == (40, 4)
    assert tally.share == pytest.approx(0.1)


def test_a_timer_summarises_and_stops_on_the_samples_not_disturbed():
    # Ten undisturbed samples, and a burst of four among them.
    values = [2.0] * 4 + [3.4] * 4 + [2.0] * 6
    options = sampling.TimingOptions(precision=0.01, min_samples=10)
    timer = scripted.ScriptedTimer(values, options)
    for _ in range(13):
        timer.sample()
        assert not timer.settled  # 9 undisturbed samples at most.
    timer.sample()
    assert timer.settled and len(timer.samples) == 14
    result = timer.result()
    assert result.samples == 10
    assert result.mean_ms == pytest.approx(2.0)
    assert result.max_ms == 2.0 and not result.noisy


class Burst:
    """A reference factor of 1 that reports nothing of the burst."""

    def factor(self):
        return 1.0


def test_a_chain_leaves_a_disturbed_pass_out_of_every_brick():
    def neighbour(call):
        # The sixth pass runs while a neighbour holds the machine: every
        # link of it three times as long.
        return lambda n, read=False: call(n, read) * 3.0

    bricks, timer = scripted.chain_with_pass(5, neighbour, scale=Burst())
    for _ in range(9):
        timer.sample()
    assert timer.sample_count == 10
    kept = timer._kept()
    assert 5 not in kept
    assert timer.kept_count == len(kept) >= 1
    per_pass = timer._layout.count(None)
    link = stats.median(
        [
            v
            for j in kept
            for v in timer._raw_empty[j * per_pass : (j + 1) * per_pass]
        ]
    )
    assert timer.link_ms == pytest.approx(link)
    for i in range(len(bricks)):
        want = [max(timer._raw[i][j] - link, 0.0) for j in kept]
        assert timer.samples(i) == pytest.approx(want)
        assert timer.precise_samples(i) == pytest.approx(want)
        assert timer.result(i, noisy=False).samples == len(kept)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
