"""Tests for dlbricks_tf/measuring/chain.py and campaign.py.

Figures are checked for what the protocol promises (one positive figure per
brick, the link cost subtracted, commits per chain), never against a time.
"""

import functools
import statistics

import keras
import pytest

import dlbricks_tf
from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import (
    campaign,
    chain,
    chain_graph,
    reference,
    timing,
)
from tests import models

SETTINGS, CHECKED = models.settings()
FAST = timing.TimingOptions(min_samples=4, max_samples=8, max_seconds=2.0)


def _bricks(model, granularity=1):
    d = dlbricks_tf.decompose(model, granularity=granularity)
    suite = suite_lib.build_suite({"m": d})
    return d, suite


def _chained(suite):
    """The suite's bricks as a campaign takes them, built at batch 1."""
    return [
        campaign.ChainedBrick(e.signature, functools.partial(e.brick.build, 1))
        for e in suite.entries
    ]


def test_layout_spreads_empty_links_and_keeps_every_brick_once():
    layout = chain_graph.layout(range(10), 4)
    assert [i for i in layout if i is not None] == list(range(10))
    assert layout.count(None) == 4
    assert layout[0] is None


def test_a_chain_gives_one_positive_figure_per_brick():
    _, suite = _bricks(models.chain()[0])
    bricks = [(e.signature, e.brick.build(1)) for e in suite.entries]
    timer = chain.ChainTimer(bricks, SETTINGS, check_settings=CHECKED)
    for _ in range(5):
        timer.sample()
    assert timer.keys == tuple(e.signature for e in suite.entries)
    assert timer.sample_count == 5
    for i in range(len(bricks)):
        result = timer.result(i, noisy=False)
        assert result.samples == timer.kept_count  # Bursts left out.
        assert result.median_ms > 0
    assert timer.prepare_seconds > 0 and timer.iterations >= 1


def test_the_link_cost_is_measured_and_subtracted():
    _, suite = _bricks(models.chain()[0])
    bricks = [(e.signature, e.brick.build(1)) for e in suite.entries]
    timer = chain.ChainTimer(bricks, SETTINGS, check_settings=CHECKED)
    for _ in range(4):
        timer.sample()
    link = timer.link_ms
    assert link > 0
    raw = timer._samples[0]
    kept = timer._kept()  # Passes a burst or other work disturbed, out.
    assert timer.samples(0) == [max(raw[j] - link, 0.0) for j in kept]
    assert timer.result(0, noisy=False).loop_overhead_ms == link


def test_the_stopping_rule_reads_unscaled_samples_on_one_factor():
    _, suite = _bricks(models.chain()[0])
    bricks = [(e.signature, e.brick.build(1)) for e in suite.entries]
    factors = iter([1.0, 3.0, 2.0, 2.0])

    class Jitter:  # A reference whose factor moves from pass to pass.
        def factor(self):
            return next(factors)

    timer = chain.ChainTimer(
        bricks, SETTINGS, check_settings=CHECKED, scale=Jitter()
    )
    for _ in range(4):
        timer.sample()
    # Stored figures: each pass scaled by its own factor.
    scaled = timer._samples[0]
    raw = timer._raw[0]
    assert scaled == pytest.approx(
        [v * f for v, f in zip(raw, [1.0, 3.0, 2.0, 2.0], strict=True)]
    )
    # The rule: the unscaled samples of the passes kept, link off, times
    # the median factor of those passes (2.0 with all four or any three:
    # a pass other work crowded or a hiccup slowed is left out, and how
    # many are depends on the machine, so the test reads which).
    kept = timer._kept()
    if not kept:
        assert timer.precise_samples(0) == []
        return
    factor = statistics.median([1.0, 3.0, 2.0, 2.0][j] for j in kept)
    per_pass = len(timer._raw_empty) // 4
    link = statistics.median(
        v
        for j in kept
        for v in timer._raw_empty[j * per_pass : (j + 1) * per_pass]
    )
    assert timer.precise_samples(0) == pytest.approx(
        [max(raw[j] - link, 0.0) * factor for j in kept]
    )


def test_a_chain_reads_the_reference_right_after_its_last_pass():
    _, suite = _bricks(models.chain()[0])
    bricks = [(e.signature, e.brick.build(1)) for e in suite.entries]
    workload = reference.Reference(
        "matmul-reduce", size=64, matmuls=2, memory_mib=1
    )

    def from_python():
        raise AssertionError("read before the passes, not after them")

    scale = reference.ReferenceScale(from_python, 1.0, window=1, graph=workload)
    timer = chain.ChainTimer(
        bricks, SETTINGS, check_settings=CHECKED, scale=scale
    )
    for _ in range(3):
        timer.sample()
    # One reading of real work per sample, and each sample scaled by it.
    assert len(scale.readings) == timer.sample_count == 3
    assert all(r > 0.001 for r in scale.readings)
    assert timer._factors == pytest.approx([1 / r for r in scale.readings])
    assert timer._samples[0] == pytest.approx(
        [v / r for v, r in zip(timer._raw[0], scale.readings, strict=True)]
    )
    # The chain's own graph holds no reading (a loop in every chain's
    # graph cost 90-125 ms of its setup).
    ops = timer._concrete.graph.get_operations()
    assert not [op for op in ops if "While" in op.type]


def test_a_chain_refuses_repeated_keys_and_xla():
    model = models.chain()[0]
    with pytest.raises(timing.MeasurementError, match="once"):
        chain.ChainTimer([("a", model), ("a", model)], SETTINGS)
    xla = settings_lib.RunSettings(1, 1, 1, jit_compile=True)
    with pytest.raises(timing.MeasurementError, match="jit_compile"):
        chain.ChainTimer([("a", model)], xla, check_settings=False)


def test_campaign_samples_its_chains_side_by_side_and_estimates_a_tiny_model():
    d, suite = _bricks(models.residual()[0])
    weights = {"m": {e.signature: e.count("m") for e in suite.entries}}
    bricks = _chained(suite)
    links = max(1, len(bricks) // 3)
    options = timing.TimingOptions(
        min_samples=4, max_samples=8, max_seconds=2.0, chain_links=links
    )
    committed = []
    rounds = []
    summary = campaign.time_chains(
        bricks,
        SETTINGS,
        options,
        weights=weights,
        between=lambda: rounds.append(1),
        on_result=lambda key, result: committed.append((key, result)),
        check_settings=CHECKED,
    )
    assert sorted(k for k, _ in committed) == sorted(b.key for b in bricks)
    assert summary.timed == tuple(k for k, _ in committed)
    assert summary.chains == -(-len(bricks) // links) >= 3
    # One round samples every chain not done, then the model (`between`):
    # at least min_samples rounds, at most max_samples, not one series of
    # rounds per chain.
    assert 4 <= len(rounds) <= 8
    results = dict(committed)
    est = estimate_lib.estimate(d, results, "sequential")
    assert 0 < est.ms < float("inf")


@pytest.mark.parametrize("model_rounds", [0, 7, 40])
def test_settled_chains_keep_pace_with_their_model_to_their_caps(
    model_rounds,
):
    # A precision every sample meets: the chains settle at min_samples.
    _, suite = _bricks(models.residual()[0])
    bricks = _chained(suite)
    weights = {"m": {e.signature: e.count("m") for e in suite.entries}}
    options = timing.TimingOptions(
        precision=10.0,
        min_samples=3,
        max_samples=12,
        max_seconds=60.0,
        chain_links=max(1, len(bricks) // 2),
    )
    rounds = []
    committed = {}
    summary = campaign.time_chains(
        bricks,
        SETTINGS,
        options,
        weights=weights,
        between=lambda: rounds.append(1),
        on_result=committed.__setitem__,
        check_settings=CHECKED,
        # The model is done after `model_rounds` rounds.
        pace=lambda: len(rounds) < model_rounds,
    )
    # Settled at 3 passes; beside a model not done, one more pass per
    # round until it is (the pass before the round that ends it counts),
    # never past max_samples.
    # A result counts the passes not disturbed (`disturbed`): a pass a
    # hiccup of the machine slowed is left out and taken again.
    want = min(max(3, model_rounds + 1), 12)
    assert want <= len(rounds) <= min(want + summary.passes_left_out, 12)
    assert all(3 <= r.samples <= len(rounds) for r in committed.values())


def test_a_brick_a_model_calls_often_gets_one_link_per_pass():
    # Its count weighs it in the model's estimate; more links a pass made
    # passes longer than the samples they saved (campaign.py).
    _, suite = _bricks(models.chain()[0])
    bricks = _chained(suite)
    often = bricks[0].key
    weights = {"m": {b.key: 1 for b in bricks} | {often: 25}}
    options = timing.TimingOptions(min_samples=4, max_samples=4)
    committed = {}
    campaign.time_chains(
        bricks,
        SETTINGS,
        options,
        weights=weights,
        on_result=committed.__setitem__,
        check_settings=CHECKED,
    )
    # As many samples of it as of every other brick: one a pass (at most
    # the 4 passes; fewer if a pass was left out as disturbed).
    (samples,) = {r.samples for r in committed.values()}
    assert 1 <= samples <= 4


def test_a_stop_request_keeps_the_chains_already_committed():
    _, suite = _bricks(models.residual()[0])
    bricks = _chained(suite)
    committed = []
    asked = []

    def stop():  # Asked while building the second chain's first brick.
        asked.append(1)
        return len(committed) > 0

    options = timing.TimingOptions(
        min_samples=3, max_samples=3, max_seconds=2.0, chain_links=2
    )
    summary = campaign.time_chains(
        bricks,
        SETTINGS,
        options,
        on_result=lambda key, result: committed.append(key),
        stop=stop,
        check_settings=CHECKED,
    )
    assert summary.stopped
    # Without `between`, chains go two at a time (prepared together): the
    # first pair is committed, nothing after it.
    assert committed == [b.key for b in bricks[: 2 * campaign.PAIR]]
    assert summary.timed == tuple(committed)


class _FailsInGraph(keras.layers.Layer):
    """Builds on symbolic inputs; its trace in a chain raises."""

    def compute_output_spec(self, x):
        return keras.KerasTensor(x.shape, x.dtype)

    def call(self, x):
        raise ValueError("this layer runs in no graph")


def test_a_lone_chain_is_cut_in_two_halves_prepared_together():
    pairs = [(str(i), None) for i in range(2 * campaign.HALF_CHAIN_FROM)]
    assert campaign.paired([pairs]) == [
        pairs[: len(pairs) // 2],
        pairs[len(pairs) // 2 :],
    ]
    # Too short to halve, or a group of several chains: as it is.
    assert campaign.paired([pairs[:-1]]) == [pairs[:-1]]
    assert campaign.paired([pairs, pairs]) == [pairs, pairs]


def test_chains_prepared_together_are_ready_and_keep_their_errors():
    _, suite = _bricks(models.residual()[0])
    built = [(e.signature, e.brick.build(1)) for e in suite.entries]
    chains = [
        chain.ChainTimer(built[i : i + 2], SETTINGS, check_settings=CHECKED)
        for i in range(0, len(built), 2)
    ]
    x = keras.Input((4,))
    bad = chain.ChainTimer(
        [("bad", keras.Model(x, _FailsInGraph()(x)))],
        SETTINGS,
        check_settings=CHECKED,
    )
    chain.prepare_together([chains[0], bad, *chains[1:]])
    assert all(c.prepared and c.prepare_seconds > 0 for c in chains)
    assert not bad.prepared
    with pytest.raises(ValueError, match="no graph"):
        bad.sample()  # The error its trace met, raised where it samples.
    for c in chains:  # Prepared: each sample is one more of every link.
        c.sample()
        assert c.sample_count == 1
        assert all(len(c.samples(i)) == 1 for i in range(len(c)))


def test_shuffled_order_is_a_seeded_permutation():
    bricks = [campaign.ChainedBrick(str(i), lambda: None) for i in range(20)]
    a = campaign.ordered(bricks, "shuffled", seed=1)
    assert sorted(b.key for b in a) == sorted(b.key for b in bricks)
    assert a == campaign.ordered(bricks, "shuffled", seed=1)
    assert a != bricks
    assert campaign.ordered(bricks, "model") == bricks
    with pytest.raises(ValueError, match="order"):
        campaign.ordered(bricks, "random")


def test_chain_inputs_are_placeholders_so_weightless_bricks_run():
    # A ReLU brick has no weights: were its input a constant, grappler
    # would fold it away and its link would time nothing but the stamps.
    x = keras.Input((128, 128, 16))
    relu = keras.Model(x, keras.layers.ReLU()(x))
    timer = chain.ChainTimer([("relu", relu)], SETTINGS, check_settings=False)
    for _ in range(6):
        timer.sample()
    raw = sorted(timer._samples[0])
    assert raw[len(raw) // 2] > timer.link_ms


def test_a_brick_is_fed_the_output_of_the_brick_before_where_it_fits():
    # Dense(8) -> ReLU -> Dense(4) -> an int input: the ReLU reads the
    # Dense output, the second Dense the ReLU's; an integer input never.
    x = keras.Input((8,))
    dense = keras.Model(x, keras.layers.Dense(8)(x))
    relu = keras.Model(x, keras.layers.ReLU()(x))
    small = keras.Model(x, keras.layers.Dense(4)(x))
    ids = keras.Input((4,), dtype="int32")
    embed = keras.Model(ids, keras.layers.Embedding(10, 3)(ids))
    bricks = [("d", dense), ("r", relu), ("s", small), ("e", embed)]
    specs = [[((1, 8), "float32")]] * 3 + [[((1, 4), "int32")]]
    plan = chain_graph.feed_plan([m for _, m in bricks], specs)
    assert plan == [[None], [0], [0], [None]]
    timer = chain.ChainTimer(bricks, SETTINGS, check_settings=False)
    assert timer.fed_inputs == 2
    # Synthetic inputs only for what is not fed, plus the empty links'.
    assert len(timer._inputs) == 3
    for _ in range(4):
        timer.sample()
    assert all(timer.result(i, noisy=False).median_ms >= 0 for i in range(4))
    unfed = chain.ChainTimer(bricks, SETTINGS, check_settings=False, feed=False)
    assert unfed.fed_inputs == 0 and len(unfed._inputs) == 5


def test_time_suite_in_chains_stores_skips_and_keeps_protocols_apart(
    tmp_path,
):
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.running import bench
    from dlbricks_tf.storing.store import Store

    d, suite = _bricks(models.residual()[0], granularity=2)
    fp = system_fingerprint()
    loop = settings_lib.RunSettings(
        1, 1, 1, onednn=SETTINGS.onednn, protocol="loop"
    )
    with Store(tmp_path / "s.sqlite") as store:
        first = bench.time_suite(
            suite, store, SETTINGS, fp, FAST, check_settings=CHECKED
        )
        assert set(first.timed) == set(suite.signatures)
        again = bench.time_suite(
            suite, store, SETTINGS, fp, FAST, check_settings=CHECKED
        )
        # Only what was flagged noisy is timed again.
        assert set(again.timed) == set(first.noisy)
        assert set(again.skipped) == set(first.timed) - set(first.noisy)
        # Chain results never stand in for loop ones, nor the reverse.
        assert set(store.missing(suite.signatures, loop, fp)) == set(
            suite.signatures
        )
        chained = store.results(SETTINGS, fp)
    est = estimate_lib.estimate(d, chained, "sequential")
    assert 0 < est.ms < float("inf")


def test_a_killed_chain_loses_only_its_own_samples(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import textwrap

    from dlbricks_tf.storing.store import Store

    db = tmp_path / "s.sqlite"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {root!r})
        from dlbricks_tf.machine import settings as settings_lib
        from dlbricks_tf.machine import process as process_lib
        process_lib.configure_threads(1, 1)
        import dlbricks_tf
        from dlbricks_tf.running import bench
        from dlbricks_tf.measuring import timing
        from dlbricks_tf.cutting import suite
        from dlbricks_tf.machine.fingerprint import system_fingerprint
        from dlbricks_tf.storing.store import Store
        from tests import models
        d = dlbricks_tf.decompose(models.residual()[0], granularity=1)
        s = suite.build_suite({{"m": d}})
        settings = settings_lib.RunSettings(
            1, 1, 1, onednn=process_lib.onednn_enabled())
        options = timing.TimingOptions(
            min_samples=3, max_samples=3, chain_links=2)
        n = []
        def killed(signature, result):
            n.append(signature)
            if len(n) == 2:  # The first chain is committed: die.
                print("COMMITTED", len(s), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        with Store({str(db)!r}) as store:
            bench.time_suite(s, store, settings, system_fingerprint(),
                             options, on_result=killed)
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert run.returncode == -signal.SIGKILL, run.stderr[-2000:]
    assert "COMMITTED" in run.stdout
    total = int(run.stdout.split()[-1])
    assert total > 2
    with Store(db) as store:
        stored = store.rows("brick")
    # The kill came after the first chain's second commit: both rows of
    # that chain are there, nothing of the next chain.
    assert len(stored) == 2


def test_a_brick_that_cannot_be_built_or_traced_is_recorded_not_fatal(
    tmp_path,
):
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.running import bench
    from dlbricks_tf.storing.store import Store

    _, suite = _bricks(models.residual()[0])
    signatures = suite.signatures
    unbuildable, untraceable = signatures[1], signatures[-1]

    def build(entry):
        if entry.signature == unbuildable:
            raise ValueError("this brick's file is corrupt")
        if entry.signature == untraceable:
            # Builds, but its graph cannot run in a chain: an input of
            # open shape.
            x = keras.Input((None, 3))
            return keras.Model(x, keras.layers.ReLU()(x))
        return entry.brick.build(1)

    fp = system_fingerprint()
    with Store(tmp_path / "s.sqlite") as store:
        summary = bench.time_suite(
            suite,
            store,
            SETTINGS,
            fp,
            FAST,
            check_settings=CHECKED,
            build=build,
        )
        failures = store.failures(SETTINGS, fp)
        stored = store.results(SETTINGS, fp, accept_noisy=True)
    assert {s for s, _ in summary.failed} == {unbuildable, untraceable}
    assert set(failures) == {unbuildable, untraceable}
    assert "corrupt" in failures[unbuildable]
    assert set(summary.timed) == set(signatures) - {unbuildable, untraceable}
    assert set(stored) == set(summary.timed)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
