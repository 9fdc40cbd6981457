"""The layout changes a whole model pays on ONNX Runtime, and their price.

ORT runs a model's convolutions in its blocked NCHWc layout, and puts a
reorder (`ReorderInput`, `ReorderOutput`) wherever a tensor passes
between an op that runs blocked and one that does not: in MobileNetV3's
squeeze-and-excite blocks, around the broadcast `Mul` and the
`ReduceMean`. These reorders are no layer's, so no brick holds them, and
in a chain (`ort_chain`) they are its edges, left out: MobileNetV3Small's
60 reorders are 14% of its kernel time, and its bricks summed to
0.74-0.84 of it without them.

A chain holds more of them than its models do (a brick fed from the
chain's inputs, an output no brick reads), so they cannot all go to the
bricks: that overcounted. Instead each model pays its own.

- `model_reorders`: the reorders of a model's own graph, read from one
  profiled run of its skeleton (`ort_chain.skeleton`, weights as zeros)
  optimised as the timed sessions are. Only what ran and on which shapes
  is read, never how long.
- `edge_reorders`: the reorders a chain ran as its edges, with their
  kernel times from the chain's profile.
- `price`: a model's reorders in milliseconds, each at what the same
  reorder (the same op, input and output shapes) took in the chains, or,
  for one no chain ran, at its op's time per element over those that did.

A reorder's key (`reorder_key`) names its op and shapes, e.g.
`nchwc:ReorderOutput:1x576x7x7>1x576x7x7`; a campaign stores each timed
reorder under its key beside the bricks (`ort_campaign`), and
`Store.results(..., layout=True)` reads them back (without it, bricks
only).

Example:
    counts = model_reorders("model-MobileNetV3Small.onnx", settings)
    known = known_ms(store.results(settings, fingerprint, layout=True))
    price(counts, known).ms  # Added once to the model's estimate.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import ort_chain, ort_timing
from dlbricks_tf.measuring.sampling import MeasurementError
from dlbricks_tf.storing.store import LAYOUT_PREFIX as PREFIX

# ORT's NCHWc reorders (domain com.microsoft.nchwc).
REORDER_OPS = ("ReorderInput", "ReorderOutput")


@dataclasses.dataclass(frozen=True)
class LayoutPrice:
    """A model's reorders priced.

    Attributes:
        ms: What they add to the model's estimate.
        reorders: How many the model runs per call.
        exact: Of those, how many were priced at a chain's reorder of the
            same key (the others at their op's time per element).
        unpriced: How many could not be priced (no chain ran a reorder of
            their op): counted at 0.
    """

    ms: float = 0.0
    reorders: int = 0
    exact: int = 0
    unpriced: int = 0


def reorder_key(event: Mapping) -> str | None:
    """The key of a profiled node (None: the node is no reorder).

    Args:
        event: A node's kernel event in ORT's profile (its `args` hold
            `op_name`, `input_type_shape` and `output_type_shape`).
    """
    args = event.get("args", {})
    op = args.get("op_name")
    if op not in REORDER_OPS:
        return None

    def shape(entries) -> str:
        dims = next(iter(entries[0].values())) if entries else []
        return "x".join(str(int(d)) for d in dims)

    return (
        f"{PREFIX}{op}:{shape(args.get('input_type_shape', []))}"
        f">{shape(args.get('output_type_shape', []))}"
    )


def elements(key: str) -> int:
    """The elements a reorder writes, from its key."""
    written = key.rsplit(">", 1)[-1]
    return math.prod(int(d) for d in written.split("x")) if written else 0


def model_reorders(
    path: str | os.PathLike,
    settings: settings_lib.RunSettings,
    id_bounds: Sequence[int | None] | None = None,
) -> dict[str, int]:
    """{key: count} of the reorders a model's file runs per call.

    The file's skeleton is opened as the timed sessions open a file (an
    `ort_timing.OrtTimer`: every optimisation, the settings' threads, its
    synthetic inputs of `settings.batch_size`), with profiling on, and
    run once; nothing is timed.

    Raises:
        MeasurementError: If ORT cannot load or run it.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    with tempfile.TemporaryDirectory(prefix="ort-layout-") as folder:
        # The timer's session and synthetic inputs, as `run` makes them.
        timer = ort_timing.OrtTimer(
            ort_chain.skeleton(model, folder),
            settings,
            id_bounds=id_bounds,
            profile_prefix=os.path.join(folder, "profile"),
            session_config={"session.disable_prepacking": "1"},
        )
        session = timer.sessions[0]
        names = [i.name for i in session.get_inputs()]
        try:
            session.run(None, dict(zip(names, timer.inputs[0], strict=True)))
        except Exception as e:  # ORT raises its own types.
            raise MeasurementError(
                f"ONNX Runtime cannot run the skeleton of {str(path)!r}: "
                f"{type(e).__name__}: {str(e).strip()[:200]}"
            ) from e
        with open(session.end_profiling(), encoding="utf-8") as f:
            events = json.load(f)
    counts: dict[str, int] = collections.Counter()
    for _, event in ort_chain.kernel_events(events, 0)[1]:
        key = reorder_key(event)
        if key is not None:
            counts[key] += 1
    return dict(counts)


def edge_reorders(
    events: Sequence[Mapping],
    owner: Callable[[str], int | None],
    skip_runs: int,
) -> dict[str, float]:
    """{key: kernel microseconds per run of one node} of a chain's edge
    reorders (the nodes of no brick), a key's nodes averaged.

    Args:
        events: The chain's profile.
        owner: Its nodes' bricks (`ort_chain.Owners`).
        skip_runs: Warm-up runs to leave out.
    """
    counted, kernels = ort_chain.kernel_events(events, skip_runs)
    per_node: dict[str, float] = collections.defaultdict(float)
    keys: dict[str, str] = {}
    for node, event in kernels:
        key = reorder_key(event)
        if key is None or owner(node) is not None:
            continue
        per_node[node] += event["dur"] / counted
        keys[node] = key
    found: dict[str, list[float]] = collections.defaultdict(list)
    for node, us in per_node.items():
        found[keys[node]].append(us)
    return {key: sum(us) / len(us) for key, us in found.items()}


def price(counts: Mapping[str, int], known: Mapping[str, float]) -> LayoutPrice:
    """A model's reorders in milliseconds.

    Args:
        counts: {key: count} of the model's reorders (`model_reorders`).
        known: {key: ms} of reorders timed in chains.

    Returns:
        Each at its key's time if known; else at its op's milliseconds
        per element over the known ones (their total over their elements);
        0 if no reorder of its op is known.
    """
    per_element = {}
    for op in REORDER_OPS:
        mine = [k for k in known if k.startswith(f"{PREFIX}{op}:")]
        written = sum(elements(k) for k in mine)
        if written > 0:
            per_element[op] = sum(known[k] for k in mine) / written
    ms, exact, unpriced = 0.0, 0, 0
    for key, count in counts.items():
        if key in known:
            ms += count * known[key]
            exact += count
            continue
        op = key.removeprefix(PREFIX).split(":", 1)[0]
        if op in per_element:
            ms += count * per_element[op] * elements(key)
        else:
            unpriced += count
    return LayoutPrice(
        ms=ms,
        reorders=sum(counts.values()),
        exact=exact,
        unpriced=unpriced,
    )


def known_ms(results: Mapping[str, Any]) -> dict[str, float]:
    """{key: ms} of reorders' timings ({key: Timing}), e.g.
    `Store.results(settings, fp, layout=True)`."""
    return {key: timing.center_ms for key, timing in results.items()}
