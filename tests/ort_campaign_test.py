"""Tests of dlbricks_tf/measuring/ort_campaign.py: ORT bricks in chains.

Real tf2onnx conversions of a small model's bricks and real ONNX Runtime
sessions, chained, timed and profiled; the checks are shares, sums and
what is recorded, no test asserts a speed.
"""

import dataclasses
import math

import pytest

import dlbricks_tf
from dlbricks_tf import stats
from dlbricks_tf.measuring import (
    brick_timing,
    onnx_files,
    ort_campaign,
    rounds,
)
from tests import models

pytest.importorskip("onnxruntime")

ORT = models.ort_settings()
FAST = models.ORT_FAST


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{signature: OnnxFile} of models.residual()'s G=1 bricks, in order,
    and their counts."""
    folder = tmp_path_factory.mktemp("onnx")
    model, _ = models.residual()
    d = dlbricks_tf.decompose(model, 1)
    out = {}
    counts = {}
    for b in d.bricks:
        counts[b.signature] = counts.get(b.signature, 0) + 1
        if b.signature not in out:
            out[b.signature] = brick_timing.brick_onnx_file(
                b.build, folder, b.signature, 1
            )
    return out, counts


def _bricks(files):
    return [
        ort_campaign.OrtBrick(key, lambda f=f: f) for key, f in files.items()
    ]


def test_protocol_chain_is_the_default_on_onnx_runtime():
    assert ORT.protocol == "chain"
    assert ORT.key().endswith("-chain")


def test_segments_are_the_first_model_that_counts_a_brick():
    weights = {"a": {"x": 1, "y": 2}, "b": {"y": 1, "z": 1}}
    assert ort_campaign.segments_of(["x", "y", "z", "w"], weights) == [
        "a",
        "a",
        "b",
        "",
    ]
    assert ort_campaign.segments_of(["x"], None) == [""]


def test_a_brick_timing_is_its_chain_timing_scaled_by_its_share():
    chain = stats.summarize([2.0, 4.0, 4.0, 6.0, 8.0], noisy=True)
    brick = ort_campaign.brick_timing(chain, 0.25)
    assert brick.median_ms == pytest.approx(chain.median_ms * 0.25)
    assert brick.min_ms == pytest.approx(0.5)
    assert brick.max_ms == pytest.approx(2.0)
    assert brick.ci_low_ms == pytest.approx(chain.ci_low_ms * 0.25)
    assert brick.samples == chain.samples and brick.noisy
    assert brick.relative_precision == pytest.approx(chain.relative_precision)
    assert ort_campaign.brick_timing(chain, 0.0).median_ms == 0.0
    with pytest.raises(ort_campaign.MeasurementError, match="share"):
        ort_campaign.brick_timing(chain, 1.5)


def test_every_brick_is_timed_and_shares_add_up_to_at_most_the_chain(files):
    out, counts = files
    results = {}
    summary = ort_campaign.time_ort_chains(
        _bricks(out),
        ORT,
        FAST,
        weights={"m": counts},
        on_result=results.__setitem__,
    )
    assert set(results) == set(out) == set(summary.timed)
    assert summary.failed == () and summary.chains == 1
    assert summary.setup_s > 0 and summary.sampling_s > 0
    for result in results.values():
        assert math.isfinite(result.median_ms) and result.median_ms >= 0
        assert result.min_ms <= result.median_ms <= result.max_ms
    # One chain: every brick carries its samples and relative precision.
    assert len({r.samples for r in results.values()}) == 1
    precisions = {
        round(r.relative_precision, 9)
        for r in results.values()
        if r.median_ms > 0
    }
    assert len(precisions) == 1


def test_chain_links_cut_the_chains(files):
    out, _ = files
    options = dataclasses.replace(FAST, chain_links=2)
    summary = ort_campaign.time_ort_chains(_bricks(out), ORT, options)
    assert summary.chains == math.ceil(len(out) / 2)
    assert set(summary.timed) == set(out)


def test_a_brick_ort_cannot_load_fails_alone(files, tmp_path):
    out, _ = files
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not an onnx file")
    bricks = _bricks(out)
    bricks.insert(
        1,
        ort_campaign.OrtBrick(
            "broken", lambda: onnx_files.OnnxFile(str(broken))
        ),
    )
    failures = {}
    summary = ort_campaign.time_ort_chains(
        bricks, ORT, FAST, on_failure=failures.__setitem__
    )
    assert set(failures) == {"broken"} and summary.failed == ("broken",)
    assert set(summary.timed) == set(out)


def test_a_brick_that_cannot_be_built_fails_alone(files):
    out, _ = files

    def unbuildable():
        raise ValueError("no converter for this op")

    bricks = [ort_campaign.OrtBrick("bad", unbuildable), *_bricks(out)]
    failures = {}
    summary = ort_campaign.time_ort_chains(
        bricks, ORT, FAST, on_failure=failures.__setitem__
    )
    assert "no converter" in str(failures["bad"])
    assert set(summary.timed) == set(out)
    with pytest.raises(ValueError, match="no converter"):
        ort_campaign.time_ort_chains(bricks[:1], ORT, FAST)


def test_a_model_sampled_beside_the_chains_sees_every_round(files):
    out, counts = files
    model = onnx_files.OnnxFile(next(iter(out.values())).path)
    timer = brick_timing.model_timer(model, ORT, FAST)
    clock = rounds.WallClock()
    sampler = rounds.ModelSampler(timer, clock)
    summary = ort_campaign.time_ort_chains(
        _bricks(out),
        ORT,
        dataclasses.replace(FAST, chain_links=3),
        weights={"m": counts},
        between=sampler,
    )
    assert set(summary.timed) == set(out)
    assert timer.samples and clock[rounds.END_TO_END] > 0


def test_time_bricks_stores_ort_chain_rows(files, tmp_path):
    from dlbricks_tf.machine.fingerprint import system_fingerprint
    from dlbricks_tf.storing.store import Store

    out, counts = files
    fp = system_fingerprint()
    with Store(tmp_path / "s.sqlite") as store:
        summary = brick_timing.time_bricks(
            [
                brick_timing.BrickToTime(key, lambda f=f: f)
                for key, f in out.items()
            ],
            ORT,
            fp,
            store,
            FAST,
            weights={"m": counts},
        )
        assert set(summary.timed) == set(out)
        stored = store.results(ORT, fp, accept_noisy=True)
        assert set(stored) == set(out)
        loop = dataclasses.replace(ORT, protocol="loop")
        assert store.results(loop, fp, accept_noisy=True) == {}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
