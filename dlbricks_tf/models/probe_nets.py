"""Probe nets: the probe corpus, seeded networks of the blocks models use.

A predictor learns a machine's latencies from bricks timed on it. With no
model brick timed (a new machine), it learns from the probes alone, and
what it learns is only as good as the probes' timings are like the
models'. A probe of one layer is timed in a chain beside other probes,
a 600 MFLOP convolution next to an activation of microseconds; a
model's layer is timed beside its own neighbours. Priced from single
layer probes, the 40 keras.applications models read 3-11/40 within
±10%: their activations at 1.5x, normalizations at 1.4x and depthwise
convolutions at 3x their timings. So each probe here is a small
network: a random sequence of the blocks image models are made of,
each layer fed by the one before at the shapes it produces, as in a
model. Their bricks are timed in their own order, like
any model's: 1-4% of them are stored noisy, against half of the layer
probes', and the 40 priced from them alone read 10-29/40 within ±10%
where the layer probes gave 1-11/40 on the same stores
(docs/estimating-beyond.md).

Each net starts either from an image (3 channels, 224-600 pixels wide,
optionally rescaled and normalized, then a strided convolution) or from
a feature map (7-112 wide, 16-1024 channels), and chains 6-14 blocks
drawn from:

- a convolution (1-7 wide, 16-1024 filters), then a normalization and
  an activation;
- a depthwise convolution (3-7 wide), then the same;
- a grouped convolution of one channel a group, a layer normalization
  and two dense layers around a GELU (an inverted bottleneck);
- squeeze-and-excitation: a global pooling, two 1x1 convolutions and a
  product;
- a residual sum around a 1x1 convolution and a normalization;
- a separable convolution;
- a pooling with stride 2;
- a concatenation with a 1x1 convolution, or a dense block (two
  normalized convolutions, 1x1 then 3x3, concatenated to the input);
- a zero padding before a strided convolution;

then a head: a global pooling, or a flattened map into one or two wide
dense layers, then a dense classifier. Strides of 2 come at random, more
often on maps wider than 112. A convolution block narrows its filters,
then its kernel, to stay under `MAX_FLOPS`, and a residual's or a
padding's convolution is left out (or made depthwise) above it; the
other blocks are bounded by their fixed widths.

One net in `LARGE_EVERY` is drawn at the scale of the largest models:
its convolutions may reach `MAX_FLOPS_LARGE` (VGG's 3x3 convolutions
are 3.7 GFLOPs a call), its maps 2048 channels and its MLPs 8192, and
its stem may keep the image's full resolution. Without them, every
VGG and ConvNeXt layer past those bounds was priced by extrapolation:
from the nets alone, VGG16 and VGG19 read 0.74-0.76 (`efficiency`) and
1.27-1.31 (`kinds`, 1.01 with them), the largest ConvNeXts 0.85-0.88.

No net is drawn from a particular model: the blocks are those of
keras.applications and keras_hub image models, their sizes and order
random.

The corpus is the same on every machine (a net is drawn from its own
seed: net i of seed s is the same however many are drawn), so its
bricks' signatures are too. `dlbricks bench --probes` times it once per
machine and settings.

Example:
    for source in sources(4):   # "probe-net-000", ...
        model = source.build()
"""

from __future__ import annotations

import functools
import random
from typing import Any

from dlbricks_tf.models.sources import ModelSource

# Nets in the corpus, and the seed that draws them.
COUNT = 180
SEED = 0
# The name of net i (a probe: `probes.is_probe`).
PREFIX = "probe-net-"
# FLOPs of a convolution block's call, at most.
MAX_FLOPS = 240e6
# One net in LARGE_EVERY (net i with i % LARGE_EVERY == LARGE_EVERY - 1)
# is drawn at the scale of the largest models: convolutions up to
# MAX_FLOPS_LARGE (VGG's 3x3 convolutions are 3.7 GFLOPs), up to 2048
# channels, MLPs up to 8192 wide.
LARGE_EVERY = 6
MAX_FLOPS_LARGE = 4e9

_IMAGE_SIZES = (224, 240, 260, 299, 300, 331, 380, 456, 480, 528, 600)
_MAP_SIZES = (112, 56, 28, 14)
_CHANNELS = (
    16, 24, 32, 40, 48, 64, 80, 96, 112, 128, 160, 192, 256, 320, 384, 512,
    768, 1024,
)  # fmt: skip
_LARGE_CHANNELS = (1536, 2048)
_STEM_FILTERS = (16, 24, 32, 40, 48, 64)
_ACTIVATIONS = (
    "relu", "relu6", "swish", "gelu", "sigmoid", "hard_silu", "relu",
    "relu", "swish",
)  # fmt: skip
# (block, weight in the draw); "concat" is a dense block half the time.
_BLOCKS = (
    ("conv", 5),
    ("depthwise", 4),
    ("grouped", 1),
    ("squeeze", 2),
    ("residual", 2),
    ("separable", 1),
    ("pool", 1),
    ("concat", 1),
    ("pad", 1),
)


def name(index: int) -> str:
    """The name of net `index`."""
    return f"{PREFIX}{index:03d}"


def build(index: int, seed: int = SEED) -> Any:
    """Net `index` of `seed`, as a fresh functional `keras.Model`."""
    import keras

    if index < 0:
        raise ValueError(f"index must be 0 or more. Received: {index}")
    rng = random.Random(seed * 1_000_003 + index)
    large = index % LARGE_EVERY == LARGE_EVERY - 1
    return _Net(keras, rng, large).model(name(index).replace("-", "_"))


def sources(count: int = COUNT, seed: int = SEED) -> list[ModelSource]:
    """The first `count` nets as `sources.ModelSource`s (built in code)."""
    if count < 0:
        raise ValueError(f"count must be 0 or more. Received: {count}")
    return [
        ModelSource(name(i), builder=functools.partial(build, i, seed))
        for i in range(count)
    ]


class _Net:
    """Draws one net with `rng`, layer by layer."""

    def __init__(self, keras: Any, rng: random.Random, large: bool) -> None:
        self.k = keras
        self.layers = keras.layers
        self.rng = rng
        self.large = large
        self.max_flops = MAX_FLOPS_LARGE if large else MAX_FLOPS

    def model(self, model_name: str) -> Any:
        rng, layers = self.rng, self.layers
        if rng.random() < 0.4:
            inputs = x = self.k.Input((*[rng.choice(_IMAGE_SIZES)] * 2, 3))
            x = self._stem(x)
        else:
            size = rng.choice(_MAP_SIZES)
            channels = rng.choice(self._widths(size))
            inputs = x = self.k.Input((size, size, channels))
        for _ in range(rng.randint(6, 14)):
            x = self._block(x)
        x = self._head(x)
        if rng.random() < 0.5:
            x = layers.Dropout(0.2)(x)
        x = layers.Dense(
            rng.choice((10, 100, 1000)),
            activation=rng.choice((None, "softmax")),
        )(x)
        return self.k.Model(inputs, x, name=model_name)

    def _stem(self, x: Any) -> Any:
        rng, layers = self.rng, self.layers
        if rng.random() < 0.5:
            x = layers.Rescaling(1.0 / 255)(x)
        if rng.random() < 0.3:
            x = layers.Normalization(mean=[0.5] * 3, variance=[0.25] * 3)(x)
        strides = 2
        if self.large and x.shape[1] <= 260 and rng.random() < 0.5:
            strides = 1  # A full-resolution stem, as VGG's.
        x = layers.Conv2D(
            rng.choice(_STEM_FILTERS),
            rng.choice((3, 3, 7)),
            strides=strides,
            padding="same",
            use_bias=False,
        )(x)
        return self._norm_act(x)

    def _block(self, x: Any) -> Any:
        rng, layers = self.rng, self.layers
        size, channels = x.shape[1], x.shape[-1]
        kinds, weights = zip(*_BLOCKS, strict=True)
        kind = rng.choices(kinds, weights)[0]
        if kind == "concat" and rng.random() < 0.5:
            kind = "dense_block"
        large = size > max(_MAP_SIZES)
        stride = (
            2 if size > 7 and rng.random() < (0.35 if large else 0.15) else 1
        )
        if large and channels > 96:  # Large maps with many channels: shrink.
            kind, stride = "conv", 2
        if kind == "conv":
            k = rng.choice((1, 1, 3, 3, 5, 7))
            filters = rng.choice(self._widths(size))
            out = -(-size // stride)
            if _conv_flops(out, k, channels, filters) > self.max_flops:
                filters = _CHANNELS[0]
                if self.large:  # The widest within the bound.
                    filters = max(
                        [filters]
                        + [
                            c
                            for c in self._widths(size)
                            if _conv_flops(out, k, channels, c)
                            <= self.max_flops
                        ]
                    )
            if _conv_flops(out, k, channels, filters) > self.max_flops:
                k = 1
            x = layers.Conv2D(
                filters,
                k,
                strides=stride,
                padding="same",
                use_bias=rng.random() < 0.4,
            )(x)
            return self._norm_act(x)
        if kind == "depthwise":
            x = layers.DepthwiseConv2D(
                rng.choice((3, 3, 5, 7)),
                strides=stride,
                padding="same",
                use_bias=rng.random() < 0.4,
            )(x)
            return self._norm_act(x)
        if kind == "grouped":
            if channels > 384 and size >= 28:
                return x
            x = layers.Conv2D(
                channels, rng.choice((3, 7)), padding="same", groups=channels
            )(x)
            x = layers.LayerNormalization()(x)
            y = layers.Dense(min(4 * channels, 8192 if self.large else 1024))(x)
            y = layers.Activation("gelu")(y)
            return layers.Dense(channels)(y)
        if kind == "squeeze":
            s = layers.GlobalAveragePooling2D(keepdims=True)(x)
            s = layers.Conv2D(
                max(8, channels // 4),
                1,
                activation=rng.choice(("relu", "swish")),
            )(s)
            s = layers.Conv2D(
                channels, 1, activation=rng.choice(("sigmoid", "hard_sigmoid"))
            )(s)
            return layers.Multiply()([x, s])
        if kind == "residual":
            y = x
            if _conv_flops(size, 1, channels, channels) <= self.max_flops:
                y = layers.Conv2D(channels, 1, use_bias=False)(x)
            y = layers.BatchNormalization()(y)
            x = layers.Add()([x, y])
            return self._act(x) if rng.random() < 0.5 else x
        if kind == "separable":
            filters = rng.choice([c for c in _CHANNELS if c <= 768])
            x = layers.SeparableConv2D(
                filters, 3, padding="same", use_bias=False
            )(x)
            return self._norm_act(x)
        if kind == "pool":
            if size <= 7:
                return x
            pool = rng.choice((layers.MaxPooling2D, layers.AveragePooling2D))
            return pool(rng.choice((2, 3)), strides=2, padding="same")(x)
        if kind == "concat":
            y = layers.Conv2D(rng.choice((16, 32, 48, 64)), 1)(x)
            return layers.Concatenate()([x, y])
        if kind == "dense_block":
            y = layers.BatchNormalization()(x)
            y = layers.Activation("relu")(y)
            y = layers.Conv2D(128, 1, use_bias=False)(y)
            y = layers.BatchNormalization()(y)
            y = layers.Activation("relu")(y)
            y = layers.Conv2D(32, 3, padding="same", use_bias=False)(y)
            return layers.Concatenate()([x, y])
        # "pad": a zero padding before a strided convolution.
        if size <= 7:
            return x
        x = layers.ZeroPadding2D(((0, 1), (0, 1)))(x)
        if _conv_flops(size // 2, 3, channels, channels) <= self.max_flops:
            x = layers.Conv2D(
                channels, 3, strides=2, padding="valid", use_bias=False
            )(x)
        else:
            x = layers.DepthwiseConv2D(3, strides=2, padding="valid")(x)
        return self._norm_act(x)

    def _head(self, x: Any) -> Any:
        rng, layers = self.rng, self.layers
        if x.shape[1] * x.shape[2] * x.shape[3] <= 32768 and rng.random() < 0.2:
            x = layers.Flatten()(x)  # A flattened map into wide dense layers.
            for _ in range(rng.choice((1, 2))):
                x = layers.Dense(
                    rng.choice((1024, 2048, 4096)), activation="relu"
                )(x)
            return x
        return layers.GlobalAveragePooling2D()(x)

    def _norm_act(self, x: Any) -> Any:
        r = self.rng.random()
        if r < 0.75:
            x = self.layers.BatchNormalization()(x)
        elif r < 0.85:
            x = self.layers.LayerNormalization()(x)
        return self._act(x) if self.rng.random() < 0.8 else x

    def _act(self, x: Any) -> Any:
        activation = self.rng.choice(_ACTIVATIONS)
        if activation == "relu6":
            return self.layers.ReLU(max_value=6.0)(x)
        return self.layers.Activation(activation)(x)

    def _widths(self, size: int) -> list[int]:
        if self.large:
            return [
                c
                for c in _CHANNELS + _LARGE_CHANNELS
                if c <= (512 if size >= 56 else 2048)
            ]
        return [c for c in _CHANNELS if c <= (256 if size >= 56 else 1024)]


def _conv_flops(size: int, k: int, channels: int, filters: int) -> float:
    return 2.0 * size * size * k * k * channels * filters
