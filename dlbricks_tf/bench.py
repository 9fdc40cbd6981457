"""Bench: time the bricks of a suite that the store does not hold yet.

Each brick is built fresh (`brick.build(batch_size)`), timed with the
harness of `dlbricks_tf.timing` and committed to the store as soon as it
finishes, so a campaign stopped half way resumes where it stopped and a new
model costs only its new bricks.

Example:
    configure_threads(settings.intra_op_threads, settings.inter_op_threads)
    with Store(path) as store:
        time_suite(suite, store, settings, system_fingerprint())
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from dlbricks_tf import settings as settings_lib
from dlbricks_tf import timing
from dlbricks_tf.fingerprint import SystemFingerprint
from dlbricks_tf.stats import Timing
from dlbricks_tf.store import Store
from dlbricks_tf.suite import Suite


@dataclasses.dataclass(frozen=True)
class BenchSummary:
    """What one `time_suite` call did.

    Attributes:
        timed: Signatures timed by this call, in order.
        skipped: Signatures already stored (not timed again).
        noisy: Timed signatures whose timing never settled.
        wall_s: Wall-clock seconds spent, building bricks included.
    """

    timed: tuple[str, ...]
    skipped: tuple[str, ...]
    noisy: tuple[str, ...]
    wall_s: float


def time_suite(
    suite: Suite,
    store: Store,
    settings: settings_lib.RunSettings,
    fingerprint: SystemFingerprint,
    options: timing.TimingOptions | None = None,
    *,
    accept_noisy: bool = False,
    check_settings: bool = True,
    on_result: Callable[[str, Timing], None] | None = None,
) -> BenchSummary:
    """Times every brick of `suite` missing from `store`, committing each.

    Args:
        suite: The unique bricks (or a shard of them, see `Suite.shard`).
        store: Where results are read and written.
        settings: Run settings in force in this process.
        fingerprint: This machine's fingerprint.
        options: Sampling options of the harness.
        accept_noisy: Count stored noisy results as done (else retime them).
        check_settings: Verify `settings` against the process first.
        on_result: Called with (signature, timing) after each commit.

    Returns:
        What was timed and skipped.

    Raises:
        MeasurementError: If a brick cannot be timed under `settings`.
    """
    start = time.perf_counter()
    todo = store.missing(
        suite.signatures, settings, fingerprint, accept_noisy=accept_noisy
    )
    wanted = set(todo)
    skipped = tuple(s for s in suite.signatures if s not in wanted)
    noisy = []
    for entry in suite.entries:
        if entry.signature not in wanted:
            continue
        model = entry.brick.build(batch_size=settings.batch_size)
        result = timing.time_model(
            model, settings, options, check_settings=check_settings
        )
        store.put(entry.signature, settings, fingerprint, result)
        if result.noisy:
            noisy.append(entry.signature)
        if on_result is not None:
            on_result(entry.signature, result)
    return BenchSummary(
        timed=tuple(todo),
        skipped=skipped,
        noisy=tuple(noisy),
        wall_s=time.perf_counter() - start,
    )
