"""Tests for dlbricks_tf/measuring/ort_timing.py, and for explicit TF id bounds.

Real ONNX Runtime sessions on small converted models; no test asserts a
speed. The protocol is checked by counting: ORT's own profiler records one
`model_run` event per `Run`, which must match the runs the timer says it
made, S x K per batch of samples.
"""

import ast
import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf
from keras import layers

import dlbricks_tf
from dlbricks_tf import errors
from dlbricks_tf.cutting import synthetic
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.measuring import ort_session, ort_timing, timing
from dlbricks_tf.storing import store
from tests import models

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORT = settings_lib.RunSettings(
    batch_size=2, intra_op_threads=1, inter_op_threads=1, backend="onnxruntime"
)
FAST = timing.TimingOptions(
    min_samples=5,
    max_samples=12,
    max_seconds=0.5,
    target_sample_ms=0.2,
    samples_per_call=4,
    warmup_calls=1,
)


def _run_python(script: str, env: dict | None = None):
    """Runs `script` in a fresh Python process (the repository on its
    path), asserts it ended well, and returns the finished process."""
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env
        or {**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


@pytest.fixture(scope="module")
def chain_onnx(tmp_path_factory):
    """models.chain() converted to ONNX, with its id bounds beside it."""
    folder = tmp_path_factory.mktemp("onnx")
    path, _ = ort_timing.convert_for_ort(models.chain()[0], folder)
    return path


@pytest.fixture(scope="module")
def multi_io_onnx(tmp_path_factory):
    """models.multi_io() (float, int ids < 20, bool mask) as ONNX."""
    folder = tmp_path_factory.mktemp("onnx")
    path, bounds = ort_timing.convert_for_ort(models.multi_io()[0], folder)
    return path, bounds


def test_session_uses_the_requested_threads(chain_onnx):
    settings = settings_lib.RunSettings(
        batch_size=1,
        intra_op_threads=2,
        inter_op_threads=3,
        backend="onnxruntime",
    )
    session = ort_session.session_for(chain_onnx, settings)
    options = session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 3
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert (
        options.graph_optimization_level
        == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    assert session.get_providers() == ["CPUExecutionProvider"]
    # Pools of its own, whose threads stop spinning when a run ends.
    assert options.use_per_session_threads
    stop = ort_session.SPINNING_STOP
    assert options.get_session_config_entry(stop) == "1"
    assert options.get_session_config_entry(ort_session.DENORMAL_AS_ZERO) == "1"
    one = ort_session.session_options(ort, 1, 1)
    with pytest.raises(RuntimeError, match="does not have"):
        one.get_session_config_entry(stop)  # No pool thread to stop.


def test_session_config_entries_reach_every_session(chain_onnx):
    spinning = "session.intra_op.allow_spinning"
    timer = ort_timing.OrtTimer(
        chain_onnx,
        ORT,
        dataclasses.replace(FAST, weight_copies=2),
        session_config={spinning: "0"},
    )
    assert len(timer.sessions) == 2
    for session in timer.sessions:
        options = session.get_session_options()
        assert options.get_session_config_entry(spinning) == "0"


def test_arrays_for_specs_respect_bounds_and_dtypes():
    specs = [
        ((5,), "int32"),
        ((2, 3), "int64"),
        ((4,), "bool"),
        ((3,), "float32"),
        ((3,), "float16"),
        ((6,), "uint8"),
    ]
    bounds = [7, None, None, 100, None, 1000]
    arrays = synthetic.arrays_for_specs(specs, bounds, 4, seed=3)
    assert [a.shape for a in arrays] == [
        (4, 5),
        (4, 2, 3),
        (4, 4),
        (4, 3),
        (4, 3),
        (4, 6),
    ]
    assert [a.dtype.name for a in arrays] == [d for _, d in specs]
    ids, small, mask, floats, halves, bytes_ = arrays
    assert 0 <= ids.min() and ids.max() < 7
    assert 0 <= small.min() and small.max() < synthetic.SMALL_INT_HIGH
    assert set(np.unique(mask)) <= {False, True}
    assert floats.min() < 0 < floats.max()  # A bound on floats is ignored.
    assert np.isfinite(halves).all()
    assert bytes_.max() <= 255
    again = synthetic.arrays_for_specs(specs, bounds, 4, seed=3)
    for a, b in zip(arrays, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_arrays_for_specs_equal_synthetic_inputs_of_the_model():
    model = models.multi_io()[0]
    specs = [(tuple(t.shape[1:]), str(t.dtype)) for t in model.inputs]
    bounds = synthetic.id_bounds(model)
    assert 20 in bounds
    got = synthetic.arrays_for_specs(specs, bounds, 3, seed=5)
    want = synthetic.synthetic_inputs(model, 3, seed=5)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "bounds, match",
    [([3], "one bound"), ([0, None], "positive"), ([2.5, None], "positive")],
)
def test_arrays_for_specs_refuse_bad_bounds(bounds, match):
    specs = [((2,), "int32"), ((2,), "float32")]
    with pytest.raises(ValueError, match=match):
        synthetic.arrays_for_specs(specs, bounds, 1)


def _check(t, options=FAST):
    values = (t.min_ms, t.median_ms, t.trimmed_mean_ms, t.max_ms)
    assert all(math.isfinite(v) for v in values)
    assert t.median_ms > 0
    assert t.min_ms <= t.median_ms <= t.max_ms
    assert t.min_ms <= t.trimmed_mean_ms <= t.max_ms
    assert t.ci_low_ms <= t.median_ms <= t.ci_high_ms
    assert 1 <= t.samples <= options.max_samples
    if not t.noisy:
        assert t.samples >= options.min_samples
    assert 1 <= t.calls_per_sample <= options.max_calls_per_sample


def test_ort_timer_gives_a_consistent_timing(chain_onnx):
    timer = ort_timing.OrtTimer(chain_onnx, ORT, FAST)
    [t] = timing.time_interleaved([timer])
    _check(t)
    assert t.calls_per_sample == timer.calls_per_sample
    assert len(timer.samples) == t.samples
    # The calibrated Run overhead is what was subtracted.
    assert t.dispatch_ms > 0
    assert t.loop_overhead_ms == t.dispatch_ms == timer.overhead_per_call_ms
    assert timer.inputs[0][0].shape == (2, 16, 16, 3)


def test_no_subtraction_when_asked(chain_onnx):
    options = dataclasses.replace(FAST, subtract_loop_overhead=False)
    t = ort_timing.time_onnx(chain_onnx, ORT, options)
    assert t.loop_overhead_ms == 0 and t.dispatch_ms > 0


@pytest.mark.parametrize("copies", [1, 2])
def test_each_sample_makes_k_runs(tmp_path, chain_onnx, copies):
    options = dataclasses.replace(
        FAST,
        max_calls_per_sample=6,
        samples_per_call=3,
        input_copies=copies,
        weight_copies=copies,
    )
    timer = ort_timing.OrtTimer(
        chain_onnx, ORT, options, profile_prefix=str(tmp_path / "profile")
    )
    timer.sample()  # Warm-up, calibration, then one batch.
    k, s = timer.calls_per_sample, timer.samples_per_call
    assert 1 <= k <= 6 and k % copies == 0 and s == 3
    before = timer.runs
    assert len(timer.sample()) == s
    assert timer.runs - before == s * k
    # ORT's profiler counts one model_run per Run: the loop made them all,
    # spread evenly over the weight copies (sessions).
    traces = [session.end_profiling() for session in timer.sessions]
    # Each copy profiles into a file of its own (ORT names them to the
    # millisecond: one prefix could give two sessions one file).
    assert len(set(traces)) == copies
    counts = []
    for trace in traces:
        with open(trace) as f:
            events = json.load(f)
        counts.append(sum(e.get("name") == "model_run" for e in events))
    assert sum(counts) == timer.runs
    assert len(set(counts)) == 1


def test_ort_timers_interleave_with_tf_timers(chain_onnx):
    model = models.chain()[0]
    tf_settings = settings_lib.RunSettings(
        batch_size=2, intra_op_threads=1, inter_op_threads=1
    )
    tf_timer = timing.Timer(model, tf_settings, FAST, check_settings=False)
    ort_timer = ort_timing.OrtTimer(chain_onnx, ORT, FAST)
    results = timing.time_interleaved([ort_timer, tf_timer])
    for t in results:
        _check(t)
    assert results[0] == ort_timer.result()


def test_restart_takes_fresh_samples_of_the_same_sessions(chain_onnx):
    options = dataclasses.replace(
        FAST, precision=-1.0, absolute_precision_ms=-1.0, max_samples=4,
        max_seconds=60.0,
    )  # fmt: skip
    timer = ort_timing.OrtTimer(chain_onnx, ORT, options)
    first = timing.time_interleaved([timer])[0]
    sessions, k = list(timer.sessions), timer.calls_per_sample
    prepared, runs = timer.prepare_seconds, timer.runs
    assert prepared > 0
    assert timer.restart() is timer and timer.samples == () and not timer.done
    second = timing.time_interleaved([timer])[0]
    assert first.samples == second.samples == 4
    assert timer.runs - runs == 4 * k  # Only sampling: no warm-up again.
    assert timer.sessions == sessions and timer.calls_per_sample == k
    assert timer.prepare_seconds == prepared  # Not prepared again.


def test_keras_brick_on_ort_records_its_id_bounds(tmp_path):
    d = dlbricks_tf.decompose(models.multi_io()[0], granularity=2)
    brick = next(b for b in d.bricks if "embedding" in " ".join(b.layers))
    built = brick.build(None)
    t = ort_timing.time_keras_model_on_ort(built, ORT, FAST, tmp_path)
    _check(t)
    onnx_files = list(tmp_path.glob("*.onnx"))
    assert len(onnx_files) == 1
    assert ort_timing.load_id_bounds(onnx_files[0]) == [20]


def test_explicit_id_bounds_on_ort(multi_io_onnx):
    path, bounds = multi_io_onnx
    assert bounds == [None, 20, None]
    timer = ort_timing.OrtTimer(path, ORT, FAST, id_bounds=[None, 3, None])
    timer.sample()
    ids = timer.inputs[0][1]
    assert ids.dtype == np.int32 and ids.max() < 3
    assert timer.inputs[0][2].dtype == np.bool_


def test_result_goes_into_the_store_and_back(tmp_path, chain_onnx):
    t = ort_timing.time_onnx(chain_onnx, ORT, FAST)
    fp = system_fingerprint()
    with store.Store(tmp_path / "s.sqlite") as s:
        s.put("sig", ORT, fp, t)
        s.put_model("chain", ORT, fp, t)
    tf_settings = dataclasses.replace(ORT, backend="tf", protocol=None)
    with store.Store(tmp_path / "s.sqlite") as s:
        assert s.get("sig", ORT, fp) == t
        assert s.get_model("chain", ORT, fp) == t
        assert s.results(ORT, fp) == {"sig": t}
        assert s.get("sig", tf_settings, fp) is None
    assert ORT.key().startswith("onnxruntime-")


class _HiddenEmbedding(layers.Layer):
    """An Embedding the graph walk cannot see (as in a TFSMLayer)."""

    def __init__(self, input_dim, **kwargs):
        super().__init__(**kwargs)
        self.inner = layers.Embedding(input_dim, 2)

    def call(self, ids):
        return self.inner(ids)


def test_tf_timer_with_explicit_id_bounds_keeps_ids_below_them():
    ids = keras.Input((6,), dtype="int32")
    model = keras.Model(ids, _HiddenEmbedding(3)(ids))
    settings = settings_lib.RunSettings(
        batch_size=4, intra_op_threads=1, inter_op_threads=1
    )
    assert synthetic.id_bounds(model) == [None]  # Hidden from the walk.
    unbounded = timing.Timer(model, settings, FAST, check_settings=False)
    assert unbounded.inputs[0][0].max() >= 3  # Out of the Embedding's range.
    with pytest.raises(tf.errors.InvalidArgumentError):
        unbounded.sample()  # An out-of-range id fails on CPU.
    options = dataclasses.replace(FAST, input_copies=2)
    timer = timing.Timer(
        model, settings, options, check_settings=False, id_bounds=[3]
    )
    assert len(timer.inputs) == 2
    for copy in timer.inputs:
        assert copy[0].shape == (4, 6) and copy[0].max() < 3
    # Runs on the bounded ids (an id >= 3 would fail the lookup). A call
    # this small may be all loop overhead: the median may be 0.
    t = timing.time_interleaved([timer])[0]
    assert 1 <= t.samples <= options.max_samples and t.median_ms >= 0
    with pytest.raises(timing.MeasurementError, match="id_bounds"):
        timing.Timer(
            model, settings, FAST, check_settings=False, id_bounds=[3, 4]
        )


def test_bad_settings_and_inputs_raise(chain_onnx):
    tf_settings = dataclasses.replace(ORT, backend="tf", protocol=None)
    with pytest.raises(timing.MeasurementError, match="backend"):
        ort_timing.OrtTimer(chain_onnx, tf_settings, FAST)
    with pytest.raises(timing.MeasurementError, match="jit_compile"):
        ort_timing.OrtTimer(
            chain_onnx,
            dataclasses.replace(ORT, jit_compile=True, protocol="loop"),
            FAST,
        )
    with pytest.raises(timing.MeasurementError, match="input_specs"):
        ort_timing.OrtTimer(
            chain_onnx, ORT, FAST, input_specs=[((16, 16, 4), "float32")]
        )
    with pytest.raises(timing.MeasurementError, match="2 input_specs"):
        ort_timing.OrtTimer(
            chain_onnx, ORT, FAST, input_specs=[((1,), "float32")] * 2
        )
    with pytest.raises(timing.MeasurementError, match="cannot load"):
        ort_timing.OrtTimer(os.path.abspath(__file__), ORT, FAST)
    with pytest.raises(timing.MeasurementError, match="sample"):
        ort_timing.OrtTimer(chain_onnx, ORT, FAST).result()
    # A model given serialised is named by `path` when ORT refuses it.
    with pytest.raises(timing.MeasurementError, match="'chain-3.onnx'"):
        ort_timing.OrtTimer("chain-3.onnx", ORT, FAST, model=b"not a model")


def test_a_timer_opens_a_serialised_model_as_its_file(chain_onnx):
    with open(chain_onnx, "rb") as f:
        model = f.read()
    timer = ort_timing.OrtTimer("in-memory.onnx", ORT, FAST, model=model)
    assert timer.name == "in-memory"
    [t] = timing.time_interleaved([timer])
    _check(t)
    assert timer.inputs[0][0].shape == (2, 16, 16, 3)


def test_missing_onnxruntime_is_a_one_line_error(tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "onnxruntime.py").write_text(
        "raise ImportError(\"No module named 'onnxruntime' (simulated)\")\n"
    )
    script = textwrap.dedent(
        """
        from dlbricks_tf import errors
        from dlbricks_tf.machine import settings
        from dlbricks_tf.measuring import ort_session, ort_timing
        s = settings.RunSettings(1, 1, 1, backend="onnxruntime")
        try:
            ort_session.session_for("missing.onnx", s)
        except ort_session.OnnxRuntimeMissingError as e:
            assert isinstance(e, errors.Error)
            assert isinstance(e, ort_timing.MeasurementError)
            print("ERROR=" + repr(str(e)))
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), REPO]),
        "TF_CPP_MIN_LOG_LEVEL": "3",
    }
    done = _run_python(script, env)
    lines = [x for x in done.stdout.splitlines() if x.startswith("ERROR=")]
    assert len(lines) == 1
    message = ast.literal_eval(lines[0][len("ERROR=") :])
    assert "\n" not in message
    assert "pip install onnxruntime" in message
    assert "--backend=tf" in message
    assert issubclass(ort_session.OnnxRuntimeMissingError, errors.Error)


def test_importing_the_ort_path_imports_no_tensorflow():
    # The timer, and the rounds benchmarks/ort_accuracy.py times it in.
    script = textwrap.dedent(
        """
        import sys
        from dlbricks_tf.measuring import ort_timing, rounds
        assert issubclass(ort_timing.MeasurementError, Exception)
        assert callable(rounds.time_in_rounds)
        print(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
        """
    )
    done = _run_python(script)
    assert done.stdout.strip() == "[]"


def test_run_overhead_is_calibrated_once_per_input_specs(chain_onnx):
    first = ort_timing.OrtTimer(chain_onnx, ORT, FAST)
    first.sample()
    again = ort_timing.OrtTimer(chain_onnx, ORT, FAST)
    again.sample()
    assert again.dispatch_ms == first.dispatch_ms > 0  # Measured once.


def test_sessions_share_one_pool_from_two_threads_on(chain_onnx):
    # In a process of its own: the shared pools stay for its life.
    script = textwrap.dedent(
        f"""
        from dlbricks_tf.machine import settings as settings_lib
        from dlbricks_tf.measuring import ort_session, ort_timing
        from dlbricks_tf.measuring.sampling import MeasurementError

        one = settings_lib.RunSettings(1, 1, 1, backend="onnxruntime")
        two = settings_lib.RunSettings(1, 2, 1, backend="onnxruntime")
        print("one", ort_session.share_threads(one))
        print("two", ort_session.share_threads(two))
        print("again", ort_session.share_threads(two))
        options = ort_session.session_options(
            ort_session.import_onnxruntime(), 2, 1
        )
        print("per-session", options.use_per_session_threads)
        timer = ort_timing.OrtTimer({str(chain_onnx)!r}, two)
        while not timer.done:
            timer.sample()
        print("timed", timer.result().median_ms > 0)
        try:
            ort_session.share_threads(
                settings_lib.RunSettings(1, 3, 1, backend="onnxruntime")
            )
        except MeasurementError as e:
            print("refused", "another process" in str(e))
        """
    )
    done = _run_python(script)
    assert done.stdout.split() == [
        "one",
        "False",
        "two",
        "True",
        "again",
        "True",
        "per-session",
        "False",
        "timed",
        "True",
        "refused",
        "True",
    ]


def test_sessions_flush_denormals_to_zero(tmp_path):
    # 1e-20 x 1e-20 is a float32 denormal (under 1.2e-38); flushed, 0.
    # In a process of its own: ONNX Runtime sets the calling thread's
    # flags from the first session a process opens.
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "y"], ["z"])],
        "denormal",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4]),
        ],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [4])],
    )
    path = tmp_path / "mul.onnx"
    onnx.save(
        helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8
        ),
        str(path),
    )
    script = textwrap.dedent(
        f"""
        import numpy as np
        from dlbricks_tf.machine import settings as settings_lib
        from dlbricks_tf.measuring import ort_session

        x = np.full(4, 1e-20, np.float32)
        print(float((x * x).max()) > 0)  # Kept before any session.
        one = settings_lib.RunSettings(1, 1, 1, backend="onnxruntime")
        session = ort_session.session_for({str(path)!r}, one)
        entry = session.get_session_options().get_session_config_entry(
            ort_session.DENORMAL_AS_ZERO
        )
        (z,) = session.run(None, {{"x": x, "y": x}})
        print(entry, float(np.abs(z).max()))
        """
    )
    done = _run_python(script)
    assert done.stdout.split() == ["True", "1", "0.0"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
