"""Tests of dlbricks_tf/reporting/compare.py and its TensorBoard view."""

import dataclasses
from types import SimpleNamespace

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.reporting import board, compare, estimates_board
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store

FAST_CPU = SystemFingerprint(
    cpu_model="Intel(R) Xeon(R) Fast CPU @ 3.0GHz",
    physical_cores=8,
    logical_cpus=16,
    os="Linux-test",
    machine="x86_64",
    python="3.11.0",
    tensorflow="2.21.0",
    keras="3.15.1",
    onnxruntime="1.31.1",
    onednn=True,
)
SLOW_CPU = dataclasses.replace(FAST_CPU, cpu_model="Slow CPU", logical_cpus=2)
TF = RunSettings(batch_size=1, intra_op_threads=2, inter_op_threads=1)
ORT = dataclasses.replace(TF, backend="onnxruntime", protocol=None)


def _timing(ms, noisy=False):
    return Timing(ms, ms, ms, ms, 10, ms * 0.9, ms * 1.1, noisy)


def _plan(name, signatures, dependencies):
    bricks = [SimpleNamespace(signature=s) for s in signatures]
    return SimpleNamespace(name=name, bricks=bricks, dependencies=dependencies)


PLANS = {
    "net_a": _plan("net_a", ["a", "b", "a"], [(), (0,), (1,)]),
    "net_b": _plan("net_b", ["b", "c"], [(), (0,)]),
}


def _columns(table):
    """Columns of (ORT, fast CPU), (TF, fast CPU) and (TF, slow CPU)."""
    by = {
        (c.settings.backend, c.fingerprint.cpu_model): i
        for i, c in enumerate(table.configurations)
    }
    return (
        by[("onnxruntime", FAST_CPU.cpu_model)],
        by[("tf", FAST_CPU.cpu_model)],
        by[("tf", "Slow CPU")],
    )


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "all.sqlite") as s:
        # Fast machine on TF: every brick; on ORT, no "c".
        for sig, ms in {"a": 1.0, "b": 2.0, "c": 4.0}.items():
            s.put(sig, TF, FAST_CPU, _timing(ms))
        s.put("a", ORT, FAST_CPU, _timing(0.5))
        s.put("b", ORT, FAST_CPU, _timing(1.0, noisy=True))
        # Slow machine on TF: everything twice as slow.
        for sig, ms in {"a": 2.0, "b": 4.0, "c": 8.0}.items():
            s.put(sig, TF, SLOW_CPU, _timing(ms))
        s.put_model("net_a", TF, SLOW_CPU, _timing(9.0))
        # Another batch size, filtered out below.
        s.put("a", dataclasses.replace(TF, batch_size=8), FAST_CPU, _timing(1))
        yield s


def test_configurations_group_results(store):
    configs = compare.configurations(store, batch_size=1)
    assert len(configs) == 3
    counts = sorted(c.bricks for c, _ in configs)
    assert counts == [2, 3, 3]
    assert len({c.label for c, _ in configs}) == 3
    assert len(compare.configurations(store)) == 4


def test_compare_estimates_and_names_fastest(store):
    table = compare.compare(PLANS, store, batch_size=1)
    labels = [c.label for c in table.configurations]
    ort_fast, tf_fast, tf_slow = _columns(table)
    assert table.estimates[("net_a", tf_fast)].ms == pytest.approx(4.0)
    assert table.estimates[("net_a", tf_slow)].ms == pytest.approx(8.0)
    assert table.estimates[("net_a", ort_fast)].ms == pytest.approx(2.0)
    assert table.estimates[("net_a", ort_fast)].noisy
    assert table.fastest("net_a") == ort_fast
    assert table.speedup("net_a") == pytest.approx(4.0)
    # ORT lacks brick "c": net_b is not estimated there, and says why.
    assert ("net_b", ort_fast) not in table.estimates
    assert table.missing[("net_b", ort_fast)] == 1
    assert table.fastest("net_b") == tf_fast
    assert table.measured == {("net_a", tf_slow): 9.0}
    header, rows = compare.table(table)
    assert header[0] == "model" and header[-3] == "fastest"
    assert rows[0][-3] == labels[ort_fast]
    # One measured configuration only: no pick to compare.
    assert table.picks() == [] and rows[0][-2] == "-"
    assert "Picks:" not in compare.format_comparison(table)
    assert rows[1][1 + ort_fast] == "1 missing"
    assert "(9.000)" in rows[0][1 + tf_slow]
    text = compare.format_comparison(table)
    assert "| net_b |" in text and "noisy" in text


def test_picks_count_a_wrong_choice_only_past_ten_percent(store, tmp_path):
    # Measured: net_a fastest on the slow machine's TF (a planted upset)
    # and 5% apart on net_b: the estimates' pick is wrong for net_a only.
    store.put_model("net_a", TF, FAST_CPU, _timing(12.0))
    store.put_model("net_a", ORT, FAST_CPU, _timing(10.0))
    store.put("c", ORT, FAST_CPU, _timing(2.0))
    store.put_model("net_b", TF, FAST_CPU, _timing(6.0))
    store.put_model("net_b", ORT, FAST_CPU, _timing(6.3))
    table = compare.compare(PLANS, store, batch_size=1)
    labels = [c.label for c in table.configurations]
    ort_fast, tf_fast, tf_slow = _columns(table)
    a, b = table.picks()
    # net_a: estimates 2 (ORT), 4 (TF fast), 8 (TF slow); measured 10, 12, 9.
    assert (a.estimated, a.measured) == (ort_fast, tf_slow)
    assert a.gap == pytest.approx(10.0 / 9.0 - 1) and a.wrong
    # net_b: estimates 3 (ORT: 1 + 2), 6 (TF); measured 6.3, 6.0: +5%.
    assert (b.estimated, b.measured) == (ort_fast, tf_fast)
    assert b.gap == pytest.approx(0.05) and not b.wrong
    _, rows = compare.table(table)
    assert rows[0][-2] == f"{labels[tf_slow]} (estimates' pick +11%, wrong)"
    assert rows[1][-2] == f"{labels[tf_fast]} (estimates' pick +5%)"
    line = compare.format_picks(table)
    assert "for 0 of 2 model(s)" in line
    assert "more than 10% slower): 1 of 2 (net_a +11%)" in line
    assert line in compare.format_comparison(table)
    estimates_board.write_comparison(tmp_path / "tb", table)
    acc = event_accumulator.EventAccumulator(
        str(tmp_path / "tb" / board.COMPARE_RUN),
        size_guidance={event_accumulator.TENSORS: 0},
    )
    acc.Reload()
    (event,) = acc.Tensors("wrong_picks")
    assert tf.make_ndarray(event.tensor_proto).item() == 1.0


def test_parallel_mode(store):
    plans = {"net_a": _plan("net_a", ["a", "b", "c"], [(), (0,), (0,)])}
    table = compare.compare(plans, store, mode="parallel", batch_size=1)
    fast = [
        i
        for i, c in enumerate(table.configurations)
        if c.settings.backend == "tf" and c.fingerprint == FAST_CPU
    ][0]
    assert table.estimates[("net_a", fast)].ms == pytest.approx(1.0 + 4.0)


def test_write_comparison_reads_back(store, tmp_path):
    table = compare.compare(PLANS, store, batch_size=1)
    files = estimates_board.write_comparison(tmp_path / "tb", table)
    assert len(files) == 1
    acc = event_accumulator.EventAccumulator(
        str(tmp_path / "tb" / board.COMPARE_RUN),
        size_guidance={event_accumulator.TENSORS: 0},
    )
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert "comparison/text_summary" in tags or "comparison" in tags
    assert "estimates" in tags
    scalars = [t for t in tags if t.startswith("estimate_ms/")]
    assert len(scalars) == len(table.estimates) == 5
    text_tag = [t for t in tags if t.startswith("comparison")][0]
    text = tf.make_ndarray(acc.Tensors(text_tag)[0].tensor_proto)
    assert b"net_a" in text.item()
    assert "wrong_picks" not in tags  # No model measured twice.
    # A rewrite replaces, not adds.
    assert len(estimates_board.write_comparison(tmp_path / "tb", table)) == 1


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
