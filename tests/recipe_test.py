"""Tests of dlbricks_tf/portable/recipe.py: a model's bricks without the model.

A recipe saved and loaded again must give the same estimates, sequential
and parallel, as the decomposition it came from, on a real store.

Example:
    python -m pytest tests/recipe_test.py -p no:cacheprovider
"""

import json

import pytest

import dlbricks_tf
from dlbricks_tf import stats
from dlbricks_tf.cutting import suite
from dlbricks_tf.estimating import estimate as estimate_lib
from dlbricks_tf.machine import fingerprint, settings
from dlbricks_tf.portable import recipe
from dlbricks_tf.storing import store
from tests import models


def _timing(ms: float, noisy: bool = False) -> stats.Timing:
    return stats.Timing(
        min_ms=ms * 0.8,
        median_ms=ms,
        trimmed_mean_ms=ms,
        max_ms=ms * 1.5,
        samples=20,
        ci_low_ms=ms * 0.9,
        ci_high_ms=ms * 1.1,
        noisy=noisy,
    )


@pytest.fixture(scope="module")
def decompositions():
    return {
        (name, g): dlbricks_tf.decompose(models.ALL[name]()[0], g)
        for name in ("residual", "multi_io")
        for g in (1, 2)
    }


def test_round_trip(decompositions, tmp_path):
    d = decompositions["residual", 2]
    r = recipe.from_decomposition("residual", d)
    assert r.name == "residual" and r.granularity == 2
    assert r.signatures == tuple(b.signature for b in d.bricks)
    assert r.dependencies == tuple(d.dependencies)
    path = tmp_path / f"residual{recipe.SUFFIX}"
    r.save(path)
    data = json.loads(path.read_text())
    assert data == {
        "format": "dlbricks-recipe",
        "format_version": 1,
        "model": "residual",
        "granularity": 2,
        "split": "plain",
        "bricks": list(r.signatures),
        "dependencies": [list(x) for x in d.dependencies],
    }
    assert recipe.load(path) == r
    assert not list(tmp_path.glob(".tmp-*"))


def test_a_fused_decomposition_records_its_split(tmp_path):
    d = dlbricks_tf.decompose(models.chain()[0], 1, fuse=True)
    r = recipe.from_decomposition("chain", d)
    assert r.split == "fused" and len(r.signatures) == 4
    r.save(tmp_path / "chain.recipe.json")
    assert recipe.load(tmp_path / "chain.recipe.json") == r


def test_estimates_equal_those_of_the_decomposition(decompositions, tmp_path):
    unique = suite.build_suite(
        {f"{n}@{g}": d for (n, g), d in decompositions.items()}
    )
    run = settings.RunSettings(
        batch_size=1, intra_op_threads=1, inter_op_threads=1
    )
    fp = fingerprint.system_fingerprint()
    with store.Store(tmp_path / "store.sqlite") as s:
        for i, sig in enumerate(unique.signatures):
            s.put(sig, run, fp, _timing(0.5 + 0.37 * i, noisy=i % 5 == 0))
        results = s.results(run, fp)
    for (name, g), d in decompositions.items():
        path = tmp_path / f"{name}-{g}{recipe.SUFFIX}"
        recipe.from_decomposition(d.name, d).save(path)
        loaded = recipe.load(path)
        for mode in estimate_lib.MODES:
            got = estimate_lib.estimate(loaded, results, mode)
            want = estimate_lib.estimate(d, results, mode)
            assert got == want, (name, g, mode)
    # The parallel estimate follows the branches of the brick DAG.
    d = decompositions["residual", 1]
    r = recipe.from_decomposition("residual", d)
    par = estimate_lib.estimate(r, results, "parallel")
    assert par.ms < estimate_lib.estimate(r, results, "sequential").ms


def test_missing_timings_name_the_recipe(decompositions):
    r = recipe.from_decomposition("residual", decompositions["residual", 2])
    with pytest.raises(estimate_lib.MissingResultsError, match="'residual'"):
        estimate_lib.estimate(r, {})


_GOOD = {
    "format": "dlbricks-recipe",
    "format_version": 1,
    "model": "m",
    "granularity": 1,
    "bricks": ["a", "b", "a"],
    "dependencies": [[], [0], [0, 1]],
}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{", "not valid JSON"),
        ("[]", "is not a dlbricks-recipe file"),
        (dict(_GOOD, format="dlbricks-suite"), "not a dlbricks-recipe"),
        (dict(_GOOD, format_version=2), "format_version 2"),
        (dict(_GOOD, model=""), "'model'"),
        (dict(_GOOD, granularity=0), "'granularity'"),
        (dict(_GOOD, granularity=True), "'granularity'"),
        (dict(_GOOD, split="fusion"), "'split'"),
        (dict(_GOOD, bricks="abc"), "'bricks'"),
        (dict(_GOOD, bricks=["a", 3, "a"]), "'bricks'"),
        (dict(_GOOD, dependencies=[[], [0]]), "one list per brick"),
        (dict(_GOOD, dependencies=[[], [1], [0]]), "dependencies[1]"),
        (dict(_GOOD, dependencies=[[], [0], [-1]]), "dependencies[2]"),
    ],
)
def test_bad_files_raise_one_line(tmp_path, content, words):
    path = tmp_path / "bad.recipe.json"
    path.write_text(
        content if isinstance(content, str) else json.dumps(content)
    )
    with pytest.raises(recipe.RecipeError) as info:
        recipe.load(path)
    message = str(info.value)
    assert words in message and str(path) in message
    assert "\n" not in message
    assert isinstance(info.value, dlbricks_tf.Error)


def test_missing_file_says_what_to_check(tmp_path):
    with pytest.raises(recipe.RecipeError, match="does not exist.*--recipe"):
        recipe.load(tmp_path / "nope.recipe.json")


def test_good_file_loads(tmp_path):
    path = tmp_path / "m.recipe.json"
    path.write_text(json.dumps(_GOOD))
    r = recipe.load(path)
    assert r.signatures == ("a", "b", "a")
    assert r.dependencies == ((), (0,), (0, 1))
    assert r.split == "plain"  # Recipes written before "split" existed.


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
