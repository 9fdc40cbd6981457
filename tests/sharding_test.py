"""Tests of dlbricks_tf/running/sharding.py: which shard a worker times.

Each engine's variables are given as a plain environment mapping, exactly
as Bazel, Slurm or Kubernetes set them, e.g.

    resolve_shard(None, None, {"SLURM_ARRAY_TASK_ID": "1",
                               "SLURM_ARRAY_TASK_COUNT": "3"})  # (1, 3)
"""

import pytest

from dlbricks_tf import errors
from dlbricks_tf.cutting.suite import shard_of
from dlbricks_tf.running.sharding import Shard, ShardError, resolve_shard


def test_no_flags_no_engine_is_the_whole_suite():
    shard = resolve_shard(None, None, {"PATH": "/bin", "SLURM_JOB_ID": "7"})
    assert shard == Shard(0, 1, "default")
    assert tuple(shard) == (0, 1)


def test_flags():
    shard = resolve_shard(2, 5, {})
    assert (shard.index, shard.count, shard.source) == (2, 5, "flags")
    assert shard.details == ("--shard_index=2", "--num_shards=5")
    assert str(shard) == (
        "shard 2 of 5 (flags: --shard_index=2, --num_shards=5)"
    )


def test_bazel_sharding_touches_the_status_file(tmp_path):
    status = tmp_path / "shard_status"
    env = {
        "TEST_SHARD_INDEX": "2",
        "TEST_TOTAL_SHARDS": "3",
        "TEST_SHARD_STATUS_FILE": str(status),
    }
    index, count = shard = resolve_shard(None, None, env)
    assert (index, count, shard.source) == (2, 3, "Bazel test sharding")
    assert status.is_file()


def test_bazel_without_status_file():
    env = {"TEST_SHARD_INDEX": "0", "TEST_TOTAL_SHARDS": "1"}
    assert tuple(resolve_shard(None, None, env)) == (0, 1)


def test_kubernetes_indexed_job_takes_the_count_from_the_flag():
    shard = resolve_shard(None, 4, {"JOB_COMPLETION_INDEX": "3"})
    assert (shard.index, shard.count) == (3, 4)
    assert shard.source == "Kubernetes Indexed Job and flags"
    assert shard.details == ("JOB_COMPLETION_INDEX=3", "--num_shards=4")


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "3"}, 0),
        ({"SLURM_ARRAY_TASK_ID": "2", "SLURM_ARRAY_TASK_COUNT": "3"}, 2),
        # As Slurm sets them for --array=0-2: MIN=0 changes nothing.
        (
            {
                "SLURM_ARRAY_TASK_ID": "1",
                "SLURM_ARRAY_TASK_COUNT": "3",
                "SLURM_ARRAY_TASK_MIN": "0",
                "SLURM_ARRAY_TASK_MAX": "2",
                "SLURM_ARRAY_TASK_STEP": "1",
            },
            1,
        ),
        # --array=10-12: task ids start at 10, shards at 0.
        (
            {
                "SLURM_ARRAY_TASK_ID": "12",
                "SLURM_ARRAY_TASK_COUNT": "3",
                "SLURM_ARRAY_TASK_MIN": "10",
                "SLURM_ARRAY_TASK_MAX": "12",
            },
            2,
        ),
        # --array=1-5:2: task ids 1, 3, 5.
        (
            {
                "SLURM_ARRAY_TASK_ID": "3",
                "SLURM_ARRAY_TASK_COUNT": "3",
                "SLURM_ARRAY_TASK_MIN": "1",
                "SLURM_ARRAY_TASK_STEP": "2",
            },
            1,
        ),
    ],
)
def test_slurm_job_array(env, expected):
    shard = resolve_shard(None, None, env)
    assert (shard.index, shard.count) == (expected, 3)
    assert shard.source == "Slurm job array"
    assert f"SLURM_ARRAY_TASK_ID={env['SLURM_ARRAY_TASK_ID']}" in str(shard)


def test_every_slurm_task_of_an_offset_array_gets_its_own_shard():
    shards = {
        resolve_shard(
            None,
            None,
            {
                "SLURM_ARRAY_TASK_ID": str(task),
                "SLURM_ARRAY_TASK_MIN": "5",
                "SLURM_ARRAY_TASK_COUNT": "4",
            },
        ).index
        for task in range(5, 9)
    }
    assert shards == {0, 1, 2, 3}


def test_flags_win_over_every_engine(tmp_path):
    env = {
        "TEST_SHARD_INDEX": "1",
        "TEST_TOTAL_SHARDS": "2",
        "TEST_SHARD_STATUS_FILE": str(tmp_path / "status"),
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_ARRAY_TASK_COUNT": "2",
        "JOB_COMPLETION_INDEX": "1",
    }
    shard = resolve_shard(3, 4, env)
    assert (shard.index, shard.count, shard.source) == (3, 4, "flags")
    # The engine's values were not used: Bazel is not told the test shards.
    assert not (tmp_path / "status").exists()


def test_flags_win_over_a_malformed_variable():
    assert tuple(resolve_shard(0, 2, {"SLURM_ARRAY_TASK_ID": "x"})) == (0, 2)


@pytest.mark.parametrize(
    "index, count, env, expected",
    [
        (None, 5, {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "3"},
         (1, 5, "Slurm job array and flags")),
        (2, None, {"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "3"},
         (2, 3, "flags and Slurm job array")),
        (1, None, {"TEST_SHARD_INDEX": "0", "TEST_TOTAL_SHARDS": "2"},
         (1, 2, "flags and Bazel test sharding")),
    ],
)  # fmt: skip
def test_one_flag_and_the_other_value_from_the_engine(
    index, count, env, expected
):
    shard = resolve_shard(index, count, env)
    assert (shard.index, shard.count, shard.source) == expected


def test_bazel_comes_before_slurm_and_kubernetes():
    env = {
        "TEST_SHARD_INDEX": "0",
        "TEST_TOTAL_SHARDS": "2",
        "SLURM_ARRAY_TASK_ID": "1",
        "SLURM_ARRAY_TASK_COUNT": "2",
    }
    assert resolve_shard(None, None, env).source == "Bazel test sharding"
    env = {"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}
    env["JOB_COMPLETION_INDEX"] = "0"
    assert resolve_shard(None, None, env).source == "Slurm job array"


def test_empty_variables_count_as_unset():
    env = {"TEST_SHARD_INDEX": "", "JOB_COMPLETION_INDEX": " "}
    assert resolve_shard(None, None, env) == Shard(0, 1)


@pytest.mark.parametrize(
    "index, count, env, words",
    [
        # An index not below the count.
        (3, 3, {}, "--shard_index=3 is not below --num_shards=3"),
        (None, None, {"TEST_SHARD_INDEX": "2", "TEST_TOTAL_SHARDS": "2"},
         "TEST_SHARD_INDEX=2 is not below TEST_TOTAL_SHARDS=2"),
        (None, None, {"SLURM_ARRAY_TASK_ID": "3",
                      "SLURM_ARRAY_TASK_COUNT": "3"},
         "SLURM_ARRAY_TASK_ID=3 is not below SLURM_ARRAY_TASK_COUNT=3"),
        (None, 2, {"JOB_COMPLETION_INDEX": "2"},
         "JOB_COMPLETION_INDEX=2 is not below --num_shards=2"),
        # Negative values, a count below 1.
        (-1, 2, {}, "--shard_index=-1: the shard index must be 0 or more"),
        (None, None, {"SLURM_ARRAY_TASK_ID": "3",
                      "SLURM_ARRAY_TASK_MIN": "5",
                      "SLURM_ARRAY_TASK_COUNT": "3"},
         "SLURM_ARRAY_TASK_ID=3, SLURM_ARRAY_TASK_MIN=5 (index -2): the "
         "shard index must be 0 or more"),
        (0, 0, {}, "--num_shards=0: the shard count must be 1 or more"),
        (None, None, {"TEST_SHARD_INDEX": "0", "TEST_TOTAL_SHARDS": "-1"},
         "TEST_TOTAL_SHARDS=-1: the shard count must be 1 or more"),
        # A count without an index.
        (None, 3, {}, "--num_shards=3 gives a shard count but no shard "
         "index: pass --shard_index"),
        (None, None, {"TEST_TOTAL_SHARDS": "3"},
         "TEST_TOTAL_SHARDS=3 gives a shard count but no shard index"),
        (None, None, {"SLURM_ARRAY_TASK_COUNT": "3"},
         "SLURM_ARRAY_TASK_COUNT=3 gives a shard count but no shard index"),
        # An index without a count.
        (None, None, {"JOB_COMPLETION_INDEX": "1"},
         "JOB_COMPLETION_INDEX=1 gives a shard index but no shard count "
         "(--num_shards): pass --num_shards equal to the Job's completions"),
        (None, None, {"SLURM_ARRAY_TASK_ID": "1"},
         "SLURM_ARRAY_TASK_ID=1 gives a shard index but no shard count"),
        (None, None, {"TEST_SHARD_INDEX": "1"},
         "TEST_SHARD_INDEX=1 gives a shard index but no shard count"),
        (1, None, {}, "--shard_index=1 gives a shard index but no shard "
         "count (--num_shards)"),
        # Not integers.
        (None, None, {"TEST_SHARD_INDEX": "one", "TEST_TOTAL_SHARDS": "3"},
         "TEST_SHARD_INDEX='one' is not an integer"),
        (None, 3, {"JOB_COMPLETION_INDEX": "1.0"},
         "JOB_COMPLETION_INDEX='1.0' is not an integer"),
        (None, None, {"SLURM_ARRAY_TASK_ID": "1",
                      "SLURM_ARRAY_TASK_COUNT": "3x"},
         "SLURM_ARRAY_TASK_COUNT='3x' is not an integer"),
        # As Slurm sets them for --array=1,4,7: not a plain range.
        (None, None, {"SLURM_ARRAY_TASK_ID": "4",
                      "SLURM_ARRAY_TASK_MIN": "1",
                      "SLURM_ARRAY_TASK_STEP": "1",
                      "SLURM_ARRAY_TASK_COUNT": "3"},
         "SLURM_ARRAY_TASK_ID=4, SLURM_ARRAY_TASK_MIN=1 (index 3) is not "
         "below SLURM_ARRAY_TASK_COUNT=3: shard indices run from 0 to 2; "
         "submit a plain range of task ids, e.g. --array=0-2."),
        # A task id off the array's step.
        (None, None, {"SLURM_ARRAY_TASK_ID": "2",
                      "SLURM_ARRAY_TASK_MIN": "1",
                      "SLURM_ARRAY_TASK_STEP": "2",
                      "SLURM_ARRAY_TASK_COUNT": "3"},
         "SLURM_ARRAY_TASK_ID=2 is not on the array's step"),
    ],
)  # fmt: skip
def test_inconsistent_values_are_one_line_errors(index, count, env, words):
    with pytest.raises(ShardError) as raised:
        resolve_shard(index, count, env)
    message = str(raised.value)
    assert words in message
    assert "\n" not in message
    assert isinstance(raised.value, errors.Error)


def test_an_error_does_not_touch_the_status_file(tmp_path):
    env = {
        "TEST_SHARD_INDEX": "3",
        "TEST_TOTAL_SHARDS": "3",
        "TEST_SHARD_STATUS_FILE": str(tmp_path / "status"),
    }
    with pytest.raises(ShardError):
        resolve_shard(None, None, env)
    assert not (tmp_path / "status").exists()


def test_default_environment_is_os_environ(monkeypatch):
    for name in ("TEST_SHARD_INDEX", "TEST_TOTAL_SHARDS",
                 "SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT",
                 "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_STEP",
                 "JOB_COMPLETION_INDEX"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    assert tuple(resolve_shard(None, 2)) == (1, 2)


def test_shards_are_disjoint_cover_and_ignore_the_order_given():
    class Entry:
        def __init__(self, signature):
            self.signature = signature

    entries = [Entry(s) for s in "dbeac"]
    shards = [shard_of(entries, i, 2) for i in range(2)]
    assert [[e.signature for e in part] for part in shards] == [
        ["a", "c", "e"],
        ["b", "d"],
    ]
    assert shard_of(reversed(entries), 1, 2) == shards[1]
    for index, count in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(ValueError, match="Need 0 <= index < count"):
            shard_of(entries, index, count)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
