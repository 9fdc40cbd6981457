"""Will a model fit in memory at a batch size? Asked before timing it.

`bench --models=ResNet50 --batch_size=100000000` used to end in numpy's
`Unable to allocate 110. TiB` traceback, and a batch just small enough to
be allocated could get the process killed by the kernel without a word.
`check` estimates, from shapes and dtypes alone, what timing a built (not
yet run) Keras model needs, and refuses in one line what exceeds the
memory this process may still use, with a margin:

- weights, once per weight copy;
- synthetic inputs, once per input copy, times three (the numpy arrays,
  their stack, the TensorFlow constant);
- activations: three times the largest tensor any layer call produces
  (its input, its output and one tensor kept for a later call, such as a
  residual branch).

The estimate is meant to refuse the impossible, not to predict the peak:
a model it lets through may still fail, which `Timer` turns into one line
as well (`MemoryError`, TensorFlow's `ResourceExhaustedError`).

Example:
    memory.check(model, batch_size=4096, what="Model 'ResNet50'")
"""

from __future__ import annotations

import dataclasses
import math

from dlbricks_tf import errors

GIB = 1 << 30
# Share of the available memory a timing may plan to use.
MARGIN = 0.8
_INPUT_COPIES_HELD = 3  # numpy arrays, np.stack, tf.constant.
_ACTIVATIONS_HELD = 3  # A call's input, its output, one kept for later.


class MemoryLimitError(errors.Error):
    """A model or brick would not fit in the memory available."""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes a timing needs, by kind (see the module docstring)."""

    weights: int
    inputs: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.inputs + self.activations


def estimate(
    model,
    batch_size: int,
    input_copies: int = 1,
    weight_copies: int = 1,
    input_specs=None,
) -> Estimate:
    """Bytes needed to time a built Keras model, from shapes and dtypes.

    Args:
        model: A built `keras.Model`; its tensors' first dimension is the
            batch (None, or fixed).
        batch_size: The batch size it will run at.
        input_copies: Synthetic input sets the timing loop rotates through.
        weight_copies: Copies of the model the timing loop rotates through.
        input_specs: (shape with batch first, dtype) of each input it will
            run on, for a model whose inputs leave dimensions open (a
            transformer's sequence length); an open dimension of a tensor
            inside the model then counts as the largest dimension given
            (a sequence-by-sequence attention matrix counts in full).
    """
    weights = sum(_bytes(v.shape, v.dtype) for v in model.weights)
    open_size = 1
    if input_specs is None:
        inputs = sum(
            _bytes((batch_size, *t.shape[1:]), t.dtype) for t in model.inputs
        )
    else:
        inputs = sum(
            _bytes((batch_size, *tuple(s)[1:]), d) for s, d in input_specs
        )
        open_size = max(
            (int(x) for s, _ in input_specs for x in tuple(s)[1:]), default=1
        )
    largest = 0
    for t in _written(model):
        shape = tuple(open_size if d is None else d for d in t.shape)
        if shape:
            shape = (batch_size, *shape[1:])
        largest = max(largest, _bytes(shape, t.dtype))
    return Estimate(
        weights=weights * weight_copies,
        inputs=inputs * input_copies * _INPUT_COPIES_HELD,
        activations=largest * _ACTIVATIONS_HELD,
    )


def _written(model) -> list:
    """The tensors `model`'s calls write (shape, dtype): a Keras model's,
    or a `BrickProgram`'s `tensors`."""
    if not hasattr(model, "operations"):
        return list(model.tensors)
    return [
        t
        for operation in model.operations
        for node in getattr(operation, "_inbound_nodes", ())
        for t in node.output_tensors
    ]


def available_bytes() -> int | None:
    """Memory this process may still use: the machine's, or its cgroup's.

    The smaller of MemAvailable (/proc/meminfo) and the cgroup's limit
    minus its usage; None where neither can be read.
    """
    found = []
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(limit, encoding="ascii") as f:
                text = f.read().strip()
            with open(usage, encoding="ascii") as f:
                used = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if text.isdigit() and int(text) < 1 << 60:  # Not "max".
            found.append(max(0, int(text) - used))
    return min(found) if found else None


def check(
    model,
    batch_size: int,
    *,
    input_copies: int = 1,
    weight_copies: int = 1,
    what: str | None = None,
    available: int | None = None,
    input_specs=None,
) -> Estimate:
    """Raises `MemoryLimitError` if timing `model` cannot fit in memory.

    Args:
        model: A built `keras.Model`, not run yet.
        batch_size: The batch size it will run at.
        input_copies: Synthetic input sets of the timing loop.
        weight_copies: Model copies of the timing loop.
        what: How to name the model ("Brick 1a2b", "Model 'ResNet50'").
        available: Bytes available (default: `available_bytes()`).
        input_specs: The inputs' shapes and dtypes, where the model leaves
            dimensions open (see `estimate`).

    Returns:
        The estimate.
    """
    need = estimate(model, batch_size, input_copies, weight_copies, input_specs)
    return require(need, batch_size, what or f"Model {model.name!r}", available)


def check_specs(
    what: str,
    batch_size: int,
    weight_bytes: int,
    inputs,
    outputs,
    *,
    available: int | None = None,
) -> Estimate:
    """`check` for a brick known by its specs alone (an ONNX file).

    Args:
        what: How to name the brick.
        batch_size: The batch size it will run at.
        weight_bytes: Its weights (the file's size is an upper bound).
        inputs: (shape with batch first, dtype) of each input.
        outputs: The same of each output; the largest stands in for the
            largest activation.
        available: Bytes available (default: `available_bytes()`).
    """

    def batched(shape):
        return (batch_size, *tuple(shape)[1:]) if shape else shape

    largest = max((_bytes(batched(s), d) for s, d in outputs), default=0)
    largest = max([largest] + [_bytes(batched(s), d) for s, d in inputs])
    need = Estimate(
        weights=weight_bytes,
        inputs=sum(_bytes(batched(s), d) for s, d in inputs)
        * _INPUT_COPIES_HELD,
        activations=largest * _ACTIVATIONS_HELD,
    )
    return require(need, batch_size, what, available)


def require(
    need: Estimate, batch_size: int, what: str, available: int | None = None
) -> Estimate:
    """Raises `MemoryLimitError` if `need` exceeds the memory available."""
    if available is None:
        available = available_bytes()
    if available is not None and need.total > available * MARGIN:
        raise MemoryLimitError(
            f"{what} needs about {_gib(need.total)} at batch size "
            f"{batch_size:,} (weights {_gib(need.weights)}, inputs "
            f"{_gib(need.inputs)}, activations {_gib(need.activations)}), "
            f"more than {MARGIN:.0%} of the {_gib(available)} available; "
            "use a smaller --batch_size."
        )
    return need


def _bytes(shape, dtype) -> int:
    import numpy as np

    try:
        size = np.dtype(str(dtype)).itemsize
    except TypeError:  # bfloat16 and other dtypes numpy lacks.
        size = 2 if "16" in str(dtype) else 8
    dims = [1 if d is None else int(d) for d in shape]
    return math.prod(dims) * size


def _gib(n: int) -> str:
    return (
        f"{n / GIB:,.1f} GiB" if n >= GIB / 10 else f"{n / (1 << 20):,.1f} MiB"
    )
