r"""Which rule puts measurements minutes apart on one scale: side by side.

The common scale multiplies each batch of samples by state / r, r the
median of the last `reference.WINDOW` readings of the reference workload
(`dlbricks_tf.measuring.reference`). Other rules could use the batch's own
reading, a longer or shorter window, a damped factor, or one part of the
workload. This measures them on the same batches.

Each of --processes processes (one after another, beside the --neighbour)
builds one `Timer` per model of --models, its reference read right
after its calls as `run` reads it, and measures every model --repeats
times in turn, --batches batches each: a model measured again a minute
later, and in another process. Every batch keeps its raw median, the
reading right after its call (of the scale's workload,
`reference.WORKLOAD`), and, read from Python after that, the compute and
memory parts of the matmul-reduce workload and a
reading of the conv block. Each rule then scales the same batches, and a
measurement is the median of its scaled batches. Per rule and model it
prints, as the standard deviation of the measurements' logs (x100, so
about a percentage): within a process (across rounds), between the
processes' means, and of all measurements. A rule that cancels the
machine's drift leaves the smallest spread; `raw` shows how far the host
moved. Then, per model, how its batches move with their readings (the
correlation and slope of their logs, batch by batch).

A uniform slowdown that hits a batch and its readings alike leaves the
window rules' measurements unchanged (tests/scale_rules_test.py); a rule
with a smaller spread here is not biased by that, but by how differently
the host's slowdowns hit the reference and the models.

Usage:
    python -m benchmarks.scale_rules --out=dlbricks_out/scale_rules
    python -m benchmarks.scale_rules --neighbour=memory --processes=4 \
        --repeats=3 --out=dlbricks_out/scale_rules_memory
    python -m benchmarks.scale_rules --evaluate --out=dlbricks_out/scale_rules
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from absl import app, flags

from benchmarks import neighbour_flags, repeat_flags
from benchmarks.noisy_neighbour import running
from dlbricks_tf.cli import model_flags, settings_flags, shared_flags
from dlbricks_tf.measuring.reference import WINDOW

for _name in ("models", "out", "repeats", "intra_op_threads", "neighbour"):
    flags.declare_key_flag(_name)
# The models when --models is not given.
MODELS = ("MobileNetV2", "EfficientNetB0", "ResNet50", "DenseNet121")
_PROCESSES = flags.DEFINE_integer(
    "processes", 4, "Processes, one after another.", lower_bound=2
)
_BATCHES = flags.DEFINE_integer(
    "batches", 20, "Batches per measurement.", lower_bound=1
)
_EVALUATE = flags.DEFINE_bool(
    "evaluate",
    False,
    "Time nothing: evaluate the rules on the processes' files already in "
    "--out (--processes of them).",
)
_WORKER = flags.DEFINE_integer(
    "worker", None, "Internal: measure as process N into --out."
)


def _window(values: Sequence[float], i: int, k: int) -> float:
    return statistics.median(values[max(0, i - k + 1) : i + 1])


def _windowed(key: str, k: int, power: float = 1.0):
    def factors(rows: Sequence[dict]) -> list[float]:
        values = [r[key] for r in rows]
        return [_window(values, i, k) ** -power for i in range(len(rows))]

    return factors


# name -> factors of a process's batches, in the order they were taken
# (the state is a constant: it moves no spread): the window rule at
# `reference.WINDOW`, and also at other lengths and damped.
RULES: dict[str, Callable[[Sequence[dict]], list[float]]] = {
    "raw": lambda rows: [1.0] * len(rows),
    "own reading": _windowed("reading", 1),
    "window 5": _windowed("reading", 5),
    f"window {WINDOW} (the scale's)": _windowed("reading", WINDOW),
    "window 27": _windowed("reading", 27),
    f"window {WINDOW} ^0.5": _windowed("reading", WINDOW, 0.5),
    f"window {WINDOW} ^0.75": _windowed("reading", WINDOW, 0.75),
    f"compute part, window {WINDOW}": _windowed("compute", WINDOW),
    f"memory part, window {WINDOW}": _windowed("memory", WINDOW),
    f"conv block, window {WINDOW}": _windowed("block", WINDOW),
    "conv block, own": _windowed("block", 1),
}


def measurements(
    processes: Sequence[Sequence[dict]], rule: str
) -> dict[str, dict[int, list[float]]]:
    """{model: {process: [log of each round's measurement]}} under `rule`:
    a measurement is the median of its batches' raw medians times their
    factors."""
    out: dict[str, dict[int, list[float]]] = {}
    for p, rows in enumerate(processes):
        groups: dict[tuple[str, int], list[float]] = {}
        for row, f in zip(rows, RULES[rule](rows), strict=True):
            groups.setdefault((row["model"], row["round"]), []).append(
                row["raw"] * f
            )
        for (model, _), values in sorted(groups.items(), key=lambda g: g[0][1]):
            out.setdefault(model, {}).setdefault(p, []).append(
                math.log(statistics.median(values))
            )
    return out


def spreads(logs: dict[int, list[float]]) -> tuple[float, float, float]:
    """(within, between, all): SDs of one model's measurement logs within a
    process (pooled), of the processes' means, and of all of them."""
    within = math.sqrt(
        statistics.fmean(statistics.variance(v) for v in logs.values())
    )
    between = statistics.stdev(statistics.fmean(v) for v in logs.values())
    every = statistics.stdev(x for v in logs.values() for x in v)
    return within, between, every


def coupling(processes: Sequence[Sequence[dict]]) -> str:
    """How the batches move with their readings: per model, the
    correlation and slope of log raw on log reading, batch by batch (all
    processes' batches pooled, each process's logs centred)."""
    lines = [
        "| model | batches | correlation | slope |",
        "|---|---:|---:|---:|",
    ]
    models = list(dict.fromkeys(r["model"] for r in processes[0]))
    for m in models:
        xs, ys = [], []
        for rows in processes:
            mine = [r for r in rows if r["model"] == m]
            x = [math.log(r["reading"]) for r in mine]
            y = [math.log(r["raw"]) for r in mine]
            mx, my = statistics.fmean(x), statistics.fmean(y)
            xs += [v - mx for v in x]
            ys += [v - my for v in y]
        sxy = sum(a * b for a, b in zip(xs, ys, strict=True))
        sxx, syy = sum(a * a for a in xs), sum(b * b for b in ys)
        r = sxy / math.sqrt(sxx * syy) if sxx and syy else math.nan
        slope = sxy / sxx if sxx else math.nan
        lines.append(f"| {m} | {len(xs)} | {r:.2f} | {slope:.2f} |")
    readings = [math.log(r["reading"]) for rows in processes for r in rows]
    lines.append(
        f"\nReadings: SD of their logs {100 * statistics.stdev(readings):.1f}"
        f" (x100), median {math.exp(statistics.median(readings)):.3f} ms."
    )
    return "\n".join(lines)


def table(processes: Sequence[Sequence[dict]]) -> str:
    models = list(dict.fromkeys(r["model"] for r in processes[0]))
    head = " | ".join(f"{m} within / between / all" for m in models)
    lines = [
        f"| rule | {head} | mean of all |",
        "|---|" + "---:|" * (len(models) + 1),
    ]
    for rule in RULES:
        logs = measurements(processes, rule)
        cells, every = [], []
        for m in models:
            w, b, a = spreads(logs[m])
            cells.append(f"{100 * w:.1f} / {100 * b:.1f} / {100 * a:.1f}")
            every.append(a)
        mean = 100 * statistics.fmean(every)
        lines.append(f"| {rule} | {' | '.join(cells)} | {mean:.1f} |")
    return "\n".join(lines)


def _models() -> list[str]:
    return model_flags.MODELS.value or list(MODELS)


def _measure(index: int, out: Path) -> None:
    """One process: its timers, then rounds of batches, into pN.json."""
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as settings_lib

    settings = settings_lib.RunSettings.default(
        1, intra_op_threads=settings_flags.INTRA.value
    )
    process_lib.configure_threads(
        settings.intra_op_threads, settings.inter_op_threads
    )
    import keras

    from dlbricks_tf import stats
    from dlbricks_tf.measuring import reference, timing

    ref = reference.Reference()  # The scale's, read after the timers' calls.
    parts = reference.Reference("matmul-reduce")
    block = reference.Reference("conv-block")
    # The state is 1: the rules' spreads do not depend on it.
    scale = reference.ReferenceScale(ref.read, 1.0, graph=ref)
    timers = []
    for name in _models():
        t = timing.Timer(
            getattr(keras.applications, name)(weights=None), settings
        )
        t.scale = scale
        t.sample()  # Traces, warms up, chooses K and S.
        timers.append((name, t))
    rows, start = [], time.perf_counter()
    for r in range(repeat_flags.REPEATS.value):
        for name, t in timers:
            for _ in range(_BATCHES.value):
                durations, reading = t.batch_ms()
                compute, memory = parts.parts()
                block_ms = block.read()
                rows.append(
                    {
                        "model": name,
                        "round": r,
                        "t": time.perf_counter() - start,
                        "raw": stats.median(durations) / t.calls_per_sample,
                        "reading": reading,
                        "compute": compute,
                        "memory": memory,
                        "block": block_ms,
                    }
                )
    (out / f"p{index}.json").write_text(json.dumps(rows))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = Path(shared_flags.OUT.value)
    out.mkdir(parents=True, exist_ok=True)
    if _WORKER.value is not None:
        _measure(_WORKER.value, out)
        return
    if not _EVALUATE.value:
        _run_processes(out)
    files = [out / f"p{p}.json" for p in range(_PROCESSES.value)]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        sys.exit(
            f"scale_rules: no batches in {', '.join(missing)}; run without "
            "--evaluate (or with the --processes and --out it ran with)."
        )
    processes = [json.loads(f.read_text()) for f in files]
    print(table(processes))
    print()
    print(coupling(processes))


def _run_processes(out: Path) -> None:
    """--processes workers one after another, beside the --neighbour."""
    from dlbricks_tf.measuring.steal import StealMeter

    meter = StealMeter()
    meter.start()
    args = [
        f"--models={','.join(_models())}",
        f"--repeats={repeat_flags.REPEATS.value}",
        f"--batches={_BATCHES.value}",
    ]
    if settings_flags.INTRA.value is not None:
        args.append(f"--intra_op_threads={settings_flags.INTRA.value}")
    began = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with running(
        neighbour_flags.NEIGHBOUR.value, neighbour_flags.NEIGHBOUR_SEED.value
    ):
        for p in range(_PROCESSES.value):
            print(f"process {p + 1}/{_PROCESSES.value}", flush=True)
            command = [sys.executable, "-m", "benchmarks.scale_rules"]
            command += [*args, f"--worker={p}", f"--out={out}"]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                sys.exit(f"process {p} failed:\n{done.stderr}")
            meter.tick()
    meter.stop()
    steal = meter.total_share
    print(
        f"{began}; {_PROCESSES.value} processes x "
        f"{repeat_flags.REPEATS.value} rounds x "
        f"{_BATCHES.value} batches; neighbour "
        f"{neighbour_flags.NEIGHBOUR.value}; steal "
        + ("n/a" if steal is None else f"{100 * steal:.1f}%")
    )


if __name__ == "__main__":
    flags.FLAGS.set_default("out", "dlbricks_out/scale_rules")
    app.run(main)
