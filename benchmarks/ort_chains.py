r"""Bricks on ONNX Runtime: chains (many in one graph) against one each.

For each model, its unique bricks are converted (`brick_timing`'s files,
kept per signature in `--out/onnx/`, channels-first at their convolution
edges) and so is the whole model. Then, in the same interleaved rounds
(`sampling.time_interleaved`), the whole models, every brick in its own
session (what `run --backend=onnxruntime` times today) and the chains
(`dlbricks_tf.measuring.ort_chain`: the unique bricks of all the models
in the models' order, at most --chain_links to a graph, each brick fed by
the bricks before it, the chain timed whole and its time split among its
bricks by ORT's profiler) are timed. Each model's estimate (its bricks'
times weighted by their counts) is divided by its measured time, for both
ways, and each way's cost (sessions, warm-up, sampling; for chains also
merging and the profiled runs) is divided by the cost of timing the whole
models; converting to ONNX is counted apart. Medians throughout.

--models (keras.applications names; `make run`'s three by default),
--granularity (one G), --intra_op_threads (1 by default here), --fuse and
--chain_links are the command line's flags; --allow_spinning sets ORT's
`session.intra_op.allow_spinning` in every session.

Usage:
    python -m benchmarks.ort_chains --models=MobileNetV2,ResNet50 --fuse \
        --intra_op_threads=1
"""

from __future__ import annotations

import collections
import json
import os
import time
from pathlib import Path

from absl import app, flags

from dlbricks_tf.cli import (
    model_flags,
    settings_flags,
    shared_flags,
    timing_flags,
)

# Shown by --helpshort.
for _name in (
    "models",
    "granularity",
    "intra_op_threads",
    "fuse",
    "out",
    "chain_links",
):
    flags.declare_key_flag(_name)
_ATTRIBUTION_RUNS = flags.DEFINE_integer(
    "attribution_runs",
    20,
    "Profiled runs of each chain its attribution is taken from.",
    lower_bound=1,
)
_SPINNING = flags.DEFINE_enum(
    "allow_spinning",
    "default",
    ["default", "0", "1"],
    "ONNX Runtime's session.intra_op.allow_spinning in every session: "
    "'1' idle intra-op threads spin (ORT's default), '0' they sleep.",
)
_SHARED = flags.DEFINE_bool(
    "shared_threads",
    False,
    "Every session of the process on one pair of thread pools "
    "(`ort_session.share_threads`); off: each on its own, spinning "
    "stopped when a run ends (as the command line does).",
)
_SEGMENTS = flags.DEFINE_bool(
    "model_segments",
    True,
    "A brick in a chain reads only outputs of bricks of its own model (the "
    "first that has it); off: of any brick before it.",
)
_OP_TYPES = flags.DEFINE_bool(
    "op_types",
    False,
    "Also print, per model and op type, the kernel time ORT's profiler "
    "gives its whole model (20 profiled runs) and its bricks in the chains "
    "(times their counts), and the chains' edges: what the model pays that "
    "its bricks do not, and the reverse (the profiler's times, for "
    "attribution only).",
)
_PER_BRICK = flags.DEFINE_bool(
    "per_brick",
    True,
    "Also time every brick in its own session (today's way), in the same "
    "rounds.",
)


def _convert(name, granularity, settings, folder: Path):
    """A model's decomposition and files; conversion seconds.

    Returns:
        (unique signatures in model order, counts, {signature: OnnxFile},
        whole model's OnnxFile, conversion seconds).
    """
    import dlbricks_tf
    from dlbricks_tf.measuring import brick_timing
    from dlbricks_tf.models import corpus

    model = corpus.application(name)
    d = dlbricks_tf.decompose(model, granularity, fuse=shared_flags.FUSE.value)
    counts = collections.Counter(b.signature for b in d.bricks)
    start = time.perf_counter()
    files = {}
    for b in d.bricks:
        if b.signature not in files:
            files[b.signature] = brick_timing.brick_onnx_file(
                b.build, folder, b.signature, settings.batch_size
            )
    whole = brick_timing.model_onnx_file(
        model, folder, name, settings.batch_size
    )
    return list(files), counts, files, whole, time.perf_counter() - start


def _timer(path, settings, options, config, bounds=None):
    """An OrtTimer, and the seconds its sessions took to open."""
    from dlbricks_tf.measuring import ort_timing

    start = time.perf_counter()
    timer = ort_timing.OrtTimer(
        path, settings, options, id_bounds=bounds, session_config=config
    )
    return timer, time.perf_counter() - start


def _cost(timer, opened_s: float) -> float:
    return opened_s + timer.prepare_seconds + timer.sampling_seconds


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from dlbricks_tf import errors
    from dlbricks_tf.machine import settings as settings_lib
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.measuring import ort_chain
    from dlbricks_tf.measuring.sampling import TimingOptions, time_interleaved
    from dlbricks_tf.running import job

    settings = settings_lib.RunSettings.default(
        settings_flags.BATCH.value,
        intra_op_threads=settings_flags.INTRA.value,
        inter_op_threads=settings_flags.INTER.value,
        backend="onnxruntime",
    )
    if _SHARED.value:
        from dlbricks_tf.measuring import ort_session

        ort_session.share_threads(settings)
    config = None
    if _SPINNING.value != "default":
        config = {"session.intra_op.allow_spinning": _SPINNING.value}
    out = Path(shared_flags.OUT.value)
    folder = out / "onnx"
    folder.mkdir(parents=True, exist_ok=True)
    granularity = model_flags.one_granularity()
    names = model_flags.MODELS.value or list(job.DEFAULT_MODELS)
    options = TimingOptions()

    models, order, bounds, brick_files, segment = {}, [], {}, {}, {}
    conversion_s = 0.0
    for name in names:
        try:
            sigs, counts, files, whole, seconds = _convert(
                name, granularity, settings, folder
            )
        except errors.Error as e:  # Listed; the others still count.
            print(f"skipped {name}: {str(e).splitlines()[0]}")
            continue
        conversion_s += seconds
        models[name] = {"counts": counts, "whole": whole.path}
        for sig in sigs:
            if sig not in brick_files:
                order.append(sig)
                brick_files[sig] = files[sig].path
                segment[sig] = name
                bounds[sig] = files[sig].id_bounds
    if not models:
        raise SystemExit("ort_chains: no model converted.")

    links = timing_flags.CHAIN_LINKS.value
    groups = [order[i : i + links] for i in range(0, len(order), links)]
    chains = []
    for i, group in enumerate(groups):
        chains.append(
            ort_chain.OrtChain(
                [brick_files[s] for s in group],
                settings,
                None,  # As a campaign: opened from memory, no file.
                f"chain-{i}",
                options,
                id_bounds=[bounds[s] for s in group],
                profile_runs=_ATTRIBUTION_RUNS.value,
                session_config=config,
                segments=[segment[s] for s in group]
                if _SEGMENTS.value
                else None,
            )
        )
    wholes = {
        name: _timer(m["whole"], settings, options, config)
        for name, m in models.items()
    }
    singles = {}
    if _PER_BRICK.value:
        singles = {
            sig: _timer(
                brick_files[sig], settings, options, config, bounds[sig]
            )
            for sig in order
        }
    samplers = [t for t, _ in wholes.values()]
    for chain in chains:
        samplers.append(chain)  # Profiled runs first, then the timer.
    samplers += [t for t, _ in singles.values()]
    time_interleaved(samplers)

    chained, per_node_ms = {}, {}
    chain_rows = []
    for chain, group in zip(chains, groups, strict=True):
        shares = chain.attribution()
        chained.update(zip(group, shares.brick_ms, strict=True))
        # The alternative: the profiler's own times, plus a per-node
        # overhead that makes them sum to the unprofiled total.
        times = chain.profile.kernel_times()
        nodes = sum(times.brick_nodes) + times.edge_nodes
        per_node = (shares.total_ms - times.total_us / 1e3) / nodes
        per_node_ms.update(
            (sig, us / 1e3 + n * per_node)
            for sig, us, n in zip(
                group, times.brick_us, times.brick_nodes, strict=True
            )
        )
        chain_rows.append(
            {
                "bricks": chain.graph.bricks,
                "graph_inputs": len(chain.graph.inputs),
                "graph_outputs": len(chain.graph.outputs),
                "transposed_feeds": chain.graph.transposes,
                "total_ms": shares.total_ms,
                "edge_ms": shares.edge_ms,
                "profiled_kernels_ms": shares.profiled_ms,
                "profiled_run_ms": chain.profile.result().median_ms,
                "seconds": chain.seconds,
                "merge_s": chain.merge_seconds,
                "sessions_s": chain.session_seconds,
                "prepare_s": chain.timer.prepare_seconds,
                "sampling_s": chain.timer.sampling_seconds,
                "profile_s": chain.profile.seconds,
                "samples": len(chain.timer.samples),
            }
        )
    rows = []
    for name, m in models.items():
        timer, _ = wholes[name]
        measured = timer.result().median_ms
        counts = m["counts"]
        row = {"model": name, "measured_ms": measured}
        row["samples"] = len(timer.samples)
        row["cost_s"] = _cost(*wholes[name])
        row["prepare_s"] = timer.prepare_seconds
        row["chain_ms"] = sum(n * chained[s] for s, n in counts.items())
        row["chain_normalized"] = row["chain_ms"] / measured
        # Bricks chained with an earlier model's: timed in its context.
        borrowed = [s for s in counts if segment[s] != name]
        row["borrowed_bricks"] = len(borrowed)
        row["borrowed_share"] = (
            sum(counts[s] * chained[s] for s in borrowed) / row["chain_ms"]
        )
        row["chain_per_node_normalized"] = (
            sum(n * per_node_ms[s] for s, n in counts.items()) / measured
        )
        if singles:
            row["bricks_ms"] = sum(
                n * singles[s][0].result().median_ms for s, n in counts.items()
            )
            row["bricks_normalized"] = row["bricks_ms"] / measured
        rows.append(row)
    cost = {
        "whole_s": sum(_cost(t, s) for t, s in wholes.values()),
        "chains_s": sum(c.seconds for c in chains),
        "bricks_s": sum(_cost(t, s) for t, s in singles.values()),
        "conversion_s": conversion_s,
        "unique_bricks": len(order),
    }
    fp = system_fingerprint()
    report = {
        "settings": settings.to_dict(),
        "allow_spinning": _SPINNING.value,
        "granularity": granularity,
        "fuse": shared_flags.FUSE.value,
        "fingerprint": fp.to_dict(),
        "models": rows,
        "chains": chain_rows,
        # Per unique brick, in chain order: both attributions, so that
        # two runs can be compared brick by brick.
        "bricks": [
            {
                "signature": sig,
                "segment": segment[sig],
                "chain_ms": chained[sig],
                "per_node_ms": per_node_ms[sig],
                "counts": {
                    n: m["counts"].get(sig, 0) for n, m in models.items()
                },
            }
            for sig in order
        ],
        "cost": cost,
    }
    if _OP_TYPES.value:
        report["op_types"] = _op_types(models, chains, groups, settings, config)
    (out / "ort_chains.json").write_text(json.dumps(report, indent=1))
    _print(rows, chain_rows, cost)
    if _OP_TYPES.value:
        _print_op_types(report["op_types"])
    print(f"\nRows: {out / 'ort_chains.json'}")


def _op_types(models, chains, groups, settings, config):
    """Per model: {op: [whole model us, bricks x counts us]}; and the
    chains' edges, {op: us}, over all chains. Kernel times per run."""
    from dlbricks_tf.measuring import ort_chain

    edges: dict[str, float] = collections.Counter()
    bricks = {name: collections.Counter() for name in models}
    for chain, group in zip(chains, groups, strict=True):
        for (b, op), us in chain.profile.op_times().items():
            if b is None or b >= len(group):
                edges[op] += us
                continue
            for name, m in models.items():
                if group[b] in m["counts"]:
                    bricks[name][op] += us * m["counts"][group[b]]
    out = {}
    for name, m in models.items():
        whole = ort_chain.profile_op_times(m["whole"], settings, 20, config)
        ops = set(whole) | set(bricks[name])
        out[name] = {op: [whole.get(op, 0.0), bricks[name][op]] for op in ops}
    return {"models": out, "edges": dict(edges)}


def _print_op_types(found) -> None:
    for name, ops in found["models"].items():
        model = sum(v[0] for v in ops.values())
        summed = sum(v[1] for v in ops.values())
        print(
            f"\n{name}: kernels per model call, whole model {model:.0f} us, "
            f"bricks x counts {summed:.0f} us"
        )
        print("| op | whole model us | bricks x counts us |")
        print("|---|---:|---:|")
        for op, (m, b) in sorted(ops.items(), key=lambda kv: -max(kv[1])):
            print(f"| {op} | {m:.0f} | {b:.0f} |")
    edges = found["edges"]
    print(
        "\nThe chains' edges (no brick's, left out), per op: "
        + ", ".join(f"{op} {us:.0f} us" for op, us in sorted(edges.items()))
    )


def _geomean(values):
    import math

    return math.exp(sum(math.log(v) for v in values) / len(values))


def _print(rows, chain_rows, cost) -> None:
    per_brick = "bricks_normalized" in rows[0]
    print(
        "| model | measured ms | bricks, one session each: ms (normalized) "
        "| chains: ms (normalized) | chains, per-node overhead instead: "
        "normalized | bricks chained with an earlier model (share of the "
        "chain estimate) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        one = (
            f"{r['bricks_ms']:.3f} ({r['bricks_normalized']:.3f})"
            if per_brick
            else "-"
        )
        print(
            f"| {r['model']} | {r['measured_ms']:.3f} | {one} "
            f"| {r['chain_ms']:.3f} ({r['chain_normalized']:.3f}) "
            f"| {r['chain_per_node_normalized']:.3f} "
            f"| {r['borrowed_bricks']} ({r['borrowed_share']:.1%}) |"
        )
    one = (
        f"{_geomean([r['bricks_normalized'] for r in rows]):.3f}"
        if per_brick
        else "-"
    )
    chained = _geomean([r["chain_normalized"] for r in rows])
    per_node = _geomean([r["chain_per_node_normalized"] for r in rows])
    print(f"| geomean | | {one} | {chained:.3f} | {per_node:.3f} | |")
    print(
        "\n| chain | bricks | graph inputs / outputs | fed through a "
        "Transpose | ms | edges ms | profiled kernels ms | profiled run ms "
        "| cost s (merge, sessions, warm-up, sampling, profiled runs) "
        "| samples |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, c in enumerate(chain_rows):
        print(
            f"| {i} | {c['bricks']} | {c['graph_inputs']} / "
            f"{c['graph_outputs']} | {c['transposed_feeds']} "
            f"| {c['total_ms']:.3f} | {c['edge_ms']:.3f} "
            f"| {c['profiled_kernels_ms']:.3f} | {c['profiled_run_ms']:.3f} "
            f"| {c['seconds']:.2f} ({c['merge_s']:.2f}, "
            f"{c['sessions_s']:.2f}, {c['prepare_s']:.2f}, "
            f"{c['sampling_s']:.2f}, {c['profile_s']:.2f}) "
            f"| {c['samples']} |"
        )
    whole = cost["whole_s"]
    print(
        "\nWhole models: "
        + ", ".join(
            f"{r['model']} {r['cost_s']:.2f} s ({r['samples']} samples, "
            f"warm-up {r['prepare_s']:.2f} s)"
            for r in rows
        )
    )
    print(
        f"\nCost, {cost['unique_bricks']} unique bricks: whole models "
        f"{whole:.2f} s; chains {cost['chains_s']:.2f} s "
        f"({cost['chains_s'] / whole:.2f}x)"
        + (
            f"; one session per brick {cost['bricks_s']:.2f} s "
            f"({cost['bricks_s'] / whole:.2f}x)"
            if per_brick
            else ""
        )
        + f"; converting (apart) {cost['conversion_s']:.1f} s"
    )


if __name__ == "__main__":
    flags.FLAGS.set_default("out", "dlbricks_out/ort_chains")
    flags.FLAGS.set_default("intra_op_threads", 1)
    app.run(main)
