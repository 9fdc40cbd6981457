"""The probe corpus, one machine's calibration for predicted bricks; and
the layer probes it was before.

`sources()` is the probe corpus `dlbricks bench --probes` times: the probe
nets (`dlbricks_tf.models.probe_nets`), seeded networks of the blocks
models use, so that each layer is timed beside neighbours of its own size
as in a model. The rest of this module draws the layer probes, one layer
call each (`specs`, `build`, `layer_sources`): the probe corpus of stores
timed before the nets. A predictor still learns from them where a store
holds them; `bench --probes` no longer times them: priced from them
alone (no model brick timed), the 40 keras.applications models read
1-11/40 within ±10% on two stores, and from the nets 10-29/40 on the
same two; a 10% budget read 32-33/40 from them, 32-37/40 from the nets
(docs/estimating-beyond.md).

Layer probes:

A latency model fitted on the bricks of a corpus knows the kernels that
corpus runs, and nothing else: a family whose layers no other family has
(grouped convolutions, layer normalization over images, very large dense
layers) is priced from kernels unlike its own. nn-Meter trains its kernel
predictors on sampled kernel configurations, not on models; the probes do
the same. Each probe is a small functional model of one to three layer
calls, the way models use them: a compute layer (convolution, grouped or
depthwise or separable convolution, dense, pooling, an elementwise op of
two inputs, or a normalization), optionally followed by a normalization
and an activation; or a squeeze-and-excitation convolution on a 1x1 map;
or a layer that only moves elements or passes them on (padding,
cropping, reshape, flatten, dropout). Its kind, shapes and options are
drawn from fixed ranges by a seeded generator, under a budget of FLOPs
and weights per call so that the whole probe corpus times in about half
a minute (25 s for its 378 new bricks on a 2-core machine).

The last two kinds are there because models hold many such bricks and a
predictor of the other kinds priced them far off: on the 13 models at
G=1, bricks under 10 us were predicted at 2.1x their timing and dropout
(the identity at inference) at 60x; MobileNetV3Small, rich in
squeeze-and-excitation blocks, at 1.9x.

Nothing here is drawn from a particular model or family: the ranges are
those of the layers keras.applications and keras_hub use (feature maps
7-112 wide, 16-2048 channels, kernels 1-7, strides 1-2). The probes are
timed like any model's bricks (`dlbricks bench --probes`) and are learnt
from by `estimate --predict` when the store holds them for its settings
and machine.

Example:
    for source in sources():   # The probe nets: "probe-net-000", ...
        model = source.build()
    [p.kind for p in specs()]   # The layer probes: "probe-000", ...
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from dlbricks_tf.models import probe_nets
from dlbricks_tf.models.sources import ModelSource

# Nets in the probe corpus (`sources`).
COUNT = probe_nets.COUNT
# Layer probes drawn by default (`specs`), and the seed that draws them.
LAYER_COUNT = 240
SEED = 0
# The name of a probe starts with PREFIX (layer probe i: "probe-000"; net
# i: "probe-net-000"); the family all probes belong to.
PREFIX = "probe-"
FAMILY = "probes"

# Budgets per call: FLOPs of a dense kind (convolution, dense), of a
# grouped or depthwise one (a per-channel window runs tens of times slower
# per FLOP), and weights (float32 values).
MATRIX_FLOPS = 600e6
WINDOW_FLOPS = 40e6
MAX_WEIGHTS = 20e6

_SIZES = (7, 14, 28, 56, 112)
# Channels of the 1x1 maps a squeeze-and-excitation block reduces to and
# expands from (a quarter or less of a block's channels, 8 at least).
_SQUEEZED = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
_CHANNELS = (
    16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512, 768, 1024,
    1536, 2048,
)  # fmt: skip
_ACTIVATIONS = (
    "relu", "relu6", "swish", "gelu", "sigmoid", "hard_silu", "tanh",
)  # fmt: skip
# (kind, weight in the draw).
_KINDS = (
    ("conv", 5),
    ("grouped", 3),
    ("depthwise", 2),
    ("separable", 1),
    ("dense", 4),
    ("pool", 1),
    ("global_pool", 1),
    ("binary", 2),
    ("norm", 2),
    ("squeeze", 2),
    ("shape", 2),
)


@dataclasses.dataclass(frozen=True)
class Layer:
    """One layer call of a probe: a Keras class and its arguments."""

    class_name: str
    args: tuple[tuple[str, Any], ...]


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
    """A probe model: its inputs' shapes (no batch) and its chain of calls.

    Attributes:
        name: "probe-000", ...
        kind: What its first call is (one of the kinds drawn).
        inputs: Shapes of its inputs without the batch (two for "binary").
        layers: The calls, in order; the first takes every input.
    """

    name: str
    kind: str
    inputs: tuple[tuple[int, ...], ...]
    layers: tuple[Layer, ...]


def is_probe(name: str) -> bool:
    """Whether `name` names a probe model."""
    return name.startswith(PREFIX)


def specs(count: int = LAYER_COUNT, seed: int = SEED) -> list[ProbeSpec]:
    """The layer probes: `count` drawn with `seed` (deterministic).

    The same (count, seed) always gives the same probes, so their bricks'
    signatures are the same on every machine and in every run.
    """
    if count < 0:
        raise ValueError(f"count must be 0 or more. Received: {count}")
    rng = random.Random(seed)
    kinds = [k for k, _ in _KINDS]
    weights = [w for _, w in _KINDS]
    out = []
    for i in range(count):
        kind = rng.choices(kinds, weights)[0]
        inputs, first = _draw(rng, kind)
        layers = [first, *_tail(rng, kind, inputs[0])]
        out.append(ProbeSpec(f"{PREFIX}{i:03d}", kind, inputs, tuple(layers)))
    return out


def build(spec: ProbeSpec) -> Any:
    """The probe as a fresh functional `keras.Model`."""
    import keras

    inputs = [
        keras.Input(shape, name=f"in{j}") for j, shape in enumerate(spec.inputs)
    ]
    x = sole = inputs if len(inputs) > 1 else inputs[0]
    for layer in spec.layers:
        x = _layer(keras, layer)(x)
    return keras.Model(sole, x, name=spec.name.replace("-", "_"))


def sources(count: int = COUNT, seed: int = SEED) -> list[ModelSource]:
    """The probe corpus: the first `count` probe nets as
    `sources.ModelSource`s (built in code, nothing read)."""
    return probe_nets.sources(count, seed)


def cut_key(count: int, granularity: int, fuse: bool, seed: int = SEED) -> str:
    """What the first `count` probe nets cut into depends on, as a key.

    Cutting the 180 nets takes 17-25 s on 2 cores, so a store keeps the
    signatures they cut into under this key (`Store.put_probe_suite`),
    and a budgeted campaign whose probes are all stored skips the cut.
    The key covers the nets' and the cutting's own code, the Keras and
    TensorFlow versions, and the arguments: a change to any of them cuts
    the nets again.
    """
    import hashlib
    from pathlib import Path

    import keras
    import tensorflow as tf

    from dlbricks_tf import cutting

    digest = hashlib.sha256()
    files = [Path(__file__), Path(probe_nets.__file__)]
    files += sorted(Path(cutting.__file__).parent.glob("*.py"))
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(
        f"{keras.__version__}|{tf.__version__}|{count}|{seed}|"
        f"{granularity}|{bool(fuse)}".encode()
    )
    return digest.hexdigest()[:32]


def layer_sources(
    count: int = LAYER_COUNT, seed: int = SEED
) -> list[ModelSource]:
    """The layer probes as `sources.ModelSource`s."""
    import functools

    return [
        ModelSource(s.name, builder=functools.partial(build, s))
        for s in specs(count, seed)
    ]


def _layer(keras: Any, layer: Layer) -> Any:
    args = dict(layer.args)
    if layer.class_name == "ReLU6":  # A ReLU layer capped at 6.
        return keras.layers.ReLU(max_value=6.0)
    return getattr(keras.layers, layer.class_name)(**args)


def _draw(rng: random.Random, kind: str):
    """(input shapes, first call) of a probe of `kind`, within budget."""
    while True:
        size = rng.choice(_SIZES)
        cin = rng.choice(_CHANNELS)
        if size >= 56 and cin > 512:  # Larger maps than models run.
            continue
        out = _first(rng, kind, size, cin)
        if out is not None:
            return out


def _first(rng: random.Random, kind: str, size: int, cin: int):
    image = ((size, size, cin),)
    if kind in ("conv", "grouped", "depthwise", "separable"):
        k = rng.choice((1, 3, 3, 5, 7) if kind == "conv" else (3, 5, 7))
        stride = rng.choice((1, 1, 1, 2))
        padding = rng.choice(("same", "same", "valid"))
        out_size = _out(size, k, stride, padding)
        if out_size < 1:
            return None
        positions = out_size * out_size
        act = rng.choice((None, None, *_ACTIVATIONS[:4]))
        if kind == "conv":
            cout = rng.choice(_CHANNELS)
            flops = 2 * positions * cout * k * k * cin
            weights = k * k * cin * cout
            args = {"filters": cout, "kernel_size": k}
            budget = MATRIX_FLOPS
            class_name = "Conv2D"
        elif kind == "grouped":
            # Depthwise as a grouped convolution (groups = channels), or
            # groups of 8-64 channels (ResNeXt, RegNet).
            width = rng.choice((1, 1, 8, 16, 32, 64))
            if cin % width or (width > 1 and cin // width < 2):
                return None
            cout = cin * rng.choice((1, 1, 2)) if width == 1 else cin
            flops = 2 * positions * cout * k * k * width
            weights = k * k * width * cout
            args = {"filters": cout, "kernel_size": k, "groups": cin // width}
            budget = WINDOW_FLOPS
            class_name = "Conv2D"
        elif kind == "depthwise":
            mult = rng.choice((1, 1, 1, 2))
            flops = 2 * positions * cin * mult * k * k
            weights = k * k * cin * mult
            args = {"kernel_size": k, "depth_multiplier": mult}
            budget = WINDOW_FLOPS
            class_name = "DepthwiseConv2D"
        else:
            cout = rng.choice(_CHANNELS)
            flops = 2 * positions * (cin * k * k + cin * cout)
            weights = k * k * cin + cin * cout
            args = {"filters": cout, "kernel_size": k}
            budget = MATRIX_FLOPS
            class_name = "SeparableConv2D"
        if flops > budget or weights > MAX_WEIGHTS:
            return None
        args.update(
            strides=stride,
            padding=padding,
            use_bias=rng.random() < 0.5,
            activation=act,
        )
        return image, Layer(class_name, _items(args))
    if kind == "dense":
        rank = rng.choice((2, 2, 3, 4))
        # Flattened maps feed dense layers of up to 25088 inputs (VGG).
        cin = cin * rng.choice((1, 1, 2, 4, 8, 12)) if rank == 2 else cin
        units = rng.choice((*_CHANNELS, 3072, 4096))
        if rank == 2:
            shape = (cin,)
            rows = 1
        elif rank == 3:
            rows = rng.choice((16, 32, 64, 128, 256))
            shape = (rows, cin)
        else:
            rows = size * size
            shape = (size, size, cin)
        if 2 * rows * cin * units > MATRIX_FLOPS:
            return None
        if cin * units > 5 * MAX_WEIGHTS:  # 400 MB of weights at most.
            return None
        act = rng.choice((None, None, *_ACTIVATIONS[:4]))
        args = {"units": units, "use_bias": rng.random() < 0.7}
        args["activation"] = act
        return (shape,), Layer("Dense", _items(args))
    if kind == "pool":
        pool = rng.choice((2, 3))
        stride = rng.choice((1, 2))
        if size < pool:
            return None
        class_name = rng.choice(("MaxPooling2D", "AveragePooling2D"))
        args = {
            "pool_size": pool,
            "strides": stride,
            "padding": rng.choice(("same", "valid")),
        }
        return image, Layer(class_name, _items(args))
    if kind == "global_pool":
        class_name = rng.choice(
            ("GlobalAveragePooling2D", "GlobalMaxPooling2D")
        )
        args = {"keepdims": rng.random() < 0.3}
        return image, Layer(class_name, _items(args))
    if kind == "binary":
        class_name = rng.choice(("Add", "Multiply", "Concatenate", "Subtract"))
        second = (size, size, cin)
        if class_name == "Multiply" and rng.random() < 0.5:
            second = (1, 1, cin)  # Squeeze-and-excitation's scaling.
        if class_name == "Concatenate":
            wide = [c for c in _CHANNELS if size < 56 or c <= 512]
            second = (size, size, rng.choice(wide))
        return (image[0], second), Layer(class_name, ())
    if kind == "squeeze":
        return _squeeze(rng, cin)
    if kind == "shape":
        return _shape(rng, size, cin)
    # "norm": a normalization over a map or a sequence.
    if rng.random() < 0.3:
        image = ((rng.choice((16, 32, 64, 128, 256)), cin),)
    class_name = rng.choice(("BatchNormalization", "LayerNormalization"))
    return image, Layer(class_name, ())


def _squeeze(rng: random.Random, cin: int):
    """A squeeze-and-excitation layer: a 1x1 convolution on a 1x1 map,
    reducing a block's channels or expanding them back (often with its
    activation: ReLU or swish to reduce, a sigmoid to expand)."""
    small = rng.choice(_SQUEEZED)
    if rng.random() < 0.5:
        cin, cout = max(cin, small), small
        act = rng.choice(("relu", "swish", None))
    else:
        cin, cout = small, max(cin, small)
        act = rng.choice(("sigmoid", "hard_sigmoid", None))
    args = {
        "filters": cout,
        "kernel_size": 1,
        "use_bias": True,
        "activation": act,
    }
    return ((1, 1, cin),), Layer("Conv2D", _items(args))


def _shape(rng: random.Random, size: int, cin: int):
    """A layer that moves or copies elements, or passes them on: padding
    before a strided convolution, cropping, a reshape or flatten, and
    dropout (the identity at inference)."""
    image = ((size, size, cin),)
    choice = rng.choice(("pad", "pad", "crop", "reshape", "flatten", "dropout"))
    if choice == "pad":
        pad = rng.choice((1, 3, ((0, 1), (0, 1))))
        return image, Layer("ZeroPadding2D", (("padding", pad),))
    if choice == "crop" and size > 2:
        return image, Layer("Cropping2D", (("cropping", ((0, 1), (0, 1))),))
    if choice == "reshape":
        # A vector to a 1x1 map (squeeze-and-excitation), or a map to rows.
        if rng.random() < 0.5:
            return ((cin,),), Layer("Reshape", (("target_shape", (1, 1, cin)),))
        return image, Layer("Reshape", (("target_shape", (size * size, cin)),))
    if choice == "flatten":
        return image, Layer("Flatten", ())
    rate = rng.choice((0.1, 0.2, 0.3))
    return rng.choice((image, ((cin,),))), Layer("Dropout", (("rate", rate),))


def _tail(rng: random.Random, kind: str, shape: tuple[int, ...]):
    """What may follow a probe's first call: a normalization, then an
    activation (as a layer), as models place them."""
    if kind in ("shape", "squeeze"):
        return []
    if kind in ("pool", "global_pool", "norm"):
        if kind == "norm" and rng.random() < 0.5:
            return [_activation(rng)]
        return []
    out = []
    if kind != "binary" and rng.random() < 0.5:
        layernorm = kind == "dense" or rng.random() < 0.2
        out.append(
            Layer(
                "LayerNormalization" if layernorm else "BatchNormalization",
                (),
            )
        )
    if rng.random() < 0.5:
        out.append(_activation(rng))
    return out


def _activation(rng: random.Random) -> Layer:
    name = rng.choice(_ACTIVATIONS)
    if name == "relu6":
        return Layer("ReLU6", ())
    return Layer("Activation", (("activation", name),))


def _out(size: int, k: int, stride: int, padding: str) -> int:
    if padding == "same":
        return -(-size // stride)
    return (size - k) // stride + 1


def _items(args: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(args.items()))
