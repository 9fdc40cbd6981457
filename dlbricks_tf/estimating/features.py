"""What a brick computes, as numbers a latency model can learn from.

A brick's latency on a CPU is mostly its arithmetic (FLOPs) and the memory
it moves (weights read, activations read and written), with a cost per
layer call on top. `brick_features` counts these from the brick's layer
configs and the tensor shapes the graph records, with no TensorFlow: per
kind of layer (convolution, depthwise, dense, normalization, activation,
elementwise, pooling, reshaping, ...) the calls and their FLOPs, then the
totals, the shapes at the brick's edges and the activation functions used
(by name, and by what they cost per element).

The FLOP counts are the usual ones (a multiply-add is 2 FLOPs; an
elementwise op 1 per output element, a normalization 4); they only need to
rank bricks consistently, not to match any kernel.

Example:
    graph, factory = decompose.model_graph(model)
    brick = decompose.Cutter(graph, factory).brick(0, 3)
    brick_features(brick, graph.specs)["flops"]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dlbricks_tf.cutting.graph import TensorSpec

# Layer classes by kind; a class not listed is "other".
KINDS = {
    "conv": (
        "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
        "Conv3DTranspose",
    ),
    "depthwise": ("DepthwiseConv1D", "DepthwiseConv2D"),
    "separable": ("SeparableConv1D", "SeparableConv2D"),
    "dense": ("Dense", "EinsumDense"),
    "batchnorm": ("BatchNormalization",),
    "layernorm": (
        "LayerNormalization", "GroupNormalization", "UnitNormalization",
        "RMSNormalization",
    ),
    "activation": (
        "Activation", "ReLU", "LeakyReLU", "ELU", "PReLU", "Softmax",
    ),
    "elementwise": (
        "Add", "Multiply", "Subtract", "Average", "Maximum", "Minimum",
        "LayerScale", "CustomScaleLayer", "Rescaling", "Normalization",
    ),
    "concat": ("Concatenate",),
    "pool": (
        "MaxPooling1D", "MaxPooling2D", "MaxPooling3D", "AveragePooling1D",
        "AveragePooling2D", "AveragePooling3D",
    ),
    "global_pool": (
        "GlobalAveragePooling1D", "GlobalAveragePooling2D",
        "GlobalAveragePooling3D", "GlobalMaxPooling1D", "GlobalMaxPooling2D",
        "GlobalMaxPooling3D",
    ),
    "reshape": (
        "Reshape", "Flatten", "Permute", "ZeroPadding1D", "ZeroPadding2D",
        "ZeroPadding3D", "Cropping1D", "Cropping2D", "Cropping3D",
        "UpSampling1D", "UpSampling2D", "GetItem", "RepeatVector",
    ),
    "identity": (
        "Dropout", "SpatialDropout1D", "SpatialDropout2D", "GaussianNoise",
        "GaussianDropout", "AlphaDropout", "InputLayer", "Identity",
    ),
}  # fmt: skip
_KIND_OF = {c: kind for kind, classes in KINDS.items() for c in classes}
KIND_NAMES = (*KINDS, "other")
# Activation functions counted apart: they cost very different amounts.
ACTIVATIONS = (
    "relu", "relu6", "swish", "silu", "sigmoid", "hard_sigmoid",
    "hard_swish", "hard_silu", "gelu", "tanh", "softmax", "elu",
)  # fmt: skip
# The same functions by what they cost per element: a comparison, an
# exponential or similar, a piecewise-linear composite of several ops. A
# function one family alone uses (hard_silu) is then still priced by the
# class it belongs to.
ACTIVATION_CLASSES = {
    "cheap": ("relu", "relu6", "leaky_relu"),
    "transcendental": (
        "swish", "silu", "sigmoid", "gelu", "tanh", "softmax", "elu",
        "selu", "softplus", "mish",
    ),
    "piecewise": ("hard_sigmoid", "hard_swish", "hard_silu"),
}  # fmt: skip
_CLASS_OF = {
    a: name for name, members in ACTIVATION_CLASSES.items() for a in members
}
_BYTES = {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "bool": 1}


def kind(class_name: str) -> str:
    """The kind of a layer class ("conv", "dense", ..., "other")."""
    return _KIND_OF.get(class_name, "other")


def feature_names() -> tuple[str, ...]:
    """The names of `brick_features`' values, in a fixed order."""
    names = ["calls", "inputs", "outputs"]
    for k in KIND_NAMES:
        names += [f"{k}_calls", f"{k}_flops"]
    names += ["grouped_calls", "grouped_flops", "group_width"]
    names += [f"act_{a}" for a in ACTIVATIONS]
    names += [f"act_class_{c}" for c in ACTIVATION_CLASSES]
    names += [
        "matrix_flops",
        "stencil_flops",
        "vector_flops",
        "flops",
        "params",
        "input_elements",
        "output_elements",
        "activation_elements",
        "bytes",
        "flops_per_byte",
        "max_kernel",
        "max_kernel_area",
        "max_stride",
        "input_spatial",
        "input_channels",
        "output_channels",
    ]
    return tuple(names)


def _elements(spec: TensorSpec | None) -> int:
    if spec is None:
        return 0
    return math.prod(d for d in spec.shape if d is not None)


def _size(value: Any, rank: int) -> tuple[int, ...]:
    """A kernel size, stride or pool size of a config, as a tuple."""
    if value is None:
        return (1,) * rank
    if isinstance(value, int):
        return (value,) * rank
    return tuple(int(v) for v in value)


def _activation(class_name: str, config: Mapping[str, Any]) -> str | None:
    """The activation function a call applies, by its name.

    A layer's `activation` argument, or the layer itself (`ReLU`, with
    `max_value` 6 as "relu6"; `Softmax`; `LeakyReLU`, `ELU`).
    """
    if class_name == "ReLU":
        return "relu6" if config.get("max_value") == 6 else "relu"
    if class_name in ("Softmax", "ELU"):
        return class_name.lower()
    if class_name == "LeakyReLU":
        return "leaky_relu"
    value = config.get("activation")
    if isinstance(value, dict):  # A serialized function or object.
        value = value.get("config", value.get("class_name"))
        if isinstance(value, dict):
            value = value.get("name")
    if not isinstance(value, str) or value == "linear":
        return None
    return value.lower()


def output_elements(
    class_name: str, config: Mapping[str, Any], first: TensorSpec | None
) -> int:
    """The elements a call writes, from its config and first input.

    For calls whose output spec the graph does not record: convolutions,
    depthwise and separable ones, pooling and dense layers change the
    shape; every other layer is taken to keep it.
    """
    if first is None or not first.shape:
        return 0
    k = kind(class_name)
    shape = [d or 1 for d in first.shape]
    if k == "dense":
        return math.prod(shape[:-1]) * int(config.get("units") or shape[-1])
    if k not in ("conv", "depthwise", "separable", "pool"):
        return math.prod(shape)
    rank = len(shape) - 1
    window = _size(
        config.get("pool_size" if k == "pool" else "kernel_size"), rank
    )
    strides = _size(
        config.get("strides") or (window if k == "pool" else 1), rank
    )
    dilation = _size(config.get("dilation_rate") or 1, rank)
    spatial = []
    sizes = zip(shape[:-1], window, strides, dilation, strict=False)
    for n, w, st, dl in sizes:
        if config.get("padding") == "same":
            spatial.append(-(-n // st))
        else:
            spatial.append(max((n - dl * (w - 1) - 1) // st + 1, 1))
    if k in ("conv", "separable"):
        channels = int(config.get("filters") or shape[-1])
    elif k == "depthwise":
        channels = shape[-1] * int(config.get("depth_multiplier") or 1)
    else:
        channels = shape[-1]
    return math.prod(spatial) * channels


def call_cost(
    class_name: str,
    config: Mapping[str, Any],
    inputs: Sequence[TensorSpec | None],
    outputs: Sequence[TensorSpec | None],
) -> tuple[float, float, float, float]:
    """FLOPs and parameters of one layer call, batch 1.

    Args:
        class_name: The layer's class.
        config: Its serialized config.
        inputs: Specs of the tensors it reads (without batch).
        outputs: Specs of the tensors it writes (None where unrecorded).

    Returns:
        (matrix FLOPs: the products a convolution or dense layer makes
        across channels; stencil FLOPs: per-channel windows, depthwise
        convolutions and pooling; vector FLOPs: elementwise and
        normalization work; parameters).
    """
    first = inputs[0] if inputs else None
    in_elems = _elements(first)
    in_ch = first.shape[-1] if first is not None and first.shape else 1
    in_ch = in_ch or 1
    k = kind(class_name)
    rank = max(len(first.shape) - 1, 1) if first is not None else 1
    out_elems = sum(_elements(s) for s in outputs if s is not None)
    if not out_elems:  # A model's last output is often not recorded.
        out_elems = output_elements(class_name, config, first)
    if k == "conv":
        kernel = math.prod(_size(config.get("kernel_size"), rank))
        groups = int(config.get("groups") or 1)
        filters = int(config.get("filters") or 1)
        params = kernel * in_ch // groups * filters + filters
        if "Transpose" in class_name:
            return 2.0 * in_elems * kernel * filters, 0.0, 0.0, params
        flops = 2.0 * out_elems * kernel * in_ch / groups
        if groups > 1 and in_ch <= groups:
            # One input channel per group: a depthwise convolution's
            # per-channel window (ConvNeXt's), not a product across
            # channels.
            return 0.0, flops, 0.0, params
        return flops, 0.0, 0.0, params
    if k == "depthwise":
        kernel = math.prod(_size(config.get("kernel_size"), rank))
        mult = int(config.get("depth_multiplier") or 1)
        params = kernel * in_ch * mult + in_ch * mult
        return 0.0, 2.0 * out_elems * kernel, 0.0, params
    if k == "separable":
        kernel = math.prod(_size(config.get("kernel_size"), rank))
        mult = int(config.get("depth_multiplier") or 1)
        filters = int(config.get("filters") or 1)
        spatial = out_elems / filters
        params = kernel * in_ch * mult + in_ch * mult * filters + filters
        return (
            2.0 * spatial * in_ch * mult * filters,
            2.0 * spatial * in_ch * mult * kernel,
            0.0,
            params,
        )
    if k == "dense":
        units = config.get("units") or out_elems / max(in_elems / in_ch, 1)
        return 2.0 * in_elems * units, 0.0, 0.0, in_ch * units + units
    if k in ("batchnorm", "layernorm"):
        return 0.0, 0.0, 4.0 * in_elems, 4.0 * in_ch
    if k == "pool":
        window = math.prod(_size(config.get("pool_size"), rank))
        return 0.0, float(out_elems * window), 0.0, 0.0
    if k == "global_pool":
        return 0.0, 0.0, float(in_elems), 0.0
    if k in ("reshape", "identity"):
        return 0.0, 0.0, 0.0, 0.0
    if k == "elementwise":
        reads = sum(_elements(s) for s in inputs)
        return 0.0, 0.0, float(max(reads, out_elems)), 0.0
    return 0.0, 0.0, float(out_elems), 0.0  # activations, concatenation, ...


def brick_features(
    brick: Any, specs: Sequence[TensorSpec | None]
) -> dict[str, float]:
    """The features of a brick (`feature_names` order, as a dict).

    Args:
        brick: A `Brick` (its `calls`, `inputs`, `outputs`, `input_ids`).
        specs: The spec of every tensor id of the brick's graph
            (`Graph.specs`).

    Returns:
        {feature name: value}.
    """
    values = dict.fromkeys(feature_names(), 0.0)
    values["calls"] = len(brick.calls)
    values["inputs"] = len(brick.inputs)
    values["outputs"] = len(brick.outputs)
    internal = 0
    written: dict[int, int] = {}  # Elements of each tensor a call writes.
    max_kernel = max_stride = max_area = 1
    for c in brick.calls:
        config = c.layer_config.get("config") or {}
        ins = [specs[t] for t in c.inputs]
        outs = [specs[t] for t in c.outputs]
        matrix, stencil, other, params = call_cost(
            c.class_name, config, ins, outs
        )
        flops = matrix + stencil + other
        k = kind(c.class_name)
        values[f"{k}_calls"] += 1
        values[f"{k}_flops"] += flops
        values["matrix_flops"] += matrix
        values["stencil_flops"] += stencil
        values["vector_flops"] += other
        values["flops"] += flops
        values["params"] += params
        groups = int(config.get("groups") or 1) if k == "conv" else 1
        if groups > 1:
            # Grouped convolutions run far slower per FLOP on CPU, the
            # more so the fewer channels a group holds (one: 0.3-2
            # GFLOP/s here, 32 or more: 20-60).
            values["grouped_calls"] += 1
            values["grouped_flops"] += flops
            in_ch = ins[0].shape[-1] if ins and ins[0] and ins[0].shape else 1
            width = max((in_ch or 1) // groups, 1)
            values["group_width"] = (
                min(values["group_width"], width)
                if values["group_width"]
                else width
            )
        elements = sum(_elements(s) for s in outs if s is not None)
        if not elements:
            elements = output_elements(
                c.class_name, config, ins[0] if ins else None
            )
        internal += elements
        for t in c.outputs:
            known = specs[t]
            written[t] = _elements(known) if known else elements
        act = _activation(c.class_name, config)
        if act in ACTIVATIONS:
            values[f"act_{act}"] += 1
        if act in _CLASS_OF:
            values[f"act_class_{_CLASS_OF[act]}"] += 1
        if k in ("conv", "depthwise", "separable", "pool"):
            key = "pool_size" if k == "pool" else "kernel_size"
            rank = max(len(ins[0].shape) - 1, 1) if ins and ins[0] else 1
            window = _size(config.get(key), rank)
            max_kernel = max(max_kernel, *window)
            max_area = max(max_area, math.prod(window))
            max_stride = max(
                max_stride, *_size(config.get("strides") or 1, rank)
            )
    values["input_elements"] = sum(_elements(s) for s in brick.inputs)
    values["output_elements"] = sum(written.get(t, 0) for t in brick.output_ids)
    values["activation_elements"] = internal
    dtype = brick.inputs[0].dtype if brick.inputs else "float32"
    width = _BYTES.get(dtype, 4)
    values["bytes"] = width * (
        values["params"] + values["input_elements"] + internal
    )
    values["flops_per_byte"] = values["flops"] / max(values["bytes"], 1.0)
    values["max_kernel"] = max_kernel
    values["max_kernel_area"] = max_area
    values["max_stride"] = max_stride
    first = brick.inputs[0] if brick.inputs else None
    if first is not None and first.shape:
        values["input_spatial"] = _elements(first) / (first.shape[-1] or 1)
        values["input_channels"] = first.shape[-1] or 0
    last = next((s for s in reversed(brick.outputs) if s is not None), None)
    if last is not None and last.shape:
        values["output_channels"] = last.shape[-1] or 0
    return values


def vector(features: Mapping[str, float]) -> list[float]:
    """The values of `brick_features` in `feature_names` order."""
    return [float(features[n]) for n in feature_names()]
