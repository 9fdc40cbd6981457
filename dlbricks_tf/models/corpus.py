"""The default corpora: `keras.applications` architectures, no weights.

Every model is built with `weights=None`, so nothing is downloaded. Keras
(and so TensorFlow) is imported on first build, not with this module: a
command line checks model names before it fixes TensorFlow's thread pools.

`HUB_BACKBONES` are transformers of keras_hub, built from constructor
arguments at small sizes (no preset, nothing downloaded, fresh weights):
an encoder (BERT), a decoder (GPT-2) and two decoders of the Llama era
(Gemma; Mistral, for the Llama family: RMSNorm, rotary embeddings,
grouped queries). Their sequence length is open: cut and time them at
`HUB_LENGTH` tokens (`input_shapes={"*": (HUB_LENGTH,)}`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlbricks_tf.errors import Error

if TYPE_CHECKING:
    import keras

# The 40 architectures of keras.applications (Keras 3.15).
APPLICATIONS = (
    "ConvNeXtBase",
    "ConvNeXtLarge",
    "ConvNeXtSmall",
    "ConvNeXtTiny",
    "ConvNeXtXLarge",
    "DenseNet121",
    "DenseNet169",
    "DenseNet201",
    "EfficientNetB0",
    "EfficientNetB1",
    "EfficientNetB2",
    "EfficientNetB3",
    "EfficientNetB4",
    "EfficientNetB5",
    "EfficientNetB6",
    "EfficientNetB7",
    "EfficientNetV2B0",
    "EfficientNetV2B1",
    "EfficientNetV2B2",
    "EfficientNetV2B3",
    "EfficientNetV2L",
    "EfficientNetV2M",
    "EfficientNetV2S",
    "InceptionResNetV2",
    "InceptionV3",
    "MobileNet",
    "MobileNetV2",
    "MobileNetV3Large",
    "MobileNetV3Small",
    "NASNetLarge",
    "NASNetMobile",
    "ResNet101",
    "ResNet101V2",
    "ResNet152",
    "ResNet152V2",
    "ResNet50",
    "ResNet50V2",
    "VGG16",
    "VGG19",
    "Xception",
)

# One model per family, for figures that time every model (benchmarks and
# the default `run`): VGG, ResNet, ResNetV2, Inception, Xception, MobileNet
# v1/v2/v3, DenseNet, EfficientNet v1/v2, ConvNeXt, NASNet.
FAMILIES = (
    "VGG16",
    "ResNet50",
    "ResNet50V2",
    "InceptionV3",
    "Xception",
    "MobileNet",
    "MobileNetV2",
    "MobileNetV3Small",
    "DenseNet121",
    "EfficientNetB0",
    "EfficientNetV2B0",
    "ConvNeXtTiny",
    "NASNetMobile",
)


# keras_hub backbones, at the sizes of `hub_backbone` (LlamaBackbone is
# left out: keras_hub 0.32.0 cannot serialize its layers' configs).
HUB_BACKBONES = (
    "BertBackbone",
    "GPT2Backbone",
    "GemmaBackbone",
    "MistralBackbone",
)
HUB_LENGTH = 128
HUB_SIZES = {
    # 4 blocks of width 256 (4 heads of 64, feed-forward 1024), the size
    # of BERT-Mini: some 11 ms of CPU time per call at batch 1 and 128
    # tokens for BERT (one thread); a sweep of three values of G over the
    # four takes a few minutes.
    "small": {
        "vocabulary_size": 4096,
        "num_layers": 4,
        "hidden_dim": 256,
        "heads": 4,
        "intermediate_dim": 1024,
    },
    # For tests: the same graph, width 16, a fraction of a millisecond.
    "tiny": {
        "vocabulary_size": 64,
        "num_layers": 2,
        "hidden_dim": 16,
        "heads": 2,
        "intermediate_dim": 32,
    },
}
# Longest sequence of the models with learned positions (BERT, GPT-2).
_HUB_POSITIONS = 512


# The family of a keras.applications architecture, by name prefix (first
# match wins): models of one family share designs and layer kinds.
_FAMILY_PREFIXES = (
    ("ConvNeXt", "ConvNeXt"),
    ("DenseNet", "DenseNet"),
    ("EfficientNetV2", "EfficientNetV2"),
    ("EfficientNet", "EfficientNet"),
    ("Inception", "Inception/Xception"),
    ("Xception", "Inception/Xception"),
    ("MobileNet", "MobileNet"),
    ("NASNet", "NASNet"),
    ("RegNet", "RegNet"),
    ("ResNet", "ResNet"),
    ("VGG", "VGG"),
    # The probe corpus (dlbricks_tf.models.probes): one family of its own.
    ("probe-", "probes"),
)


def family(name: str) -> str:
    """The family of a keras.applications name (the name itself if none).

    E.g. "ResNet" for ResNet50 and ResNet152V2, "Inception/Xception" for
    InceptionV3, InceptionResNetV2 and Xception.
    """
    for prefix, fam in _FAMILY_PREFIXES:
        if name.startswith(prefix):
            return fam
    return name


class UnknownModelError(Error):
    """A model name that is not a keras.applications architecture."""


class HubUnavailableError(Error):
    """keras_hub, which builds the `HUB_BACKBONES`, is not installed."""


def application(name: str) -> keras.Model:
    """Builds the `keras.applications` architecture `name`, `weights=None`.

    Raises:
        UnknownModelError: `name` is not one of `APPLICATIONS`.
    """
    if name not in APPLICATIONS:
        raise UnknownModelError(
            f"Unknown model {name!r}: use a keras.applications name such as "
            f"ResNet50 (all: {', '.join(APPLICATIONS)}) or a model file path."
        )
    import keras

    kwargs = {}
    if name.startswith("MobileNetV3"):
        # Their default input is (None, None, 3); timing needs fixed shapes,
        # so they get the 224x224 the other ImageNet models have.
        kwargs["input_shape"] = (224, 224, 3)
    return getattr(keras.applications, name)(weights=None, **kwargs)


def hub_backbone(name: str, size: str = "small") -> keras.Model:
    """Builds the keras_hub backbone `name` at a size of `HUB_SIZES`.

    From constructor arguments: no preset is read and nothing downloaded;
    the weights are fresh. Every model has `num_layers` blocks of width
    `hidden_dim` with `heads` attention heads; the decoders of the Llama
    era share one key-value head among them (grouped queries), and Gemma
    gets twice the `intermediate_dim` (its gated feed-forward halves it).
    The sequence length stays open.

    Raises:
        UnknownModelError: `name` is not one of `HUB_BACKBONES`.
        HubUnavailableError: keras_hub is not installed.
        ValueError: `size` is not one of `HUB_SIZES`.
    """
    if name not in HUB_BACKBONES:
        raise UnknownModelError(
            f"Unknown keras_hub backbone {name!r}: use one of "
            f"{', '.join(HUB_BACKBONES)}."
        )
    if size not in HUB_SIZES:
        raise ValueError(
            f"size must be one of {tuple(HUB_SIZES)}. Received: {size!r}"
        )
    try:
        import keras_hub
    except ImportError as e:
        raise HubUnavailableError(
            f"Cannot build {name}: keras_hub is not installed ({e}); install "
            "it with `pip install --no-deps -r requirements-nodeps.txt`."
        ) from e
    sizes = dict(HUB_SIZES[size])
    heads = sizes.pop("heads")
    if name in ("BertBackbone", "GPT2Backbone"):
        kwargs = {
            **sizes,
            "num_heads": heads,
            "max_sequence_length": _HUB_POSITIONS,
        }
    else:
        kwargs = {**sizes, "num_query_heads": heads, "num_key_value_heads": 1}
    if name == "GemmaBackbone":
        kwargs["head_dim"] = sizes["hidden_dim"] // heads
        kwargs["intermediate_dim"] = 2 * sizes["intermediate_dim"]
    return getattr(keras_hub.models, name)(**kwargs)
