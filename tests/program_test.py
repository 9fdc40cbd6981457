"""Tests of dlbricks_tf/cutting/program.py: a brick run on its layers
without a keras.Model computes and traces what the built brick does."""

import collections

import keras
import numpy as np
import pytest
from keras import layers

import dlbricks_tf
from dlbricks_tf.cutting import program, synthetic
from dlbricks_tf.measuring import chain, memory
from tests import models

SETTINGS, _ = models.settings()

SOURCES = [
    models.chain,
    models.residual,
    models.shared_and_ops,
    models.multi_io,
    models.nested_functional,
    models.mixed_precision,
]


def _unique(model, granularity):
    d = dlbricks_tf.decompose(model, granularity=granularity)
    return list({b.signature: b for b in d.bricks}.values())


@pytest.mark.parametrize("make", SOURCES, ids=lambda f: f.__name__)
@pytest.mark.parametrize("granularity", [1, 2])
def test_a_program_computes_what_the_built_brick_computes(make, granularity):
    model = make()[0]
    made = 0
    for brick in _unique(model, granularity):
        runnable = program.program(brick, 2, model)
        built = brick.build(2, source=model)
        if not isinstance(runnable, program.BrickProgram):
            continue  # Integer inputs.
        made += 1
        assert synthetic.input_specs(runnable, 2) == synthetic.input_specs(
            built, 2
        )
        assert [(o.shape, o.dtype) for o in runnable.outputs] == [
            (tuple(y.shape), y.dtype) for y in keras.tree.flatten(built.outputs)
        ]
        x = synthetic.synthetic_inputs(built, 2, seed=1)
        got = keras.tree.flatten(runnable(x[0] if len(x) == 1 else x))
        want = keras.tree.flatten(built(x[0] if len(x) == 1 else x))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        assert {id(v) for v in runnable.weights} == {
            id(v) for v in built.weights
        }
        need = memory.estimate(runnable, 2)
        assert need.weights == memory.estimate(built, 2).weights
        assert need.activations >= memory.estimate(built, 2).activations
    assert made, "no brick of this model made a program"


def _op_types(bricks):
    timer = chain.ChainTimer(bricks, SETTINGS, check_settings=False)
    graph = timer._run.get_concrete_function().graph
    return collections.Counter(op.type for op in graph.get_operations())


@pytest.mark.parametrize("make", [models.chain, models.residual])
def test_a_chain_of_programs_traces_the_ops_of_a_chain_of_built_bricks(make):
    # What the chain times is the same graph: only the build is skipped.
    model = make()[0]
    bricks = _unique(model, 1)
    programs = [(b.signature, program.program(b, 1, model)) for b in bricks]
    assert any(isinstance(p, program.BrickProgram) for _, p in programs)
    built = [(b.signature, b.build(1, source=model)) for b in bricks]
    assert _op_types(programs) == _op_types(built)
    timer = chain.ChainTimer(programs, SETTINGS, check_settings=False)
    for _ in range(3):
        timer.sample()
    assert all(timer.samples(i) for i in range(len(programs)))


@pytest.mark.parametrize("make", [models.chain, models.residual])
def test_a_program_of_fresh_layers_traces_what_a_built_brick_does(make):
    # No source (a suite's or a budget's bricks): fresh layers, built by a
    # symbolic call, as `Brick.build` builds them.
    model = make()[0]
    bricks = _unique(model, 2)
    programs = [(b.signature, program.program(b, 1)) for b in bricks]
    assert all(isinstance(p, program.BrickProgram) for _, p in programs)
    built = [(b.signature, b.build(1)) for b in bricks]
    assert _op_types(programs) == _op_types(built)
    source_ids = {id(v) for v in model.weights}
    for (_, p), (_, m) in zip(programs, built, strict=True):
        assert not any(id(v) in source_ids for v in p.weights)
        assert [w.shape for w in p.weights] == [w.shape for w in m.weights]
        assert [o.shape for o in p.outputs] == [
            tuple(y.shape) for y in keras.tree.flatten(m.outputs)
        ]


def test_a_call_the_source_cannot_run_gets_a_fresh_layer():
    x = keras.Input((8,))
    model = keras.Model(x, layers.ReLU()(layers.Dense(4, name="d")(x)))
    first, last = dlbricks_tf.decompose(model).bricks
    runnable = program.program(first, 1, model)
    assert runnable.layers == [model.get_layer("d")]
    # A model's own output has no recorded spec (nothing reads it): the
    # symbolic call gives it.
    assert program.program(last, 1, model).outputs[0].shape == (1, 4)
    # Another config under the same name (a model built twice in one
    # process numbers its layers differently): a fresh layer.
    other = keras.Model(x, layers.Dense(5, name="d")(x))
    runnable = program.program(first, 1, other)
    assert runnable.layers[0] is not other.get_layer("d")
    assert runnable.outputs[0].shape == (1, 4)
    assert runnable(np.zeros((1, 8), "float32")).shape == (1, 4)
    # Integer inputs (ids with bounds) go through a built brick.
    ids = keras.Input((6,), dtype="int32")
    embed = keras.Model(ids, layers.Embedding(50, 4, name="e")(ids))
    brick = dlbricks_tf.decompose(embed).bricks[0]
    assert isinstance(program.program(brick, 1, embed), keras.Model)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
