"""Tests of dlbricks_tf/drawing/summaries.py: TensorBoard events read back."""

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from dlbricks_tf.drawing import bar_charts, summaries


def read_run(path) -> event_accumulator.EventAccumulator:
    acc = event_accumulator.EventAccumulator(
        str(path), size_guidance={event_accumulator.TENSORS: 0}
    )
    acc.Reload()
    return acc


def test_markdown_table():
    text = summaries.markdown_table(
        ["model", "calls", "share"],
        [["a|b", 7, 0.123456], ["c", 2, None]],
    )
    assert text.splitlines() == [
        "| model | calls | share |",
        "| --- | ---: | ---: |",
        "| a\\|b | 7 | 0.1235 |",
        "| c | 2 |  |",
    ]


def test_markdown_table_refuses_ragged_rows():
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        summaries.markdown_table(["a", "b", "c"], [[1, 2]])


def test_image_text_and_scalars_read_back(tmp_path):
    png = bar_charts.bar_chart(["a", "b"], [1.0, 2.0], size=(2.0, 1.5), dpi=50)
    with summaries.run_writer(tmp_path, "run1") as w:
        summaries.write_image(w, "chart", png, step=3)
        summaries.write_table(w, "table", ["model", "calls"], [["a", 7]])
        summaries.write_scalars(w, "speedup", {1: 4.0, 2: float("nan"), 3: 2.5})
    acc = read_run(tmp_path / "run1")
    tags = set(acc.Tags()["tensors"])
    assert tags == {"chart", "table", "speedup"}

    (image,) = acc.Tensors("chart")
    assert image.step == 3
    # An image summary holds [width, height, encoded PNG...] as strings.
    width, height, encoded = tf.make_ndarray(image.tensor_proto)
    assert (int(width), int(height)) == (100, 75)
    assert tuple(tf.image.decode_png(encoded).shape[:2]) == (75, 100)

    (table,) = acc.Tensors("table")
    text = tf.make_ndarray(table.tensor_proto).item().decode()
    assert text == "| model | calls |\n| --- | ---: |\n| a | 7 |"

    scalars = {
        e.step: float(tf.make_ndarray(e.tensor_proto))
        for e in acc.Tensors("speedup")
    }
    assert scalars == {1: 4.0, 3: 2.5}  # NaN skipped.


def test_hparams_and_graph_read_back(tmp_path):
    import keras
    from tensorboard.plugins.hparams import plugin_data_pb2

    with summaries.run_writer(tmp_path, "sweep") as w:
        summaries.write_hparams_config(
            w, {"granularity": [2, 1, 2]}, {"speedup": "speed-up"}
        )
    with summaries.run_writer(tmp_path, "sweep/G=1") as w:
        summaries.write_hparams(w, {"granularity": 1}, trial_id="G=1")
    a, b = keras.Input((3,)), keras.Input((3,))
    model = keras.Model([a, b], keras.layers.Add(name="plus")([a, b]))
    with summaries.run_writer(tmp_path, "graph") as w:
        summaries.write_model_graph(w, model, batch_size=2)

    content = read_run(tmp_path / "sweep").PluginTagToContent("hparams")
    experiment = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/experiment"]
    ).experiment
    (info,) = experiment.hparam_infos
    assert [v.number_value for v in info.domain_discrete.values] == [1, 2]
    assert [m.display_name for m in experiment.metric_infos] == ["speed-up"]
    content = read_run(tmp_path / "sweep" / "G=1").PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(
        content["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["granularity"].number_value == 1

    graph = read_run(tmp_path / "graph").Graph()
    placeholders = [n for n in graph.node if n.op == "Placeholder"]
    assert len(placeholders) == 2
    assert any(
        "plus" in n.name and n.op in ("Add", "AddV2") for n in graph.node
    )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
