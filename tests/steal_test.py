"""Tests of dlbricks_tf/measuring/steal.py: /proc/stat here and made-up."""

import os

import pytest

from dlbricks_tf.measuring import steal


def _stat(cpu: str, *cpus: str) -> str:
    """The text of a /proc/stat with the given cpu lines and other lines."""
    lines = [f"cpu  {cpu}"]
    lines += [f"cpu{i} {line}" for i, line in enumerate(cpus)]
    lines += ["intr 149132 0 0 1", "ctxt 220241", "btime 1700000000"]
    return "\n".join(lines) + "\n"


# Aggregate: total 1000 jiffies, 35 stolen. Guest (20) is inside user.
BEFORE = _stat(
    "100 0 50 800 10 0 5 35 20 0",
    "60 0 30 390 5 0 5 10 20 0",
    "40 0 20 410 5 0 0 25 0 0",
)
# 1000 jiffies later, 150 of them stolen: 25 from cpu0, 125 from cpu1.
AFTER = _stat(
    "200 0 100 1500 10 0 5 185 70 0",
    "110 0 60 785 5 0 5 35 70 0",
    "90 0 40 715 5 0 0 150 0 0",
)


def _cpu_work() -> int:
    return sum(i * i for i in range(200_000))


def test_parse_reads_each_column_and_leaves_guest_out_of_the_total():
    t = steal.parse_stat(BEFORE, time_s=3.5)
    assert t.time_s == 3.5
    assert t.cpu == steal.CpuLine("cpu", 100, 0, 50, 800, 10, 0, 5, 35)
    assert t.cpu.total == 1000
    assert [c.name for c in t.cpus] == ["cpu0", "cpu1"]
    assert t.cpus[1].steal == 25 and t.cpus[1].total == 500
    assert t.has_steal


def test_share_is_steal_over_all_jiffies_of_the_interval():
    before, after = steal.parse_stat(BEFORE), steal.parse_stat(AFTER)
    assert steal.steal_share(before, after) == 150 / 1000
    assert steal.StealMeter.steal_share(before, after) == 0.15
    assert steal.per_cpu_steal_shares(before, after) == {
        "cpu0": 25 / 500,
        "cpu1": 125 / 500,
    }
    # No jiffy passed: nothing was stolen.
    assert steal.steal_share(before, before) == 0.0
    # Counters that went backwards are not one CPU's course.
    assert steal.steal_share(after, before) is None


def test_a_kernel_without_the_steal_column_gives_no_share():
    old = steal.parse_stat(_stat("100 0 50 800 10 0 5", "100 0 50 800"))
    assert old.cpu.steal is None and not old.has_steal
    assert old.cpu.total == 965
    assert old.cpus[0] == steal.CpuLine("cpu0", 100, 0, 50, 800)
    assert steal.steal_share(old, old) is None
    assert steal.steal_share(old, steal.parse_stat(AFTER)) is None
    assert steal.per_cpu_steal_shares(old, old) == {"cpu0": None}
    meter = steal.StealMeter()
    assert meter.add(old) is None
    assert meter.summary() == {"steal_share": None, "steal_peak_share": None}


def test_text_without_a_usable_cpu_line_parses_to_none():
    assert steal.parse_stat("") is None
    assert steal.parse_stat("intr 1 2 3\nctxt 4\n") is None
    assert steal.parse_stat("cpu  1 2 x 4 5 6 7 8\n") is None
    assert steal.parse_stat("cpu  1 2 3\n") is None
    assert steal.parse_line("cpu0 1 2 3 4") == steal.CpuLine("cpu0", 1, 2, 3, 4)


def test_meter_closes_intervals_of_at_least_min_interval():
    def reading(t: float, busy: int, stolen: int):
        # `busy` jiffies of user time and `stolen` of steal since boot.
        return steal.parse_stat(_stat(f"{busy} 0 0 0 0 0 0 {stolen}"), t)

    meter = steal.StealMeter(min_interval_s=1.0)
    assert meter.add(reading(10.0, 100, 0)) is None  # Starts the record.
    assert meter.add(reading(10.5, 150, 50)) is None  # 0.5 s: too short.
    # 1.2 s after the start: 100 stolen of 200.
    assert meter.add(reading(11.2, 200, 100)) == 0.5
    assert meter.add(reading(12.0, 280, 100)) is None  # 0.8 s after 11.2.
    # 1.2 s after 11.2: 0 + 20 stolen of 100 + 20.
    assert meter.add(reading(12.4, 300, 120)) == pytest.approx(20 / 120)
    assert meter.add(reading(12.3, 999, 999)) is None  # Out of order.
    assert meter.add(reading(12.9, 340, 130)) is None  # Extends the total.
    times, shares = zip(*meter.intervals, strict=True)
    assert times == pytest.approx((1.2, 2.4))
    assert shares == (0.5, 20 / 120)
    assert meter.peak_share == 0.5
    # From the first reading to the last: 130 stolen of 240 + 130.
    assert meter.total_share == pytest.approx(130 / 370)
    assert meter.summary() == {
        "steal_share": pytest.approx(130 / 370),
        "steal_peak_share": 0.5,
    }


def test_negative_min_interval_is_refused():
    with pytest.raises(ValueError, match="min_interval_s must be >= 0"):
        steal.StealMeter(min_interval_s=-1.0)


def test_real_counters_only_grow_and_give_a_share_in_0_1():
    if not os.path.exists(steal.PROC_STAT):
        pytest.skip("This system has no /proc/stat.")
    before = steal.read_stat()
    _cpu_work()
    after = steal.read_stat()
    assert after.time_s > before.time_s
    assert after.cpu.name == "cpu" and after.cpus
    assert all(c.name == f"cpu{c.name[3:]}" for c in after.cpus)
    for name in steal.COLUMNS:
        a, b = getattr(before.cpu, name), getattr(after.cpu, name)
        if a is not None:
            assert b >= a, name
    assert after.cpu.total >= before.cpu.total
    for b, a in zip(before.cpus, after.cpus, strict=True):
        assert b.name == a.name and a.total >= b.total
    if not after.has_steal:
        assert steal.steal_share(before, after) is None
        return
    assert 0.0 <= steal.steal_share(before, after) <= 1.0
    shares = steal.per_cpu_steal_shares(before, after)
    assert set(shares) == {c.name for c in after.cpus}
    assert all(0.0 <= s <= 1.0 for s in shares.values())


def test_real_meter_over_a_short_run():
    if not os.path.exists(steal.PROC_STAT):
        pytest.skip("This system has no /proc/stat.")
    meter = steal.StealMeter(min_interval_s=0.0)
    meter.start()
    closed = []
    for _ in range(3):
        _cpu_work()
        closed.append(meter.tick())
    meter.stop()
    if not meter.snapshot().has_steal:
        assert meter.summary() == {
            "steal_share": None,
            "steal_peak_share": None,
        }
        return
    times = [t for t, _ in meter.intervals]
    shares = [s for _, s in meter.intervals]
    assert len(meter.intervals) == 4  # Each tick and the stop closed one.
    assert shares[:3] == closed
    assert times == sorted(times) and times[0] > 0
    assert all(0.0 <= s <= 1.0 for s in shares)
    assert meter.peak_share == max(shares)
    assert 0.0 <= meter.total_share <= meter.peak_share


def test_no_proc_stat_gives_none_and_never_raises(tmp_path):
    meter = steal.StealMeter(str(tmp_path / "absent"), min_interval_s=0.0)
    assert meter.snapshot() is None
    meter.start()
    assert meter.tick() is None
    meter.stop()
    assert meter.intervals == []
    assert meter.summary() == {"steal_share": None, "steal_peak_share": None}
    assert steal.steal_share(None, steal.parse_stat(AFTER)) is None
    assert steal.per_cpu_steal_shares(None, None) == {}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
