"""Tests for dlbricks_tf/measuring/crowding.py and the timers that use it.

The rule on exact counters, then real other work: a child process that
spins a CPU while this one waits makes the wait crowded, this process's
own work does not, and a timer leaves the crowded sample out though its
time looks usual. No timing threshold.
"""

import os
import subprocess
import sys
import time

import pytest

from dlbricks_tf.measuring import crowding, disturbed, sampling, steal
from tests import models, scripted

SETTINGS, CHECKED = models.settings()
HZ = crowding._hz()
SPIN = "import time\nend = time.time() + {s}\nwhile time.time() < end: pass\n"


def _spinning(seconds):
    """A child process spinning one CPU for `seconds`, while this waits."""
    child = subprocess.Popen([sys.executable, "-c", SPIN.format(s=seconds)])
    time.sleep(seconds)
    child.wait()


def test_other_work_over_the_share_and_slack_is_crowded():
    before = crowding.Reading(busy=1000, total=5000, own_s=10.0)
    # 200 jiffies of the CPUs' time pass; this process ran 1 s of them.
    share = crowding.SLACK_JIFFIES + crowding.SHARE * 200
    at = crowding.Reading(busy=1000 + HZ + share, total=5200, own_s=11.0)
    over = crowding.Reading(busy=1000 + HZ + share + 1, total=5200, own_s=11.0)
    assert crowding.others_jiffies(before, over) == pytest.approx(share + 1)
    assert not crowding.crowded(before, at)
    assert crowding.crowded(before, over)


def test_this_process_s_own_time_is_not_other_work():
    before = crowding.Reading(busy=0, total=0, own_s=0.0)
    after = crowding.Reading(busy=2 * HZ, total=2 * HZ, own_s=2.0)
    assert crowding.others_jiffies(before, after) == pytest.approx(0.0)
    assert not crowding.crowded(before, after)


def test_without_a_reading_nothing_is_crowded(tmp_path):
    assert crowding.read(str(tmp_path / "no_such_file")) is None
    reading = crowding.Reading(busy=0, total=100, own_s=0.0)
    assert not crowding.crowded(None, reading)
    assert not crowding.crowded(reading, None)


def test_a_reading_sums_the_cpus_this_process_may_run_on():
    mine = sorted(os.sched_getaffinity(0))
    other = max(mine) + 1
    lines = ["cpu  90 0 10 900 0 0 0 5"]
    lines += [f"cpu{i} 10 0 2 100 3 0 0 1" for i in mine]
    lines += [f"cpu{other} 500 0 0 0 0 0 0 0", "intr 1 2 3"]
    times = steal.parse_stat("\n".join(lines))
    reading = crowding.reading_of(times, own_s=1.5)
    # Busy: user + system + steal; idle and iowait are not.
    assert reading.busy == 13 * len(mine)
    assert reading.total == 116 * len(mine)
    assert reading.own_s == 1.5


def test_a_crowded_sample_is_left_out_unless_all_are():
    samples = [1.0, 1.0, 1.02, 1.0, 1.01, 1.0]
    crowded = [False, True, False, False, True, False]
    assert disturbed.kept(samples, crowded=crowded) == [0, 2, 3, 5]
    # A burst is still told by its time.
    slow = [1.0, 1.0, 1.6, 1.0, 1.01, 1.0]
    assert disturbed.kept(slow, crowded=crowded) == [0, 3, 5]
    # Other work all the time: the times alone decide.
    assert disturbed.kept(slow, crowded=[True] * 6) == [0, 1, 3, 4, 5]
    with pytest.raises(ValueError, match="5 crowded flags for 6 samples"):
        disturbed.kept(samples, crowded=[False] * 5)


def test_a_process_spinning_beside_a_wait_crowds_it():
    before = crowding.read()
    _spinning(0.5)
    assert crowding.crowded(before, crowding.read())


def test_this_process_spinning_does_not_crowd_its_own_sample():
    before = crowding.read()
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        pass
    after = crowding.read()
    # Its own half second of CPU is not counted as other work.
    assert crowding.others_jiffies(before, after) < 0.25 * HZ


def test_a_timer_leaves_out_a_sample_other_work_crowded():
    values = [2.0, 2.0, 2.2, 2.0, 2.0, 2.0]
    options = sampling.TimingOptions(min_samples=2, max_samples=6)

    def during(taken):
        if taken == 2:  # The third sample, while another process spins.
            _spinning(0.4)

    timer = scripted.ScriptedTimer(values, options, during=during)
    for _ in range(6):
        timer.sample()
    assert timer._crowded[2]
    assert timer.kept_samples == (2.0,) * 5
    assert timer.result().max_ms == 2.0


def test_a_chain_leaves_a_crowded_pass_out_of_every_brick():
    def beside(call):
        # The fourth pass runs while another process spins a CPU.
        def spun(n, read=False):
            _spinning(0.4)
            return call(n, read)

        return spun

    bricks, timer = scripted.chain_with_pass(3, beside)
    for _ in range(5):
        timer.sample()
    assert timer._crowded[3]
    kept = timer._kept()
    assert 3 not in kept and timer.kept_count == len(kept) >= 1
    for i in range(len(bricks)):
        assert timer.result(i, noisy=False).samples == len(kept)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__]))
