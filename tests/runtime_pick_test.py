"""Tests for benchmarks/runtime_pick.py: the pick on exact arithmetic, and
a real run of a small model on both runtimes (no timing threshold)."""

import json
import subprocess
import sys

import pytest

from benchmarks.runtime_pick import pick
from tests import cli, models


def test_a_pick_is_wrong_only_past_ten_percent():
    agree = pick(
        {"tf": 9.0, "onnxruntime": 10.0}, {"tf": 5.0, "onnxruntime": 8.0}
    )
    assert agree["estimated"] == agree["measured"] == "tf"
    assert agree["gap"] == 0 and not agree["wrong"]
    assert agree["apart"] == pytest.approx(0.6)
    close = pick(
        {"tf": 9.0, "onnxruntime": 10.0}, {"tf": 5.4, "onnxruntime": 5.0}
    )
    assert close["estimated"] == "tf" and close["measured"] == "onnxruntime"
    assert close["gap"] == pytest.approx(0.08) and not close["wrong"]
    wrong = pick(
        {"tf": 9.0, "onnxruntime": 10.0}, {"tf": 6.0, "onnxruntime": 5.0}
    )
    assert wrong["gap"] == pytest.approx(0.2) and wrong["wrong"]


def test_a_small_model_is_picked_on_both_runtimes(tmp_path):
    pytest.importorskip("onnxruntime")
    path = tmp_path / "chain.keras"
    models.chain()[0].save(path)
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.runtime_pick",
            f"--models={path}",
            f"--out={out}",
            *cli.FAST,
        ],
        cwd=cli.ROOT,
        env=cli.clean_environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((out / "runtime_pick.json").read_text())
    (row,) = report["models"]
    for runtime in ("tf", "onnxruntime"):
        assert row["estimated_ms"][runtime] > 0
        assert row["measured_ms"][runtime] > 0
    assert row["estimated"] in ("tf", "onnxruntime")
    assert "wrong pick(s) of 1 models" in proc.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
