"""Tests for dlbricks_tf/models/probe_nets.py: the probe nets are the same
for the same seed whatever their count, are probes, hold the blocks
models are made of, and build, run and cut into bricks as models do."""

import collections

import numpy as np
import pytest

from dlbricks_tf.cutting.decompose import decompose, model_graph
from dlbricks_tf.models import corpus, probe_nets, probes

# Enough nets to hold every block (the whole corpus takes 25 s to build).
SAMPLE = 40


def _signatures(model):
    return [b.signature for b in decompose(model, granularity=1).bricks]


@pytest.fixture(scope="module")
def nets():
    return [s.build() for s in probe_nets.sources(SAMPLE)]


def test_a_net_is_the_same_for_its_seed_whatever_the_count(nets):
    again = probe_nets.sources(3)
    assert [s.name for s in again] == [f"probe-net-{i:03d}" for i in range(3)]
    assert _signatures(again[2].build()) == _signatures(nets[2])
    assert _signatures(probe_nets.build(2, seed=1)) != _signatures(nets[2])
    names = [s.name for s in probe_nets.sources()]
    assert len(set(names)) == probe_nets.COUNT == len(names)
    assert all(probes.is_probe(n) for n in names)
    assert {corpus.family(n) for n in names} == {probes.FAMILY}
    with pytest.raises(ValueError, match="count"):
        probe_nets.sources(-1)
    with pytest.raises(ValueError, match="index"):
        probe_nets.build(-1)


def test_the_nets_hold_the_layers_models_use(nets):
    classes = collections.Counter(
        type(layer).__name__ for m in nets for layer in m.layers
    )
    for name in (
        "Conv2D", "DepthwiseConv2D", "SeparableConv2D", "Dense",
        "BatchNormalization", "LayerNormalization", "Activation", "ReLU",
        "Add", "Multiply", "Concatenate", "MaxPooling2D",
        "AveragePooling2D", "GlobalAveragePooling2D", "ZeroPadding2D",
        "Flatten", "Dropout", "Rescaling",
    ):  # fmt: skip
        assert classes[name] > 0, name
    # Images of 3 channels and feature maps both start nets.
    channels = {m.inputs[0].shape[-1] for m in nets}
    assert 3 in channels and len(channels) > 2
    grouped = [
        layer
        for m in nets
        for layer in m.layers
        if type(layer).__name__ == "Conv2D" and layer.groups > 1
    ]
    assert grouped and all(g.groups == g.filters for g in grouped)


def _conv_flops(layer) -> float:
    """FLOPs of a Conv2D's call, from its built shapes."""
    out = layer.output.shape
    k = layer.kernel_size[0] * layer.kernel_size[1]
    return 2.0 * out[1] * out[2] * k * layer.input.shape[-1] * layer.filters


def test_one_net_in_six_reaches_the_largest_models_convolutions(nets):
    large = probe_nets.LARGE_EVERY
    assert probe_nets.MAX_FLOPS_LARGE > probe_nets.MAX_FLOPS
    flops = {
        i: [
            _conv_flops(layer) / layer.groups
            for layer in m.layers
            if type(layer).__name__ == "Conv2D"
        ]
        for i, m in enumerate(nets)
    }
    small = [f for i, fs in flops.items() if i % large != large - 1 for f in fs]
    wide = [f for i, fs in flops.items() if i % large == large - 1 for f in fs]
    # The large nets hold convolutions past any of the others', within
    # their own bound, and wider maps.
    assert max(small) < max(wide) <= probe_nets.MAX_FLOPS_LARGE

    def widest(i):  # The most channels of a map (not a flat vector).
        return max(
            layer.output.shape[-1]
            for layer in nets[i].layers
            if len(layer.output.shape) == 4
        )

    assert (
        max(widest(i) for i in range(len(nets)) if i % large != large - 1)
        <= 1024
    )
    assert (
        max(widest(i) for i in range(len(nets)) if i % large == large - 1)
        > 1024
    )


def test_nets_run_and_their_bricks_chain_back_into_the_net(nets):
    for model in nets[:4]:
        x = np.random.default_rng(0).normal(
            size=(1, *model.inputs[0].shape[1:])
        )
        out = np.asarray(model(x.astype("float32")))
        assert out.shape[0] == 1 and np.all(np.isfinite(out)), model.name
        d = decompose(model, granularity=3)
        assert sum(len(b.layers) for b in d.bricks) == len(
            model_graph(model)[0].calls
        )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
