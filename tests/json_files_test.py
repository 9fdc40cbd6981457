"""Tests for dlbricks_tf/json_files.py: headers read back, finite values."""

import json
import math

import pytest

from dlbricks_tf import errors, json_files, limits


class _Error(errors.Error):
    pass


HEADER = json_files.Header(
    "dlbricks-thing",
    2,
    _Error,
    kind="file",
    instead="give a thing",
    again="write it again.",
)


def _parse(document):
    text = document if isinstance(document, str) else json.dumps(document)
    return HEADER.parse(text, "Thing 'a.json'", "'a.json'", named="Thing")


def test_a_good_header_returns_the_document():
    good = {"format": "dlbricks-thing", "format_version": 2, "x": [1]}
    assert _parse(good) == good


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("{", "Thing 'a.json' is not valid JSON (.*); write it again."),
        ([], r"'a.json' is not a dlbricks-thing file \(format None\); give"),
        (
            {"format": "other", "format_version": 2},
            r"'a.json' is not a dlbricks-thing file \(format 'other'\)",
        ),
        (
            {"format": "dlbricks-thing", "format_version": 1},
            "Thing has format_version 1; this dlbricks_tf reads version 2: "
            "upgrade dlbricks_tf or write it again.",
        ),
    ],
)
def test_bad_headers_are_one_line_errors(document, message):
    with pytest.raises(_Error, match=message) as info:
        _parse(document)
    assert "\n" not in str(info.value)


def test_the_limits_apply(tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"format": "dlbricks-thing", "x": "y" * 2**20}))
    with limits.using(limits.Limits(file_bytes=limits.MIB)):
        with pytest.raises(_Error, match="over the limit"):
            limits.read_file(path, "Thing 'a.json'", _Error)
    with pytest.raises(_Error, match="nests JSON 3 deep"):
        with limits.using(limits.Limits(json_depth=2)):
            _parse('{"a": [[1]]}')
    with pytest.raises(FileNotFoundError):
        limits.read_file(tmp_path / "absent.json", "Thing", _Error)


def test_finite_replaces_nan_and_infinities_at_any_depth():
    value = {"a": math.nan, "b": [1.0, (math.inf, -math.inf)], "c": "x"}
    assert json_files.finite(value) == {
        "a": None,
        "b": [1.0, [None, None]],
        "c": "x",
    }
    assert json_files.finite(2.5) == 2.5


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
