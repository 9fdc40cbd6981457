"""Tests of dlbricks_tf/measuring/ort_chain.py: a chain timed and split.

Real tf2onnx conversions of a small model's bricks and real ONNX Runtime
sessions, profiled; the checks are sums and counts, no test asserts a
speed.
"""

import dataclasses
import functools
import math

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest

import dlbricks_tf
from dlbricks_tf.measuring import (
    brick_timing,
    ort_chain,
    ort_chain_graph,
    sampling,
)
from tests import models

ORT = models.ort_settings("loop")
FAST = models.ORT_FAST


@pytest.fixture(scope="module")
def bricks(tmp_path_factory):
    """models.residual()'s unique G=1 bricks as files, in model order."""
    folder = tmp_path_factory.mktemp("onnx")
    model, _ = models.residual()
    d = dlbricks_tf.decompose(model, 1)
    files = {}
    for b in d.bricks:
        if b.signature not in files:
            files[b.signature] = brick_timing.brick_onnx_file(
                b.build, folder, b.signature, 1
            ).path
    return list(files.values())


def _event(name, ts, dur=1, cat="Node", op=None):
    event = {"cat": cat, "name": name, "ts": ts, "dur": dur}
    if op is not None:
        event["args"] = {"op_name": op}
    return event


def test_op_kernel_times_sum_each_op_per_run_and_brick():
    events = [
        _event("model_run", 0, 100, cat="Session"),
        _event("brick0/a_kernel_time", 1, 50, op="Conv"),  # Warm-up.
        _event("model_run", 200, 100, cat="Session"),
        _event("brick0/a_kernel_time", 201, 10, op="Conv"),
        _event("brick1/b_kernel_time", 212, 20, op="Conv"),
        _event("ReorderOutput_token_3_kernel_time", 240, 4, op="Reorder"),
        _event("model_run", 400, 100, cat="Session"),
        _event("brick0/a_kernel_time", 401, 12, op="Conv"),
        _event("brick1/b_kernel_time", 414, 22, op="Conv"),
        _event("ReorderOutput_token_3_kernel_time", 446, 2, op="Reorder"),
    ]
    by_brick = ort_chain.op_kernel_times(
        events, skip_runs=1, owner=ort_chain_graph.brick_of
    )
    assert by_brick == {
        (0, "Conv"): 11.0,
        (1, "Conv"): 21.0,
        (None, "Reorder"): 3.0,
    }
    whole = ort_chain.op_kernel_times(events, skip_runs=1)
    assert whole == {(None, "Conv"): 32.0, (None, "Reorder"): 3.0}
    with pytest.raises(sampling.MeasurementError, match="warm-up"):
        ort_chain.op_kernel_times(events, skip_runs=3)


def test_kernel_times_count_runs_after_the_warm_up():
    events = [
        _event("model_run", 0, 100, cat="Session"),
        _event("brick0/a_kernel_time", 1, 50),  # Warm-up: left out.
        _event("model_run", 200, 100, cat="Session"),
        _event("brick0/a_kernel_time", 201, 10),
        _event("fused brick1/b_kernel_time", 212, 20),
        _event("brick1/c:0_nchwc_kernel_time", 233, 6),
        _event("ReorderOutput_token_3_kernel_time", 240, 4),
        _event("brick1/c_fence_before", 232, 1),  # Not a kernel.
        _event("model_run", 400, 100, cat="Session"),
        _event("brick0/a_kernel_time", 401, 12),
        _event("fused brick1/b_kernel_time", 414, 22),
        _event("brick1/c:0_nchwc_kernel_time", 437, 8),
        _event("ReorderOutput_token_3_kernel_time", 446, 2),
    ]
    times = ort_chain.kernel_times(events, bricks=3, skip_runs=1)
    assert times.runs == 2
    assert times.brick_us == (11.0, 28.0, 0.0)
    assert times.brick_nodes == (1, 2, 0)
    assert (times.edge_us, times.edge_nodes) == (3.0, 1)
    assert times.total_us == 42.0
    with pytest.raises(sampling.MeasurementError, match="warm-up"):
        ort_chain.kernel_times(events, bricks=3, skip_runs=3)


def test_attribution_splits_the_total_by_kernel_share():
    times = ort_chain.KernelTimes(
        brick_us=(30.0, 0.0, 60.0),
        edge_us=10.0,
        brick_nodes=(2, 0, 1),
        edge_nodes=1,
        runs=5,
    )
    shares = ort_chain.attribute(2.0, times)
    assert shares.brick_ms == pytest.approx((0.6, 0.0, 1.2))
    assert shares.edge_ms == pytest.approx(0.2)
    assert sum(shares.brick_ms) + shares.edge_ms == pytest.approx(2.0)
    assert shares.profiled_ms == pytest.approx(0.1)
    # Every node under the profiler's 1 us: shares by node count.
    tiny = dataclasses.replace(times, brick_us=(0.0, 0.0, 0.0), edge_us=0.0)
    shares = ort_chain.attribute(2.0, tiny)
    assert shares.brick_ms == pytest.approx((1.0, 0.0, 0.5))
    assert shares.edge_ms == pytest.approx(0.5)
    assert shares.profiled_ms == 0
    # No node left at all: the bricks cost nothing, the rest is edge.
    none = dataclasses.replace(tiny, brick_nodes=(0, 0, 0), edge_nodes=0)
    shares = ort_chain.attribute(2.0, none)
    assert shares.brick_ms == (0.0, 0.0, 0.0) and shares.edge_ms == 2.0


def test_a_chain_is_timed_and_its_time_split_among_its_bricks(tmp_path, bricks):
    chain = ort_chain.OrtChain(
        bricks, ORT, tmp_path, "chain", FAST, profile_runs=6
    )
    assert chain.graph.bricks == len(bricks)
    # Every brick reads the one before it: one input, a fed residual.
    assert len(chain.graph.inputs) == 1
    sampling.time_interleaved([chain])
    assert chain.profile.done and chain.profile.result().samples == 6
    times = chain.profile.kernel_times()
    # The timer ran the same session after the profiled runs, unprofiled.
    assert chain.timer.sessions[0] is chain.profile.session
    assert times.runs == 6 and chain.timer.runs > 6
    shares = chain.attribution()
    assert shares.total_ms == chain.timer.result().median_ms > 0
    assert sum(shares.brick_ms) + shares.edge_ms == pytest.approx(
        shares.total_ms
    )
    assert all(ms >= 0 for ms in shares.brick_ms)
    # The convolutions run as nodes of their own bricks.
    assert sum(ms > 0 for ms in shares.brick_ms) >= 3
    assert chain.seconds >= chain.merge_seconds + chain.session_seconds
    assert math.isfinite(chain.seconds)


def test_the_chain_runs_on_its_timer_inputs(tmp_path, bricks):
    chain = ort_chain.OrtChain(bricks, ORT, tmp_path, "chain", FAST)
    session = ort.InferenceSession(
        str(chain.path), providers=["CPUExecutionProvider"]
    )
    names = [i.name for i in session.get_inputs()]
    outputs = session.run(
        None, dict(zip(names, chain.timer.inputs[0], strict=True))
    )
    assert len(outputs) == len(chain.graph.outputs)
    assert all(np.isfinite(o).all() for o in outputs)


def test_a_chain_without_a_folder_writes_no_file(tmp_path, bricks):
    chain = ort_chain.OrtChain(bricks, ORT, None, "chain-7", FAST)
    assert chain.path is None and chain.name == "chain-7"
    # The same graph as the one written to a file, on the same inputs.
    kept = ort_chain.OrtChain(bricks, ORT, tmp_path, "chain", FAST)
    assert kept.path.read_bytes() == chain.graph.model.SerializeToString()
    assert chain.profile.owners.nodes == kept.profile.owners.nodes
    sampling.time_interleaved([chain])
    shares = chain.attribution()
    assert shares.total_ms == chain.timer.result().median_ms > 0
    assert sum(ms > 0 for ms in shares.brick_ms) >= 3


def _conv(batch, channels=4):
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, channels), batch_size=batch)
    return keras.Model(inp, keras.layers.Conv2D(8, 3, padding="same")(inp))


def _batch_norm(batch):
    inp = keras.Input((8, 8, 8), batch_size=batch)
    return keras.Model(inp, keras.layers.BatchNormalization()(inp))


def _relu(batch):
    inp = keras.Input((8, 8, 8), batch_size=batch)
    return keras.Model(inp, keras.layers.ReLU()(inp))


def test_a_convolution_fused_with_the_next_bricks_stays_its_bricks(tmp_path):
    # Single-layer bricks: ORT fuses the BN and the ReLU into the
    # convolution, and names the NCHWc node after the ReLU's tensor.
    paths = [
        brick_timing.brick_onnx_file(build, tmp_path, name, 1).path
        for name, build in (
            ("conv", _conv),
            ("bn", _batch_norm),
            ("relu", _relu),
            ("conv8", functools.partial(_conv, channels=8)),
        )
    ]
    chain = ort_chain.OrtChain(paths, ORT, tmp_path, "chain", FAST)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.optimized_model_filepath = str(tmp_path / "all.onnx")
    ort.InferenceSession(
        str(chain.path), options, providers=["CPUExecutionProvider"]
    )
    nodes = onnx.load(options.optimized_model_filepath).graph.node
    convs = [n.name for n in nodes if n.op_type == "Conv"]
    assert len(convs) == 2
    # By its name the first would be the ReLU's brick's.
    assert [ort_chain_graph.brick_of(name) for name in convs] == [2, 3]
    assert [chain.profile.owners(name) for name in convs] == [0, 3]
    # Its time is the convolution brick's.
    chain.profile.sample()
    times = chain.profile.kernel_times()
    assert times.brick_us[0] > 0


def test_owners_map_the_same_nodes_with_the_weights_written_or_not(
    tmp_path, bricks, monkeypatch
):
    # ORT writes the optimised graph's weights to the null device; where
    # no link can be made, to a file. The graph read back is the same.
    chain = ort_chain.OrtChain(bricks, ORT, tmp_path, "chain", FAST)
    linked = ort_chain.Owners(chain.path, ORT)

    def refuse(*args, **kwargs):
        raise OSError("no links here")

    monkeypatch.setattr(ort_chain.os, "symlink", refuse)
    written = ort_chain.Owners(chain.path, ORT)
    assert linked.nodes == written.nodes and linked.tensors == written.tensors
    assert len(linked.nodes) >= len(bricks)


def test_owners_map_the_same_nodes_with_the_weights_as_zeros(
    tmp_path, monkeypatch
):
    # Conv, BN, ReLU, conv, one layer a brick: ORT fuses across their
    # edges, and folds the BN into the first convolution's weights.
    paths = [
        brick_timing.brick_onnx_file(build, tmp_path, name, 1).path
        for name, build in (
            ("conv", functools.partial(_conv, channels=64)),
            ("bn", _batch_norm),
            ("relu", _relu),
            ("conv8", functools.partial(_conv, channels=8)),
        )
    ]
    chain = ort_chain.OrtChain(paths, ORT, None, "chain", FAST)
    model = chain.graph.model
    big = [
        t.name
        for t in model.graph.initializer
        if ort_chain._raw_bytes(t) >= ort_chain.SKELETON_MIN_BYTES
    ]
    assert big  # The 3x3x8x64 kernel at least.
    folder = tmp_path / "skeleton"
    folder.mkdir()
    path = ort_chain.skeleton(model, folder)
    stub = onnx.load(path, load_external_data=False)
    assert [n.name for n in stub.graph.node] == [
        n.name for n in model.graph.node
    ]
    external = [
        t.name
        for t in stub.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    ]
    assert external == big
    # The weights' bytes are in neither file: a sparse file of zeros.
    assert (folder / "skeleton.onnx").stat().st_size < 4096
    zeros = onnx.load(path).graph.initializer
    assert all(
        not onnx.numpy_helper.to_array(t).any() for t in zeros if t.name in big
    )
    small = {t.name: t for t in model.graph.initializer if t.name not in big}
    assert all(t == small[t.name] for t in zeros if t.name not in big)

    skeleton = ort_chain.Owners(model, ORT)
    monkeypatch.setattr(ort_chain, "SKELETON_MIN_BYTES", 2**62)
    weights = ort_chain.Owners(model, ORT)
    assert skeleton.nodes == weights.nodes
    assert skeleton.tensors == weights.tensors
    assert len(skeleton.nodes) >= 2


def test_profile_is_read_once_and_not_sampled_after(tmp_path, bricks):
    chain = ort_chain.OrtChain(
        bricks, ORT, tmp_path, "chain", FAST, profile_runs=2
    )
    with pytest.raises(sampling.MeasurementError, match="No samples"):
        chain.attribution()
    chain.profile.sample()
    assert chain.profile.done
    first = chain.profile.kernel_times()
    assert chain.profile.kernel_times() == first
    with pytest.raises(sampling.MeasurementError, match="has been read"):
        chain.profile.sample()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
