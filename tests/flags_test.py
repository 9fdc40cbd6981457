"""Every absl flag name is defined once: the command line and benchmarks.

absl keeps one registry of flags per process: a name defined in two
modules cannot be imported twice in one program, and the two definitions
drift apart (help, bounds, defaults). The definitions are found in the
source (`flags.DEFINE_*("name", ...)`) of the package, tools/ and
benchmarks/; every benchmark script must still parse its flags.
"""

import collections
import re
import subprocess
import sys

import pytest

from tests import cli

_DEFINE = re.compile(r'flags\.DEFINE_\w+\(\s*"(\w+)"')
_FOLDERS = ("dlbricks_tf", "tools", "benchmarks")

# Names still defined more than once, each with the files that define it:
# none (benchmarks/predict_eval.py reads the command line's --probes).
REPEATED = {}


def _sources() -> dict[str, str]:
    """{path from the repository root: text} of every Python file scanned."""
    return {
        path.relative_to(cli.ROOT).as_posix(): path.read_text(encoding="utf-8")
        for folder in _FOLDERS
        for path in sorted((cli.ROOT / folder).rglob("*.py"))
    }


def definitions() -> dict[str, list[str]]:
    """{flag name: the files that define it, once per definition}."""
    found = collections.defaultdict(list)
    for path, text in _sources().items():
        for match in _DEFINE.finditer(text):
            found[match.group(1)].append(path)
    return dict(found)


def _scripts() -> list[str]:
    """The benchmark scripts (the modules of benchmarks/ that run an app)."""
    return [
        path.split("/")[-1].removesuffix(".py")
        for path, text in _sources().items()
        if path.startswith("benchmarks/") and "app.run(main)" in text
    ]


def test_the_pattern_finds_every_definition():
    for path, text in _sources().items():
        assert len(_DEFINE.findall(text)) == text.count("flags.DEFINE_"), path
    # The command line's own flags and one of a benchmark script's.
    assert definitions()["min_samples"] == ["dlbricks_tf/cli/timing_flags.py"]
    assert definitions()["recheck"] == ["benchmarks/accuracy.py"]


def test_every_flag_name_is_defined_once():
    repeated = {
        name: sorted(paths)
        for name, paths in definitions().items()
        if len(paths) > 1
    }
    assert repeated == REPEATED


@pytest.mark.parametrize("script", _scripts())
def test_every_benchmark_script_parses_its_flags(script):
    # --only_check_args: define every flag, parse, validate, exit 0.
    proc = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{script}", "--only_check_args"],
        cwd=cli.ROOT,
        env=cli.clean_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
