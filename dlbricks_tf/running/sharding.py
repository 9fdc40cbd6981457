"""Sharding: which part of a suite this worker times.

A suite is cut into deterministic shards, one per machine:
`dlbricks_tf.cutting.suite.shard_of` gives a worker its part of a suite's
entries, the same for a `Suite` of models (`Suite.shard`) and an exported
suite folder (`SuiteDir.shard`). A worker learns its shard from flags
or, when they are absent, from the engine that started it:

    engine                  index                    count
    Bazel test sharding     TEST_SHARD_INDEX         TEST_TOTAL_SHARDS
    Slurm job array         SLURM_ARRAY_TASK_ID      SLURM_ARRAY_TASK_COUNT
                            - SLURM_ARRAY_TASK_MIN
    Kubernetes Indexed Job  JOB_COMPLETION_INDEX     --num_shards only

Each value is taken from its flag when given, else from the first engine
whose variables are set, in the order of the table: Bazel first, since a
Bazel test sees only the variables Bazel passes it. Values that do not fit
together raise `ShardError`, never a silent fallback to the whole suite.

Example:
    shard = resolve_shard(None, None)  # In a Slurm task of --array=0-2.
    shard.index, shard.count, shard.source   # 1, 3, "Slurm job array"
    suite.shard(shard.index, shard.count)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping

from dlbricks_tf import errors

INDEX_FLAG = "--shard_index"
COUNT_FLAG = "--num_shards"


class ShardError(errors.Error):
    """The shard index and count are missing, malformed or inconsistent."""


@dataclasses.dataclass(frozen=True)
class Shard:
    """One worker's shard and where its numbers came from.

    Unpacks as `(index, count)`.

    Attributes:
        index: This worker's shard, 0 <= index < count.
        count: The number of shards.
        source: What gave the numbers: "flags", "Bazel test sharding",
            "Kubernetes Indexed Job", "Slurm job array", or "default" (no
            sharding: shard 0 of 1).
        details: The flags and variables read, e.g.
            ("SLURM_ARRAY_TASK_ID=4", "SLURM_ARRAY_TASK_COUNT=3").
    """

    index: int
    count: int
    source: str = "default"
    details: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[int]:
        return iter((self.index, self.count))

    def __str__(self) -> str:
        where = self.source
        if self.details:
            where += ": " + ", ".join(self.details)
        return f"shard {self.index} of {self.count} ({where})"


def resolve_shard(
    index: int | None,
    count: int | None,
    environ: Mapping[str, str] = os.environ,
) -> Shard:
    """Returns this worker's shard, from flags or the engine's environment.

    Args:
        index: `--shard_index`, or None to read it from the environment.
        count: `--num_shards`, or None to read it from the environment.
        environ: The environment to read. If Bazel's
            `TEST_SHARD_STATUS_FILE` is set and Bazel's variables are used,
            that file is touched, telling Bazel the test shards.

    Returns:
        The shard; `Shard(0, 1)` when neither flags nor an engine say
        anything.

    Raises:
        ShardError: If a value is not an integer, an index is negative or
            not below the count, a count is below 1, or an index comes
            without a count (JOB_COMPLETION_INDEX without --num_shards) or
            a count without an index.
    """
    details: list[str] = []
    sources: list[str] = []
    engine = None
    if index is None or count is None:  # Flags win: read only what's absent.
        engine = _from_environment(environ)
    # What gave each value, for messages, e.g. "SLURM_ARRAY_TASK_ID=4".
    index_label = count_label = None
    if index is not None:
        index_label = f"{INDEX_FLAG}={index}"
        details.append(index_label)
        sources.append("flags")
    elif engine is not None and engine.index is not None:
        index = engine.index
        details.extend(engine.index_details)
        index_label = ", ".join(engine.index_details)
        if len(engine.index_details) > 1:
            index_label += f" (index {index})"
        sources.append(engine.source)
    if count is not None:
        count_label = f"{COUNT_FLAG}={count}"
        details.append(count_label)
        sources.append("flags")
    elif engine is not None and engine.count is not None:
        count = engine.count
        details.extend(engine.count_details)
        count_label = ", ".join(engine.count_details)
        sources.append(engine.source)
    _check(index, count, index_label, count_label, engine)
    if engine is not None and engine.source == _BAZEL:
        _touch_status_file(environ)
    if index is None:  # Then count is None too (checked).
        return Shard(0, 1)
    source = " and ".join(dict.fromkeys(sources))  # Unique, in order.
    return Shard(index, count, source, tuple(details))


_BAZEL = "Bazel test sharding"
_KUBERNETES = "Kubernetes Indexed Job"
_SLURM = "Slurm job array"


@dataclasses.dataclass(frozen=True)
class _Engine:
    source: str
    index: int | None
    count: int | None
    index_details: tuple[str, ...]
    count_details: tuple[str, ...]
    # What to set when the index comes without a count.
    count_hint: str


def _from_environment(environ: Mapping[str, str]) -> _Engine | None:
    """Reads the first engine whose variables are set (Bazel, Slurm, K8s)."""
    index = _int(environ, "TEST_SHARD_INDEX")
    count = _int(environ, "TEST_TOTAL_SHARDS")
    if index is not None or count is not None:
        return _Engine(
            _BAZEL,
            index,
            count,
            (f"TEST_SHARD_INDEX={index}",),
            (f"TEST_TOTAL_SHARDS={count}",),
            "Bazel sets both: check the test's shard_count",
        )
    task = _int(environ, "SLURM_ARRAY_TASK_ID")
    count = _int(environ, "SLURM_ARRAY_TASK_COUNT")
    if task is not None or count is not None:
        return _slurm(environ, task, count)
    index = _int(environ, "JOB_COMPLETION_INDEX")
    if index is not None:
        return _Engine(
            _KUBERNETES,
            index,
            None,
            (f"JOB_COMPLETION_INDEX={index}",),
            (),
            f"pass {COUNT_FLAG} equal to the Job's completions",
        )
    return None


def _slurm(
    environ: Mapping[str, str], task: int | None, count: int | None
) -> _Engine:
    """Maps a task id to 0..count-1 (an array need not start at 0)."""
    first = _int(environ, "SLURM_ARRAY_TASK_MIN")
    step = _int(environ, "SLURM_ARRAY_TASK_STEP")
    details = [f"SLURM_ARRAY_TASK_ID={task}"]
    index = task
    if task is not None and first:
        details.append(f"SLURM_ARRAY_TASK_MIN={first}")
        index = task - first
    if index is not None and step is not None and step > 1:
        if index % step:
            raise ShardError(
                f"SLURM_ARRAY_TASK_ID={task} is not on the array's step "
                f"SLURM_ARRAY_TASK_STEP={step}: submit a plain range such "
                f"as --array=0-N, or pass {INDEX_FLAG} and {COUNT_FLAG}."
            )
        details.append(f"SLURM_ARRAY_TASK_STEP={step}")
        index //= step
    return _Engine(
        _SLURM,
        index,
        count,
        tuple(details),
        (f"SLURM_ARRAY_TASK_COUNT={count}",),
        f"SLURM_ARRAY_TASK_COUNT is unset: pass {COUNT_FLAG}",
    )


def _int(environ: Mapping[str, str], name: str) -> int | None:
    """Reads an integer variable; unset or empty is None."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ShardError(
            f"{name}={raw!r} is not an integer: fix or unset it, or pass "
            f"{INDEX_FLAG} and {COUNT_FLAG}."
        ) from None


def _check(
    index: int | None,
    count: int | None,
    index_label: str | None,
    count_label: str | None,
    engine: _Engine | None,
) -> None:
    """Raises ShardError unless 0 <= index < count (or both are None)."""
    source = engine.source if engine else None
    if index is None and count is not None:
        raise ShardError(
            f"{count_label} gives a shard count but no shard index: pass "
            f"{INDEX_FLAG}, or run under Bazel sharding, a Kubernetes "
            "Indexed Job or a Slurm job array."
        )
    if index is not None and count is None:
        hint = engine.count_hint if engine else "pass it"
        raise ShardError(
            f"{index_label} gives a shard index but no shard count "
            f"({COUNT_FLAG}): {hint}."
        )
    if count is not None and count < 1:
        raise ShardError(f"{count_label}: the shard count must be 1 or more.")
    if index is not None and index < 0:
        raise ShardError(f"{index_label}: the shard index must be 0 or more.")
    if index is not None and count is not None and index >= count:
        hint = "make the index and count agree"
        if source == _KUBERNETES and not index_label.startswith("--"):
            hint = f"set {COUNT_FLAG} to the Job's completions"
        elif source == _SLURM and not index_label.startswith("--"):
            hint = (
                f"submit a plain range of task ids, e.g. --array=0-{count - 1}"
            )
        raise ShardError(
            f"{index_label} is not below {count_label}: shard indices run "
            f"from 0 to {count - 1}; {hint}."
        )


def _touch_status_file(environ: Mapping[str, str]) -> None:
    """Tells Bazel the test supports sharding (its sharding protocol)."""
    path = environ.get("TEST_SHARD_STATUS_FILE")
    if path:
        with open(path, "a", encoding="utf-8"):
            pass
