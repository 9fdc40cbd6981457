"""An ONNX Runtime brick campaign: bricks timed in chains, split by profile.

`time_ort_chains` is ONNX Runtime's side of `brick_timing.time_bricks`
under the chain protocol. A brick alone in its session pays what its
model never does: layout changes at its edges and the nodes ORT fuses
across a boundary inside the model (MobileNetV2's bricks, each in its own
session, summed to 1.16x the model; chained, 1.02x). So the bricks are
merged into chains (`ort_chain.OrtChain`: one ONNX graph in which each
brick reads what the bricks before it of the same model wrote), each
chain timed whole, and its time split among its bricks by ORT's profiler.

Grouping. Bricks are built (each `build()` returns an
`onnx_files.OnnxFile`; converting is the caller's cost, not the
campaign's) in the order given, the models' order, and chained in that
order: at most `TimingOptions.chain_links` bricks and `MAX_CHAIN_BYTES`
of ONNX files to a chain (protobuf cannot hold more than 2 GiB, and the
merged graph is held in memory twice). A brick's segment is the first
model of `weights` that counts it: a brick reads only outputs of its own
segment's bricks.

A chain that cannot be merged or loaded is split into chains of one
brick each, so that a brick ORT cannot load is recorded as failed
(`on_failure`) and the others are timed.

Rounds. With `between` (a whole model sampled beside its bricks) every
chain of the call is sampled side by side, one batch of each per round,
then `between`; without it, one chain at a time. A chain is done when its
timer is (to the options' precision, or a cap: then noisy, and it is
timed once more in the same rounds, the more precise kept) and its
profiled runs are made. Its bricks are then handed to `on_result`: each
brick's timing is the chain's timing scaled by the brick's share of it,
so it carries the chain's relative precision and its noisy flag.

Layout. The NCHWc reorders a chain ran as its edges are no brick's; each
is handed to `on_layout` under its key (`ort_layout.reorder_key`), timed
as a brick is, so that a model's estimate can add the reorders its own
graph runs (`ort_layout.price`).

Importing this module imports neither TensorFlow nor ONNX Runtime.

Example:
    summary = time_ort_chains(
        [ChainedBrick(key, build) for key, build in bricks],
        settings, options, weights={"m": counts}, on_result=commit)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib
from dlbricks_tf.measuring import ort_chain, ort_layout, rounds
from dlbricks_tf.measuring.sampling import MeasurementError, TimingOptions
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.database import StoreError

# ONNX bytes (the bricks' files) in one chain, at most; a brick larger
# than that is a chain of its own.
MAX_CHAIN_BYTES = 512 * 2**20
# Profiled runs each chain's attribution is taken from: on 11 models of
# the corpus, 4 gave the estimates of 20 within 1-4% (per model), for
# 0.6x the chains' cost.
PROFILE_RUNS = 4
# Errors that are no brick's fault: they end the campaign.
_NOT_A_BRICK_FAULT = (StoreError, process_lib.ThreadPoolError)


@dataclasses.dataclass(frozen=True)
class OrtBrick:
    """A brick to chain: its key, and how to get its ONNX file.

    Attributes:
        key: Its signature.
        build: Returns its `onnx_files.OnnxFile`.
    """

    key: str
    build: Callable[[], Any]


@dataclasses.dataclass(frozen=True)
class OrtCampaignSummary:
    """What one `time_ort_chains` call did.

    Attributes:
        timed: Keys handed to `on_result`, in order.
        noisy: Timed keys whose chain did not settle.
        failed: Keys handed to `on_failure`.
        chains: Chains made (a chain that could not be made, and was
            split into chains of one brick, not counted).
        setup_s: Seconds merging chains, opening their sessions and
            warming them up (converting not counted).
        sampling_s: Seconds taking samples and profiled runs.
        stopped: Whether `stop` ended the call early.
        passes, passes_left_out: Always 0: ONNX Runtime's chains keep
            every sample (`AdaptiveSampling.leaves_out_disturbed`).
    """

    timed: tuple[str, ...] = ()
    noisy: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    chains: int = 0
    setup_s: float = 0.0
    sampling_s: float = 0.0
    stopped: bool = False
    passes: int = 0
    passes_left_out: int = 0


def segments_of(
    keys: Sequence[str], weights: Mapping[str, Mapping[str, int]] | None
) -> list[str]:
    """Per key, the first model of `weights` that counts it ("" if none)."""
    first: dict[str, str] = {}
    for model, counts in (weights or {}).items():
        for key in counts:
            first.setdefault(key, model)
    return [first.get(key, "") for key in keys]


def brick_timing(chain: Timing, share: float) -> Timing:
    """A brick's timing: its chain's, scaled by the brick's share of it.

    The share is that of the brick's nodes in the chain's profiled kernel
    time (`ort_chain.attribute`); every sample millisecond scales alike,
    so the relative precision and the noisy flag are the chain's.
    """
    if not 0.0 <= share <= 1.0:
        raise MeasurementError(
            f"A brick's share of its chain must be in [0, 1]. Received: {share}"
        )
    return chain.scaled(share)


class _Chain:
    """One chain in flight: its bricks, its `OrtChain`, its first timing."""

    def __init__(self, keys: list[str], chain: ort_chain.OrtChain) -> None:
        self.keys = keys
        self.chain = chain
        self.first_noisy: Timing | None = None

    @property
    def done(self) -> bool:
        return self.chain.done

    def sample(self) -> None:
        self.chain.sample()


def _noisy(item: _Chain) -> bool:
    """Whether the chain's timer ended without settling."""
    return item.chain.timer.result().noisy


def _groups(
    built: list[tuple[str, Any]], links: int
) -> list[list[tuple[str, Any]]]:
    """`built` cut into chains of at most `links` bricks and
    `MAX_CHAIN_BYTES` of files, in order."""
    groups: list[list[tuple[str, Any]]] = []
    pending: list[tuple[str, Any]] = []
    size = 0
    for key, onnx in built:
        grow = Path(onnx.path).stat().st_size
        if pending and (len(pending) >= links or size + grow > MAX_CHAIN_BYTES):
            groups.append(pending)
            pending, size = [], 0
        pending.append((key, onnx))
        size += grow
    if pending:
        groups.append(pending)
    return groups


def time_ort_chains(
    bricks: Sequence[OrtBrick],
    settings: settings_lib.RunSettings,
    options: TimingOptions | None = None,
    *,
    weights: Mapping[str, Mapping[str, int]] | None = None,
    between: Callable[[], None] | None = None,
    on_result: Callable[[str, Timing], None] | None = None,
    on_failure: Callable[[str, BaseException], None] | None = None,
    stop: Callable[[], bool] | None = None,
    scale: Any = None,
    session_config: Mapping[str, str] | None = None,
    on_layout: Callable[[str, Timing], None] | None = None,
) -> OrtCampaignSummary:
    """Times `bricks` on ONNX Runtime in chains (see the module docstring).

    Args:
        bricks: What to time, in chain order (a repeated key is timed once).
        settings: Run settings with `backend="onnxruntime"`.
        options: Sampling options of each chain's timer.
        weights: {model: {signature: count}}: a brick's segment is the
            first model that counts it.
        between: Called once per round (a `rounds.ModelSampler`).
        on_result: Called with (key, timing) as each chain is done.
        on_failure: Called with (key, error) for a brick that cannot be
            built, loaded or timed; None: the error is raised.
        stop: Asked between chains when they go one at a time (no
            `between`); True ends the call after the chain in flight.
        scale: A `reference.ReferenceScale` for the chains' samples.
        session_config: ORT session configuration entries of every chain.
        on_layout: Called with (key, timing) of each NCHWc reorder a
            chain ran as an edge (`ort_layout.edge_reorders`), as its
            chain is done; the timing is the chain's, scaled by one such
            node's share, as a brick's.

    Returns:
        What was timed and failed, and what it cost.
    """
    options = options or TimingOptions()
    unique = list({b.key: b for b in bricks}.values())
    timed: list[str] = []
    noisy: list[str] = []
    failed: list[str] = []
    cost = {"setup": 0.0, "sampling": 0.0, "names": 0}

    def fail(key: str, error: BaseException) -> None:
        if isinstance(error, _NOT_A_BRICK_FAULT) or on_failure is None:
            raise error
        failed.append(key)
        on_failure(key, error)

    built = []
    for brick in unique:
        try:
            built.append((brick.key, brick.build()))
        except _NOT_A_BRICK_FAULT:
            raise
        except Exception as e:  # tf2onnx and Keras raise many types.
            fail(brick.key, e)
    keys = [key for key, _ in built]
    segment = dict(zip(keys, segments_of(keys, weights), strict=True))
    made: list[_Chain] = []

    def make(group: list[tuple[str, Any]]) -> list[_Chain]:
        """The group's chain; or, if it cannot be made, one per brick."""
        start = time.perf_counter()
        try:
            item = _make_chain(
                group,
                settings,
                options,
                cost["names"],
                segment,
                scale,
                session_config,
            )
            made.append(item)
            return [item]
        except _NOT_A_BRICK_FAULT:
            raise
        except Exception as e:  # ONNX, ORT: many types.
            if len(group) == 1:
                fail(group[0][0], e)
                return []
            return [c for one in group for c in make([one])]
        finally:
            cost["names"] += 1
            cost["setup"] += time.perf_counter() - start

    def finish(item: _Chain) -> None:
        result = item.chain.timer.result()
        if item.first_noisy is not None:
            result = rounds.more_precise(item.first_noisy, result)
        try:
            shares = item.chain.attribution()
        except MeasurementError as e:
            for key in item.keys:
                fail(key, e)
            return
        total = shares.total_ms
        for key, ms in zip(item.keys, shares.brick_ms, strict=True):
            # A brick alone in its chain is all of it, up to rounding.
            share = min(ms / total, 1.0) if total > 0 else 0.0
            timing = brick_timing(result, share)
            timed.append(key)
            if timing.noisy:
                noisy.append(key)
            if on_result is not None:
                on_result(key, timing)
        if on_layout is not None and shares.profiled_ms > 0 and total > 0:
            # The shares' scale: the chain's time per profiled microsecond.
            per_us = total / (shares.profiled_ms * 1e3)
            profile = item.chain.profile
            edges = ort_layout.edge_reorders(
                profile.events(), profile.owners, ort_chain.WARMUP_RUNS
            )
            for key, us in edges.items():
                on_layout(
                    key, brick_timing(result, min(us * per_us / total, 1.0))
                )

    def run(chains: list[_Chain]) -> None:
        """Samples `chains` in rounds until each is done."""
        pending = list(chains)
        while pending:
            if between is not None:
                between()
            left = []
            for item in pending:
                start = time.perf_counter()
                try:
                    item.sample()
                except _NOT_A_BRICK_FAULT:
                    raise
                except Exception as e:  # ORT raises many types.
                    for key in item.keys:
                        fail(key, e)
                    continue
                finally:
                    cost["sampling"] += time.perf_counter() - start
                if not item.done:
                    left.append(item)
                elif item.first_noisy is None and _noisy(item):
                    # Timed once more in the same rounds; the more
                    # precise of the two is kept (`rounds.more_precise`).
                    item.first_noisy = item.chain.timer.result()
                    item.chain.timer.restart()
                    left.append(item)
                else:
                    finish(item)
            pending = left

    stopped = False
    groups = _groups(built, options.chain_links)
    if between is not None:
        chains = [c for group in groups for c in make(group)]
        run(chains)
    else:
        for group in groups:
            if stop is not None and stop():
                stopped = True
                break
            run(make(group))
    # A timer's warm-up (its first sample) is setup, as a TF chain's trace.
    warm_up = sum(item.chain.timer.prepare_seconds for item in made)
    return OrtCampaignSummary(
        timed=tuple(timed),
        noisy=tuple(noisy),
        failed=tuple(failed),
        chains=len(made),
        setup_s=cost["setup"] + warm_up,
        sampling_s=cost["sampling"] - warm_up,
        stopped=stopped,
    )


def _make_chain(
    group, settings, options, index, segment, scale, session_config
) -> _Chain:
    """One chain of `group`'s files, its timer on `scale`."""
    keys = [key for key, _ in group]
    chain = ort_chain.OrtChain(
        [onnx.path for _, onnx in group],
        settings,
        None,  # Its sessions open it from memory: no file written.
        f"chain-{index}",
        options,
        id_bounds=[onnx.id_bounds for _, onnx in group],
        profile_runs=PROFILE_RUNS,
        session_config=session_config,
        segments=[segment[key] for key in keys],
    )
    chain.timer.scale = scale
    return _Chain(keys, chain)
