"""Tests for benchmarks/setup_cost.py: it runs a real campaign's setup and
prints every part, each a share of the whole (no timing threshold)."""

import subprocess
import sys

import pytest

from benchmarks.setup_cost import PARTS
from tests import cli

# What the table prints: the setup's parts and the sampling.
_PARTS = (*PARTS, "(sampling, 3 samples)")


def _table(stdout: str) -> dict[str, float]:
    """{part: ms per unique brick} of the printed table."""
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] not in ("part", "---"):
            rows[cells[0]] = float(cells[1])
    return rows


def _run(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.setup_cost", *flags],
        cwd=cli.ROOT,
        env=cli.clean_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_every_part_of_a_chain_campaign_is_within_the_whole():
    # The chain's traced function takes the reference's `reads` argument:
    # the script traces it apart, as `ChainTimer` calls it.
    proc = _run("--models=MobileNetV3Small", "--intra_op_threads=1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "unique bricks of MobileNetV3Small at G=1" in proc.stdout
    table = _table(proc.stdout)
    assert set(_PARTS) | {"all of time_chains"} == set(table)
    assert table["trace"] > 0 and table["first call"] > 0
    # Rounded to 0.1 ms each: the parts add up to at most the whole, but
    # for the first calls, which run beside the next chain's trace.
    parts = sum(table[p] for p in _PARTS if p != "first call")
    assert parts <= table["all of time_chains"] + 0.05 * len(_PARTS)
    assert table["first call"] <= table["all of time_chains"] + 0.05


def test_bare_tracing_prints_the_floor():
    proc = _run("--models=MobileNetV3Small", "--intra_op_threads=1", "--bare")
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = _table(proc.stdout)
    assert set(table) == {"trace", "first call"}
    assert table["trace"] > 0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
