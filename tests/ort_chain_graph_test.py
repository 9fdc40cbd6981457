"""Tests of dlbricks_tf/measuring/ort_chain_graph.py: bricks in one graph.

Real tf2onnx conversions of small bricks (channels-first at their
convolution edges, as `run` converts them) and real ONNX Runtime sessions;
nothing is timed.
"""

import dataclasses

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from dlbricks_tf.measuring import onnx_files, ort_chain_graph
from dlbricks_tf.measuring.ort_chain_graph import Feed
from tests import models

SETTINGS, _ = models.settings()
ORT = dataclasses.replace(SETTINGS, backend="onnxruntime", protocol="loop")


def _conv(batch):
    """A convolution brick: its file is channels-first at both edges."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((8, 8, 4), batch_size=batch)
    return keras.Model(inp, keras.layers.Conv2D(4, 3, padding="same")(inp))


def _relu(batch):
    """A ReLU brick: its file keeps the Keras layout (channels-last)."""
    inp = keras.Input((8, 8, 4), batch_size=batch)
    return keras.Model(inp, keras.layers.ReLU()(inp))


def _add(batch):
    """A residual Add of two channels-last tensors."""
    a = keras.Input((8, 8, 4), batch_size=batch)
    b = keras.Input((8, 8, 4), batch_size=batch)
    return keras.Model([a, b], keras.layers.Add()([a, b]))


def _flat(batch):
    """A brick whose input fits no output above (another shape)."""
    inp = keras.Input((5, 3), batch_size=batch)
    return keras.Model(inp, keras.layers.Flatten()(inp))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bricks")
    return {
        name: onnx_files.onnx_file(
            build, folder, name, 1, boundary=onnx_files.BRICK_BOUNDARY
        ).path
        for name, build in (
            ("conv", _conv),
            ("relu", _relu),
            ("add", _add),
            ("flat", _flat),
        )
    }


def _run_bricks(graph, paths, inputs):
    """Runs each brick file alone, wired as `graph.feeds` says.

    Returns:
        Per brick, its outputs, computed by its own session.
    """
    outputs = []
    fed = iter(inputs)
    for path, row in zip(paths, graph.feeds, strict=True):
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        nchw, _ = ort_chain_graph.layouts(path)
        feed = {}
        for j, (node, source) in enumerate(
            zip(session.get_inputs(), row, strict=True)
        ):
            if source is None:
                feed[node.name] = next(fed)
                continue
            value = outputs[source.brick][source.output]
            if source.transposed:
                perm = (0, 3, 1, 2) if j in nchw else (0, 2, 3, 1)
                value = np.ascontiguousarray(value.transpose(perm))
            feed[node.name] = value
        outputs.append(session.run(None, feed))
    return outputs


def _graph_inputs(graph):
    rng = np.random.default_rng(0)
    arrays = []
    for value in graph.model.graph.input:
        dims = [
            d.dim_value if d.HasField("dim_value") else 1
            for d in value.type.tensor_type.shape.dim
        ]
        arrays.append(rng.standard_normal(dims).astype(np.float32))
    return arrays


@pytest.mark.parametrize(
    "names",
    [
        ("conv", "relu", "conv"),
        ("conv", "relu", "add", "conv", "flat"),
        ("relu", "conv", "conv", "add", "relu"),
    ],
)
def test_a_chain_computes_what_its_bricks_compute(files, names):
    paths = [files[n] for n in names]
    graph = ort_chain_graph.merge(paths)
    inputs = _graph_inputs(graph)
    session = ort.InferenceSession(
        graph.model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    got = session.run(None, dict(zip(graph_names(graph), inputs, strict=True)))
    bricks = _run_bricks(graph, paths, inputs)
    assert len(got) == len(graph.outputs) >= 1
    for value, (brick, index) in zip(got, graph.outputs, strict=True):
        want = bricks[brick][index]
        assert value.shape == want.shape
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-5)


def graph_names(graph):
    return [v.name for v in graph.model.graph.input]


def test_layouts_are_joined_by_transposes(files):
    graph = ort_chain_graph.merge([files[n] for n in ("conv", "relu", "conv")])
    # The convolution's file is channels-first, the ReLU's channels-last.
    assert graph.feeds == (
        (None,),
        (Feed(0, 0, transposed=True),),
        (Feed(1, 0, transposed=True),),
    )
    assert graph.transposes == 2
    assert graph.inputs == ((0, 0),)
    assert graph.outputs == ((2, 0),)
    links = [n for n in graph.model.graph.node if n.op_type == "Transpose"]
    assert [ort_chain_graph.brick_of(n.name) for n in links] == [None, None]


def test_a_residual_reads_an_output_already_read(files):
    graph = ort_chain_graph.merge([files[n] for n in ("conv", "relu", "add")])
    # The Add reads the ReLU's output (same layout, latest) and the
    # convolution's, which the ReLU read too: two readers, as in a model.
    assert graph.feeds[2] == (Feed(1, 0), Feed(0, 0, transposed=True))
    assert graph.outputs == ((2, 0),)


def test_what_fits_nothing_is_an_input_and_an_unread_output_an_output(
    files,
):
    graph = ort_chain_graph.merge([files[n] for n in ("conv", "flat")])
    assert graph.feeds == ((None,), (None,))
    assert graph.inputs == ((0, 0), (1, 0))
    assert graph.outputs == ((0, 0), (1, 0))


def test_no_feeding_across_segments_or_when_off(files):
    paths = [files[n] for n in ("conv", "relu")]
    for graph in (
        ort_chain_graph.merge(paths, segments=["a", "b"]),
        ort_chain_graph.merge(paths, feed=False),
    ):
        assert graph.feeds == ((None,), (None,))
        assert len(graph.model.graph.input) == 2
    fed = ort_chain_graph.merge(paths, segments=["a", "a"])
    assert fed.feeds[1] == (Feed(0, 0, transposed=True),)


def test_every_node_names_its_brick(files):
    paths = [files[n] for n in ("conv", "relu", "add", "conv")]
    graph = ort_chain_graph.merge(paths)
    owners = [ort_chain_graph.brick_of(n.name) for n in graph.model.graph.node]
    bricks = {o for o in owners if o is not None}
    assert bricks == {0, 1, 2, 3}
    # The nodes of no brick are the Transposes that join layouts.
    assert owners.count(None) == graph.transposes
    onnx.checker.check_model(graph.model)


def test_brick_of_reads_names_ort_makes():
    assert ort_chain_graph.brick_of("brick3/conv:0_nchwc") == 3
    assert ort_chain_graph.brick_of("fused brick12/x/Conv") == 12
    assert ort_chain_graph.brick_of("ReorderOutput_token_7") is None
    assert ort_chain_graph.brick_of("link3_0/Transpose") is None
    assert ort_chain_graph.brick_of("mybrick3/x") is None


def test_bad_chains_raise(files):
    with pytest.raises(ort_chain_graph.ChainGraphError, match="at least"):
        ort_chain_graph.merge([])
    with pytest.raises(ort_chain_graph.ChainGraphError, match="segments"):
        ort_chain_graph.merge([files["conv"]], segments=[0, 1])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
