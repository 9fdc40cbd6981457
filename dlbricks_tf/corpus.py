"""The default corpora: `keras.applications` architectures, no weights.

Every model is built with `weights=None`, so nothing is downloaded. Keras
(and so TensorFlow) is imported on first build, not with this module: a
command line checks model names before it fixes TensorFlow's thread pools.
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
