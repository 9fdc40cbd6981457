"""Tests of dlbricks_tf/running/budget.py: a brick campaign within a budget.

The campaign runs for real on a corpus of more bricks than its budget can
time (a stack of dense layers of distinct widths) beside a small model;
only whether it stopped before every brick and the shape of its rows are
checked, never a wall-clock bound. The score, and the rows of a model
with predicted bricks, are checked on planted numbers.
"""

import collections
import json
import math
import sqlite3
import subprocess
import sys

import keras
import pytest

import dlbricks_tf
from dlbricks_tf.estimating import predict, ranges, rows
from dlbricks_tf.measuring import sampling
from dlbricks_tf.running import budget
from dlbricks_tf.stats import Timing
from tests import models
from tests.cli import FAST, dlbricks

# Layers of the stack: far more bricks than a budget of seconds times (a
# chain of 32 of them, its trace and the predictor's fits come first).
LAYERS = 150
FAST_OPTIONS = sampling.TimingOptions(
    min_samples=3, max_samples=5, max_seconds=0.2, target_sample_ms=0.5
)


def _stack() -> keras.Model:
    x = inp = keras.Input((8,), name="features")
    for i in range(LAYERS):
        x = keras.layers.Dense(8 + i, activation="relu")(x)
    return keras.Model(inp, x, name="stack")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models")
    paths = {"stack": str(folder / "stack.keras")}
    _stack().save(paths["stack"])
    paths["chain"] = str(folder / "chain.keras")
    models.chain()[0].save(paths["chain"])
    return paths


def _predictor(low: float, high: float) -> predict.Predictor:
    """A predictor whose cross-validated interval is [low, high] (log)."""
    cv = predict.CrossValidation(
        folds=2,
        grouped=False,
        bricks=10,
        median_error=0.1,
        within_10pct=0.5,
        low=low,
        high=high,
        model_low=low,
        model_high=high,
    )
    return predict.Predictor(None, "kinds", cv)


def _python(code: str) -> subprocess.CompletedProcess:
    """`code` run by a Python process of its own (the thread pools of a
    test process are fixed once), its output captured."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
    )


def test_the_score_favours_a_large_share_of_an_open_model_per_second():
    estimates = {"small": 2.0, "large": 200.0}
    # 1 ms is half of the small model, 10 ms a twentieth of the large one.
    small = budget.score(1.0, [("small", 1)], estimates, 0.3, 0.05)
    large = budget.score(10.0, [("large", 1)], estimates, 0.3, 0.05)
    assert small > large > 0
    # A model already within +-10% (absent from the estimates) gains nothing.
    assert budget.score(1.0, [("done", 3)], estimates, 0.3, 0.05) == 0
    # Twice the cost, half the score; twice the occurrences, twice.
    assert budget.score(1.0, [("small", 1)], estimates, 0.3, 0.1) == (
        pytest.approx(small / 2)
    )
    assert budget.score(1.0, [("small", 2)], estimates, 0.3, 0.05) == (
        pytest.approx(2 * small)
    )
    options = FAST_OPTIONS
    assert budget.cost_s(0.0, options) == budget.SETUP_S
    assert budget.cost_s(10.0, options) > budget.cost_s(1.0, options)
    assert budget.relative_half(_predictor(-0.2, 0.4)) == pytest.approx(
        math.exp(0.4) - 1
    )


def test_a_row_with_predicted_bricks_says_so_and_holds_the_predictors_error():
    d = dlbricks_tf.decompose(models.chain()[0], 1)
    counts = collections.Counter(b.signature for b in d.bricks)
    signatures = list(counts)
    timed = {
        s: Timing(1.0, 1.0, 1.0, 1.0, 10, 0.99, 1.01, False)
        for s in signatures[1:]
    }
    predictor = _predictor(-0.5, 0.5)
    guessed = {signatures[0]: predictor.timing(20.0)}
    settings, _ = models.settings()
    measured = Timing(25.0, 25.0, 25.0, 25.0, 10, 24.9, 25.1, False)
    row = rows.model_row(
        "chain", 1, settings, measured, timed, d, predicted=guessed
    )
    assert row["method"] == "predicted"
    assert row["predicted_bricks"] == 1
    share = 20.0 * counts[signatures[0]] / row["estimated_ms"]
    assert row["predicted_share"] == pytest.approx(share)
    assert row["estimated_low_ms"] < row["estimated_ms"]
    assert row["estimated_high_ms"] > row["estimated_ms"]
    assert row["range_half"] > ranges.PROMISE
    assert row["range_flag"].startswith("predicted: ")
    # Every brick timed: the row is as it always was.
    plain = rows.model_row("chain", 1, settings, measured, timed, d)
    assert "predicted_share" not in plain and math.isnan(plain["estimated_ms"])


def test_a_round_samples_to_a_quarter_of_the_ranges_variance():
    full = sampling.TimingOptions(precision=0.02, min_samples=7)
    rounds = budget.round_options(full)
    # Half of +-10% in width: a quarter of its variance.
    assert rounds.precision == pytest.approx(ranges.PROMISE / 2)
    assert rounds.min_samples == 7 and rounds.max_seconds == full.max_seconds
    looser = sampling.TimingOptions(precision=0.08)
    assert budget.round_options(looser).precision == 0.08


def test_a_round_times_each_chosen_brick_after_the_bricks_before_it():
    # The chains' order: a0 a1 a2 a3 of one model, then b0 b1 of another.
    order = ["a0", "a1", "a2", "a3", "b0", "b1"]
    position = {s: i for i, s in enumerate(order)}
    costs = dict.fromkeys(order, 1.0)
    # a0 is timed already (not ranked); a3 and b1 are the best.
    ranked = ["a3", "b1", "a2", "a1", "b0"]
    assert budget.LEAD_IN == 2

    def round_of(left_s: float, most: int) -> list[str]:
        return budget.round_bricks(ranked, costs, left_s, position, most)

    # a3 after a1 and a2, b1 after b0 (a3, two before b1, is in the round
    # already), in the chains' order; a2, a1 and b0 were led in, so
    # nothing is chosen twice.
    assert round_of(100.0, 128) == ["a1", "a2", "a3", "b0", "b1"]
    # A lead-in's cost counts: a3 and its two lead-ins fit 3 s, b1 and b0
    # do not fit what is left; the first group is always taken.
    first = ["a1", "a2", "a3"]
    assert round_of(4.0, 128) == first
    assert round_of(0.5, 128) == first
    # A chain holds at most `most` links; one too short for every lead-in
    # keeps the nearest, or none.
    assert round_of(100.0, 4) == first
    assert round_of(100.0, 2) == ["a2", "a3"]
    assert round_of(100.0, 1) == ["a3"]
    # A brick at the start of the order has no lead-in.
    assert budget.round_bricks(["a0"], costs, 1.0, position, 128) == ["a0"]


def test_a_corrected_prediction_carries_its_kinds_error_not_the_cvs():
    d = dlbricks_tf.decompose(models.chain()[0], 1)
    counts = collections.Counter(b.signature for b in d.bricks)
    first, *rest = list(counts)
    timed = {s: Timing(1.0, 1.0, 1.0, 1.0, 10, 0.9, 1.1, False) for s in rest}
    settings, _ = models.settings()
    measured = Timing(25.0, 25.0, 25.0, 25.0, 10, 24.9, 25.1, False)
    # Predicted at 20 ms: its own residual +-2 ms, its kind's factor 1 ms.
    guessed = {first: budget.corrected_timing(20.0, 2.0)}
    assert guessed[first].center_half_ms == pytest.approx(2.0)
    assert guessed[first].ci_low_ms == pytest.approx(20.0 * 20.0 / 22.0)
    row = rows.model_row(
        "chain",
        1,
        settings,
        measured,
        timed,
        d,
        predicted=guessed,
        shared={first: ("dense", 1.0)},
    )
    n = counts[first]
    own = sum((counts[s] * 0.1) ** 2 for s in rest) + (n * 2.0) ** 2
    assert row["estimate_precision"] == pytest.approx(
        math.sqrt(own + (n * 1.0) ** 2) / row["estimated_ms"]
    )
    assert row["method"] == "predicted"


def test_run_within_a_budget_stops_and_predicts_the_rest(files, tmp_path):
    out = tmp_path / "out"
    proc = dlbricks(
        "run",
        f"--models={files['stack']},{files['chain']}",
        "--budget=3",
        "--probe_count=2",
        f"--db={tmp_path / 's.sqlite'}",
        f"--out={out}",
        "--graphs=0",
        *FAST,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    (corpus,) = report["corpus"]
    assert corpus["budget_s"] == 3
    # It stopped before every brick: the rest was predicted.
    assert 0 <= corpus["bricks_timed"] < corpus["unique_bricks"]
    assert corpus["bricks_predicted"] == (
        corpus["unique_bricks"] - corpus["bricks_timed"]
    )
    assert corpus["probes_s"] > 0  # The store lacked them: timed first.
    assert corpus["budget_stopped"] in (budget.SPENT, budget.PRECISE)
    assert {r["model"] for r in report["runs"]} == {"stack", "chain"}
    stack = next(r for r in report["runs"] if r["model"] == "stack")
    assert stack["predicted_share"] > 0 and stack["predicted_bricks"] > 0
    for row in report["runs"]:
        assert 0 <= row["predicted_share"] <= 1
        assert math.isfinite(row["estimated_ms"]) and row["estimated_ms"] > 0
        assert math.isfinite(row["measured_ms"]) and row["measured_ms"] > 0
        low, high = row["estimated_low_ms"], row["estimated_high_ms"]
        assert 0 <= low <= row["estimated_ms"] <= high
    assert "budget s (spent)" in proc.stdout
    assert "% predicted" in proc.stdout
    # The bricks it timed correct the predictions of the rest, per kind.
    timed = corpus["bricks_timed"]
    assert f"predictions corrected by {timed} timed brick(s)" in (
        proc.stdout + proc.stderr
    )


def test_the_python_api_runs_within_a_budget(files, tmp_path):
    code = f"""
import dlbricks_tf
settings = dlbricks_tf.configure(intra_op_threads=1, inter_op_threads=1)
results = dlbricks_tf.run(
    [{str(files["stack"])!r}, {str(files["chain"])!r}],
    db={str(tmp_path / "s.sqlite")!r}, settings=settings,
    budget_s=3, probe_count=2)
for r in results:
    print(r.model, r.predicted_share, r.low_ms, r.estimated_ms, r.high_ms)
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()]
    shares = {row[0]: float(row[1]) for row in lines}
    assert set(shares) == {"stack", "chain"}
    assert shares["stack"] > 0 and all(0 <= v <= 1 for v in shares.values())
    for _, _, low, est, high in lines:
        assert 0 <= float(low) <= float(est) <= float(high)


def test_a_rounds_cost_is_fitted_as_a_part_per_round_and_one_per_brick():
    # 0.4 s a round and 0.05 s a brick: rounds of 2 and 10 bricks.
    fixed, setup = budget.round_costs([(2, 0.5), (10, 0.9)])
    assert fixed == pytest.approx(0.4)
    assert setup == pytest.approx(0.05)
    # Rounds of one size cannot tell the parts apart: all per brick.
    assert budget.round_costs([(3, 0.3), (3, 0.6)]) == (
        0.0,
        pytest.approx(0.15),
    )
    # A brick costs its setup at least, whatever the rounds say.
    fixed, setup = budget.round_costs([(2, 0.5), (10, 0.5)])
    assert setup == budget.SETUP_S
    assert fixed == pytest.approx(0.5 - 6 * budget.SETUP_S)
    assert budget.round_costs([]) == (0.0, budget.SETUP_S)


def test_a_round_runs_beside_other_work_and_does_not_count_it(files, tmp_path):
    # `run` spreads a campaign's rounds over its models: their batches go
    # between a round's chain passes, their seconds are not the budget's,
    # and a model's rounds time its own bricks.
    code = f"""
import time
import dlbricks_tf
from dlbricks_tf.cutting import suite as suite_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import sampling
from dlbricks_tf.running import budget
from dlbricks_tf.estimating import ranges
from dlbricks_tf.storing.store import Store
# No range is ever within the promise, so no round ends the campaign as
# precise: whether a few samples would is chance, not what this tests.
ranges.PROMISE = 0.0
settings = dlbricks_tf.configure(intra_op_threads=1, inter_op_threads=1)
stack = dlbricks_tf.decompose({files["stack"]!r}, 1)
suite = suite_lib.build_suite({{"stack": stack}})
options = sampling.TimingOptions(
    min_samples=3, max_samples=5, max_seconds=0.2, target_sample_ms=0.5)
slept = []
def between():
    time.sleep(0.02)
    slept.append(0.02)
with Store({str(tmp_path / "s.sqlite")!r}) as store:
    campaign = budget.Campaign(
        suite, store, settings, system_fingerprint(), options,
        budget_s=60, granularity=1, probe_count=2)
    start = time.perf_counter()
    went_on = campaign.round(until_s=1e-6, between=between)
    wall = time.perf_counter() - start
    spent = campaign.elapsed()
    first = len(campaign.timed)
    # A round among some bricks (a model's own) chooses among them only.
    only = [s for s in suite.signatures if s not in campaign.timings][-1]
    among = campaign.round(until_s=1e-6, among=[only])
    chose = campaign.timed[first:] == [only]
    # Nothing left among them: no round, and the campaign goes on.
    none_left = campaign.round(among=[only])
    summary = campaign.summary()
print(went_on, len(slept), sum(slept), wall, spent, first, summary.stopped,
      among, chose, none_left)
"""
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    (
        went_on,
        calls,
        slept,
        wall,
        spent,
        first,
        stopped,
        among,
        chose,
        none_left,
    ) = proc.stdout.split()
    assert went_on == "True"
    assert int(calls) >= 1  # Between the round's passes.
    # The round's own seconds only: what `between` took is not counted.
    assert 0 < float(spent) <= float(wall) - float(slept)
    # A round sized to no time left takes its first group: one brick and
    # its lead-ins.
    assert 1 <= int(first) <= 1 + budget.LEAD_IN
    assert stopped == budget.SPENT  # Not over: the caller stopped.
    # A round among a model's own bricks times one of them only; with
    # none of them left it times nothing and the campaign goes on.
    assert (among, chose, none_left) == ("True", "True", "False")


def test_bench_within_a_budget_stores_some_bricks(files, tmp_path):
    from dlbricks_tf.storing.store import Store

    db = tmp_path / "s.sqlite"
    proc = dlbricks(
        "bench",
        f"--models={files['stack']}",
        "--budget=2",
        "--probe_count=2",
        f"--db={db}",
        f"--out={tmp_path / 'out'}",
        *FAST,
    )
    assert proc.returncode == 0, proc.stderr
    assert "predicted" in proc.stdout
    stack = {
        b.signature for b in dlbricks_tf.decompose(files["stack"], 1).bricks
    }
    assert len(stack) == LAYERS
    with Store(db) as store:
        stored = {r["signature"] for r in store.rows("brick")}
    # Some of the stack's bricks at most, and the probes'.
    assert len(stored & stack) < LAYERS
    assert stored - stack


def test_bench_probes_keeps_the_predictor_a_budget_reads_back(files, tmp_path):
    db = tmp_path / "s.sqlite"
    proc = dlbricks("bench", "--probes", "--probe_count=2", f"--db={db}", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "Predictor of the store's" in proc.stdout
    with sqlite3.connect(db) as connection:
        (kept,) = connection.execute(
            "SELECT COUNT(*) FROM predictors"
        ).fetchone()
        ((cut,),) = connection.execute(
            "SELECT value FROM meta WHERE key LIKE 'probe_suite:%'"
        ).fetchall()
        stored = {
            r[0]
            for r in connection.execute("SELECT signature FROM brick_results")
        }
    assert kept == 1
    # What the probes cut into is kept: every brick of it is stored.
    assert json.loads(cut) and set(json.loads(cut)) <= stored
    out = tmp_path / "out"
    proc = dlbricks(
        "run",
        f"--models={files['stack']}",
        "--budget=3",
        "--probe_count=2",
        f"--db={db}",
        f"--out={out}",
        "--graphs=0",
        *FAST,
    )
    assert proc.returncode == 0, proc.stderr
    # Read back, not fitted again; its seconds apart from the budget's.
    assert "described bricks, kept in the store" in proc.stdout + proc.stderr
    # The probes are all stored: not cut again to see it.
    assert "the probes' bricks are all stored" in proc.stdout + proc.stderr
    (corpus,) = json.loads((out / "report.json").read_text())["corpus"]
    assert corpus["first_fit_s"] >= 0
    assert corpus["probes_s"] >= 0
    assert "probes s + first fit s" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["run", "--budget=0"], "--budget must be more than 0"),
        (["run", "--budget=-5"], "--budget must be more than 0"),
        (["run", "--budget=5", "--retime"], "--retime"),
        (["bench", "--budget=5", "--probes"], "--probes"),
        (["bench", "--budget=5", "--suite=x"], "--suite"),
        (["bench", "--budget=5", "--num_shards=2"], "--num_shards"),
        (["run", "--budget=5", "--backend=onnxruntime"], "TensorFlow only"),
        (["measure", "--budget=5"], "measure does not use --budget"),
        (["estimate", "--probe_count=3"], "does not use --probe_count"),
    ],
)
def test_a_budget_it_cannot_take_is_refused_in_one_line(args, message):
    proc = dlbricks(*args)
    assert proc.returncode == 2, proc.stdout
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert message in proc.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
