"""ONNX Runtime chains: many bricks timed in one session, split by profile.

A chain is a run of bricks' ONNX files merged into one graph
(`dlbricks_tf.measuring.ort_chain_graph`), in which each brick reads what
the bricks before it wrote, as inside a model. `OrtChain` opens one
session of that graph, with ORT's profiler on. Its first runs are
`profile`'s: their per-node kernel times split the chain among its
bricks. Then profiling ends (`end_profiling`: the session runs unprofiled
from there) and `timer`, an `ort_timing.OrtTimer` on the same session,
times the chain whole (one `Run` per call, its overhead subtracted, to
the options' precision). One session, not one of each: opening a session
of a chain of a hundred bricks costs as much as a few of its runs, and the
profiled runs warm the session up for the timer. The chain is a sampler
(profiled runs first, then the timer's samples), so
`sampling.time_interleaved` takes it in the same rounds as the whole
models.

Attribution (`attribute`). ONNX has no clock op, so a brick's share comes
from the profiler: the kernel times of its nodes (those that carry its
name prefix, `ort_chain_graph.brick_of`, or, for a node ORT fused across
two bricks, the prefix of the node with the weights: `Owners`), over the
profiled runs after a warm-up. The profiler slows what it watches (it
records an event per node; small graphs most, ORT issue 20238), so its
times are not used as they are: they are scaled so that bricks and edges
together sum to the chain's unprofiled median. The nodes of no brick
(reorders ORT puts at the graph's inputs and outputs, Transposes left
between bricks) are the chain's edges, which the whole model does not
pay: their share is left out. A per-node overhead subtracted from every
node was the alternative; measured on three models it gave the same
estimates within 1.5%, and it can make a small node negative, which a
share cannot. On the 13 models it lifted MobileNetV3Small (0.86 to
0.97-0.99, its many small nodes) but moved large models by up to 20%
from one run to the next (13/13 within 10%, then 10/13): not kept.

Example:
    chain = OrtChain(paths, settings, None, "chain-0")  # No file kept.
    sampling.time_interleaved([model_timer, chain])
    chain.attribution().brick_ms  # One figure per brick, in chain order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf import stats
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import ort_chain_graph, ort_session, ort_timing
from dlbricks_tf.measuring.sampling import MeasurementError, TimingOptions

# Profiled runs per sample() call, and untimed ones before the first.
RUNS_PER_SAMPLE = 2
WARMUP_RUNS = 2
# The suffix of the names of ORT's NCHWc nodes, after the tensor written.
_NCHWC = "_nchwc"
# Initializers from this size on are zeros in `Owners`' skeleton.
SKELETON_MIN_BYTES = 1024
# The sparse file they read from.
_ZEROS = "zeros.bin"


@dataclasses.dataclass(frozen=True)
class Attribution:
    """A chain's time split into its bricks' and its edges'.

    Attributes:
        total_ms: The chain's unprofiled time per call.
        brick_ms: Per brick, in chain order, its share of `total_ms`.
        edge_ms: The share of the nodes of no brick.
        profiled_ms: Mean kernel time per profiled run (the sum of the
            kernel times the shares come from).
    """

    total_ms: float
    brick_ms: tuple[float, ...]
    edge_ms: float
    profiled_ms: float


@dataclasses.dataclass(frozen=True)
class KernelTimes:
    """What a chain's nodes took per profiled run, by brick.

    Attributes:
        brick_us: Per brick, its nodes' kernel microseconds per run.
        edge_us: Those of the nodes of no brick.
        brick_nodes: Per brick, how many of its nodes ran per run.
        edge_nodes: How many nodes of no brick ran per run.
        runs: The profiled runs counted.
    """

    brick_us: tuple[float, ...]
    edge_us: float
    brick_nodes: tuple[int, ...]
    edge_nodes: int
    runs: int

    @property
    def total_us(self) -> float:
        """Every node's kernel microseconds per run."""
        return sum(self.brick_us) + self.edge_us


def kernel_times(
    events: Sequence[Mapping],
    bricks: int,
    skip_runs: int = 0,
    owner: Callable[[str], int | None] = ort_chain_graph.brick_of,
) -> KernelTimes:
    """Kernel times per run of each brick's nodes and of the edges'.

    Args:
        events: ORT's profile (the JSON list `end_profiling` writes).
        bricks: Bricks in the chain.
        skip_runs: Runs at the start to leave out (warm-up).
        owner: The brick of a node, by its name (None: an edge); see
            `Owners`.

    Returns:
        Means over the runs counted.

    Raises:
        MeasurementError: If no run is left to count.
    """
    counted, kernels = kernel_events(events, skip_runs)
    us = [0.0] * (bricks + 1)  # The last entry: the edges.
    nodes = [0] * (bricks + 1)
    for node, event in kernels:
        brick = owner(node)
        if brick is None or brick >= bricks:
            brick = bricks
        us[brick] += event["dur"]
        nodes[brick] += 1
    return KernelTimes(
        brick_us=tuple(t / counted for t in us[:-1]),
        edge_us=us[-1] / counted,
        brick_nodes=tuple(n // counted for n in nodes[:-1]),
        edge_nodes=nodes[-1] // counted,
        runs=counted,
    )


def op_kernel_times(
    events: Sequence[Mapping],
    skip_runs: int = 0,
    owner: Callable[[str], int | None] | None = None,
) -> dict[tuple[int | None, str], float]:
    """Kernel microseconds per run by (brick, op type), from a profile.

    What a model's nodes take per op type, to set beside what its bricks'
    take (`python -m benchmarks.ort_chains --op_types`). `owner` maps a
    node to its brick (`Owners`); None: every node to brick None.

    Raises:
        MeasurementError: If no run is left to count.
    """
    counted, kernels = kernel_events(events, skip_runs)
    out: dict[tuple[int | None, str], float] = {}
    for node, event in kernels:
        key = (owner(node) if owner else None, event["args"].get("op_name"))
        out[key] = out.get(key, 0.0) + event["dur"] / counted
    return out


def profile_op_times(
    path: str | os.PathLike,
    settings: settings_lib.RunSettings,
    runs: int = 20,
    config: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Kernel microseconds per run by op type of one file, from `runs`
    profiled runs after `WARMUP_RUNS` (ORT's profiler: for attribution
    only). A whole model's, to set beside its bricks' (`op_kernel_times`
    of a chain's profile)."""
    with tempfile.TemporaryDirectory(prefix="ort-ops-") as folder:
        timer = ort_timing.OrtTimer(
            path,
            settings,
            profile_prefix=os.path.join(folder, "profile"),
            session_config=config,
        )
        session = timer.sessions[0]
        names = [i.name for i in session.get_inputs()]
        feed = dict(zip(names, timer.inputs[0], strict=True))
        for _ in range(WARMUP_RUNS + runs):
            session.run(None, feed)
        with open(session.end_profiling(), encoding="utf-8") as f:
            events = json.load(f)
    found = op_kernel_times(events, WARMUP_RUNS)
    return {op: us for (_, op), us in found.items()}


def kernel_events(
    events: Sequence[Mapping], skip_runs: int
) -> tuple[int, list[tuple[str, Mapping]]]:
    """(runs counted, [(node name, event)] of the kernels of those runs).

    Raises:
        MeasurementError: If no run is left to count.
    """
    runs = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    if len(runs) <= skip_runs:
        raise MeasurementError(
            f"The profile holds {len(runs)} runs, none after the "
            f"{skip_runs} of warm-up."
        )
    start = runs[skip_runs]
    kernels = [
        (event["name"].removesuffix("_kernel_time"), event)
        for event in events
        if event.get("cat") == "Node"
        and event.get("name", "").endswith("_kernel_time")
        and event["ts"] >= start
    ]
    return len(runs) - skip_runs, kernels


def attribute(total_ms: float, times: KernelTimes) -> Attribution:
    """Splits `total_ms` in proportion to profiled kernel times.

    Args:
        total_ms: The chain's time per call, unprofiled.
        times: Its profiled kernel times.

    ORT's profiler gives whole microseconds, so a chain of a few tiny
    nodes (one small brick alone) can profile at 0 us in every run: then
    each node that ran gets the same share. A chain with no node left
    (ORT removed every one, as an identity brick's) is all edge: its
    bricks cost nothing.

    Returns:
        The attribution: bricks and edges sum to `total_ms`.
    """
    kernels = times.total_us
    brick_us, edge_us = times.brick_us, times.edge_us
    if kernels <= 0:  # Under 1 us each: by node count.
        brick_us = tuple(float(n) for n in times.brick_nodes)
        edge_us = float(times.edge_nodes)
    weight = sum(brick_us) + edge_us
    if weight <= 0:  # No node ran at all.
        brick_us, edge_us, weight = (0.0,) * len(brick_us), 1.0, 1.0
    scale = total_ms / weight
    return Attribution(
        total_ms=total_ms,
        brick_ms=tuple(us * scale for us in brick_us),
        edge_ms=edge_us * scale,
        profiled_ms=kernels / 1e3,
    )


class Owners:
    """The brick of each node ORT runs, across its fusions.

    ORT names a fused node after one of the nodes it replaces, and a node
    of its NCHWc layout after the tensor it writes (`<tensor>_nchwc`).
    When a convolution is fused with the activation of the next brick
    (bricks of single layers), that tensor is the activation's: by its
    name the fused node would belong to the activation's brick, whose
    count in a model can be another. So the chain is also optimised
    without the layout transform (`ORT_ENABLE_EXTENDED`), where a fused
    node keeps the name of the convolution (the node with the weights),
    and each tensor there names the brick of the node that writes it.
    A name found in neither is read by `ort_chain_graph.brick_of`.

    Only that graph's nodes are read, so ORT is given the chain's
    skeleton (`skeleton`): its weights of `SKELETON_MIN_BYTES` or more
    read as zeros from a sparse file, nothing packed for the kernels
    (`session.disable_prepacking`), the optimised graph's weights
    written to the null device. Fusions look at the kept small constants
    (shapes, epsilons, clip bounds), not at weights. With the weights
    read and packed, opening it cost more than opening the chain's timed
    one: 0.8-1.8 s for VGG16's chain at G=1 (499 MiB of weights),
    against 0.2-0.8 s; on the skeleton, 0.06-0.07 s.

    Args:
        model: The chain's merged graph (`onnx.ModelProto`), or its
            `.onnx` file.
        settings: Run settings (threads) of the chain's sessions.
    """

    def __init__(
        self,
        model: str | os.PathLike | Any,
        settings: settings_lib.RunSettings,
    ) -> None:
        import onnx

        if isinstance(model, (str, os.PathLike)):
            model = onnx.load(str(model))
        ort = ort_session.import_onnxruntime()
        options = ort_session.session_options(
            ort, settings.intra_op_threads, settings.inter_op_threads
        )
        options.graph_optimization_level = (
            ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        )
        options.log_severity_level = 3
        options.add_session_config_entry("session.disable_prepacking", "1")
        with tempfile.TemporaryDirectory(prefix="ort-chain-") as folder:
            options.optimized_model_filepath = os.path.join(
                folder, "extended.onnx"
            )
            # The weights go to a file of their own, never read back: a
            # link to the null device where one can be made, so that ORT
            # writes them nowhere (a chain holds up to 512 MiB of them).
            weights = "weights.bin"
            with contextlib.suppress(OSError, NotImplementedError):
                os.symlink(os.devnull, os.path.join(folder, weights))
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name",
                weights,
            )
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_"
                "bytes",
                "1024",
            )
            ort.InferenceSession(
                skeleton(model, folder),
                options,
                providers=["CPUExecutionProvider"],
            )
            graph = onnx.load(
                options.optimized_model_filepath, load_external_data=False
            ).graph
        self.nodes: dict[str, int | None] = {}
        self.tensors: dict[str, int | None] = {}
        for node in graph.node:
            brick = ort_chain_graph.brick_of(node.name)
            self.nodes[node.name] = brick
            for tensor in node.output:
                self.tensors[tensor] = brick

    def __call__(self, name: str) -> int | None:
        """The brick of the node `name` (None: an edge of the chain)."""
        if name in self.nodes:
            return self.nodes[name]
        tensor = name.removesuffix(_NCHWC)
        if tensor != name and tensor in self.tensors:
            return self.tensors[tensor]
        return ort_chain_graph.brick_of(name)


def skeleton(model: Any, folder: str | os.PathLike) -> str:
    """Writes `model` into `folder` with its weights as zeros; its path.

    Every initializer of `SKELETON_MIN_BYTES` or more held in the file
    (`raw_data`) becomes external data of a sparse file of zeros
    (`zeros.bin`, no byte of it written), with its name, type and shape
    kept; smaller ones are copied. Nothing of the weights is copied.
    """
    import onnx

    out = onnx.ModelProto()
    _copy_fields(model, out, skip="graph")
    _copy_fields(model.graph, out.graph, skip="initializer")
    offset = 0
    for tensor in model.graph.initializer:
        size = _raw_bytes(tensor)
        if size < SKELETON_MIN_BYTES:
            out.graph.initializer.add().CopyFrom(tensor)
            continue
        stub = out.graph.initializer.add()
        stub.name = tensor.name
        stub.data_type = tensor.data_type
        stub.dims.extend(tensor.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for key, value in (
            ("location", _ZEROS),
            ("offset", str(offset)),
            ("length", str(size)),
        ):
            entry = stub.external_data.add()
            entry.key, entry.value = key, value
        offset += -(-size // 4096) * 4096
    with open(os.path.join(folder, _ZEROS), "wb") as zeros:
        zeros.truncate(offset)
    path = os.path.join(folder, "skeleton.onnx")
    with open(path, "wb") as f:
        f.write(out.SerializeToString())
    return path


def _raw_bytes(tensor: Any) -> int:
    """Bytes of an initializer held in `raw_data` (0 if held otherwise),
    from its shape: reading `raw_data` would copy it."""
    import numpy as np
    import onnx

    if tensor.data_location == onnx.TensorProto.EXTERNAL or not (
        tensor.HasField("raw_data")
    ):
        return 0
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    return int(np.prod(tensor.dims, dtype=np.int64)) * dtype.itemsize


def _copy_fields(source: Any, target: Any, skip: str) -> None:
    """Copies every set field of a protobuf message but `skip`."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        repeated = getattr(field, "is_repeated", None)
        if repeated is None:  # protobuf before 5.29
            repeated = field.label == field.LABEL_REPEATED
        if repeated:
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


class ChainProfile:
    """The profiled runs of a chain's session, a few per `sample()`.

    A sampler (`sampling.Sampler`): `done` after `runs` profiled runs
    (after `WARMUP_RUNS` more the first call makes), `result()` the wall
    time of the profiled runs (slower than the chain's: the profiler's
    cost), `kernel_times()` what the runs' nodes took; reading them ends
    the profiling of `sessions`.

    Args:
        model: The chain's merged graph, or its `.onnx` file (for
            `Owners`).
        bricks: Bricks in the chain.
        settings: Run settings (threads) of the chain's timer.
        feed: {input name: array} to run the chain on.
        runs: Profiled runs wanted.
        sessions: The chain's sessions, opened with profiling on (see
            `ort_session.session_for`): the first is run here, and every
            one stops profiling when the profile is read.
        folder: The temporary folder their profiles are written to,
            removed once read.
    """

    def __init__(
        self,
        model: str | os.PathLike | Any,
        bricks: int,
        settings: settings_lib.RunSettings,
        feed: Mapping[str, object],
        runs: int = 20,
        *,
        sessions: Sequence[Any],
        folder: tempfile.TemporaryDirectory,
    ) -> None:
        self._folder = folder
        self._sessions = list(sessions)
        self.session = self._sessions[0]
        start = time.perf_counter()
        self.owners = Owners(model, settings)
        self._bricks = bricks
        self._feed = dict(feed)
        self._wanted = max(1, runs)
        self._samples: list[float] = []
        self._events: list[dict] | None = None
        # Mapping nodes to bricks, and sample() calls (warm-up included).
        self.seconds = time.perf_counter() - start

    @property
    def done(self) -> bool:
        """Whether the wanted profiled runs are made."""
        return len(self._samples) >= self._wanted

    def sample(self) -> list[float]:
        """Makes a few profiled runs; returns their wall ms."""
        start = time.perf_counter()
        if self._events is not None:
            raise MeasurementError("The chain's profile has been read.")
        if not self._samples:
            for _ in range(WARMUP_RUNS):
                self.session.run(None, self._feed)
        batch = []
        for _ in range(min(RUNS_PER_SAMPLE, self._wanted - len(self._samples))):
            begin = time.perf_counter_ns()
            self.session.run(None, self._feed)
            batch.append((time.perf_counter_ns() - begin) / 1e6)
        self._samples += batch
        self.seconds += time.perf_counter() - start
        return batch

    def result(self) -> stats.Timing:
        """The profiled runs' wall times (the profiler's cost included)."""
        if not self._samples:
            raise MeasurementError("No profiled runs of the chain yet.")
        return stats.summarize(self._samples, noisy=False)

    def op_times(self) -> dict[tuple[int | None, str], float]:
        """`op_kernel_times` of the profiled runs (read by
        `kernel_times`, which ends profiling)."""
        return op_kernel_times(self.events(), WARMUP_RUNS, owner=self.owners)

    def events(self) -> list[dict]:
        """ORT's profile of the runs (warm-up included); ends profiling."""
        self.kernel_times()
        return self._events

    def kernel_times(self) -> KernelTimes:
        """What the profiled runs' nodes took; ends profiling."""
        if self._events is None:
            start = time.perf_counter()
            # Every session stops profiling; the first one's runs count.
            traces = [session.end_profiling() for session in self._sessions]
            with open(traces[0], encoding="utf-8") as f:
                self._events = json.load(f)
            self._folder.cleanup()
            self.seconds += time.perf_counter() - start
        return kernel_times(
            self._events, self._bricks, WARMUP_RUNS, owner=self.owners
        )


class OrtChain:
    """A chain of brick files on ONNX Runtime: timed whole, split by profile.

    Args:
        paths: The bricks' `.onnx` files, in chain order (the models'
            order: see `ort_chain_graph`).
        settings: Run settings with `backend="onnxruntime"`.
        folder: Where the chain's `.onnx` file is written, to be kept;
            None: no file (`path` None), its sessions open it from memory.
            A campaign reads each chain once, and writes none: the 13
            models' 836 chained bricks at G=1 are 1.9 GiB a run.
        name: Its stem, which messages name it by.
        options: Sampling options of the chain's timer.
        id_bounds: Per brick, the exclusive id bound per input (None: no
            bound), as `onnx_files.OnnxFile.id_bounds`; None: none.
        profile_runs: Profiled runs the attribution is taken from.
        session_config: Session configuration entries of both sessions.
        feed: Feed bricks with earlier bricks' outputs (see
            `ort_chain_graph.merge`).
        segments: Per brick, its segment (its model): bricks read only
            their own segment's outputs (see `ort_chain_graph.merge`).

    Raises:
        ChainGraphError: If the files cannot be merged.
        MeasurementError: If ORT cannot load or run the chain.
    """

    def __init__(
        self,
        paths: Sequence[str | os.PathLike],
        settings: settings_lib.RunSettings,
        folder: str | os.PathLike | None,
        name: str = "chain",
        options: TimingOptions | None = None,
        *,
        id_bounds: Sequence[Sequence[int | None] | None] | None = None,
        profile_runs: int = 20,
        session_config: Mapping[str, str] | None = None,
        feed: bool = True,
        segments: Sequence[Hashable] | None = None,
    ) -> None:
        start = time.perf_counter()
        # ORT checks the graph as it loads it (MeasurementError).
        self.graph = ort_chain_graph.merge(
            paths, feed=feed, segments=segments, check=False
        )
        self.name = name
        model = self.graph.model.SerializeToString()
        self.path = None if folder is None else Path(folder) / f"{name}.onnx"
        if self.path is not None:  # The same bytes, kept.
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_bytes(model)
        self.merge_seconds = time.perf_counter() - start
        bounds = None
        if id_bounds is not None:
            bounds = [
                None if id_bounds[b] is None else id_bounds[b][j]
                for b, j in self.graph.inputs
            ]
        start = time.perf_counter()
        folder = tempfile.TemporaryDirectory(prefix="ort-chain-")
        self.timer = ort_timing.OrtTimer(
            self.path or f"{name}.onnx",
            settings,
            options,
            id_bounds=bounds,
            session_config=session_config,
            profile_prefix=os.path.join(folder.name, "profile"),
            model=model,
        )
        session = self.timer.sessions[0]
        feed_values = dict(
            zip(
                [i.name for i in session.get_inputs()],
                self.timer.inputs[0],
                strict=True,
            )
        )
        self.session_seconds = time.perf_counter() - start
        self.profile = ChainProfile(
            self.graph.model,
            self.graph.bricks,
            settings,
            feed_values,
            profile_runs,
            sessions=self.timer.sessions,
            folder=folder,
        )

    @property
    def seconds(self) -> float:
        """Everything this chain cost so far: merging, sessions, runs."""
        return (
            self.merge_seconds
            + self.session_seconds
            + self.timer.prepare_seconds
            + self.timer.sampling_seconds
            + self.profile.seconds
        )

    @property
    def done(self) -> bool:
        """Whether the profiled runs are made and the timer is done."""
        return self.profile.done and self.timer.done

    def sample(self) -> list[float]:
        """Profiled runs until they are made (then profiling ends), then
        the timer's samples; returns what this call took, in ms."""
        if not self.profile.done:
            batch = self.profile.sample()
            if self.profile.done:
                self.profile.kernel_times()  # Ends the profiling.
            return batch
        return self.timer.sample()

    def result(self) -> stats.Timing:
        """The chain's timing (the timer's; see `sample`)."""
        return self.timer.result()

    def attribution(self) -> Attribution:
        """Splits the chain's timed median among its bricks (see module).

        Raises:
            MeasurementError: If the chain is not timed or profiled yet.
        """
        if not self.timer.samples:
            raise MeasurementError(f"No samples of chain {self.name}.")
        times = self.profile.kernel_times()
        return attribute(self.timer.result().median_ms, times)
