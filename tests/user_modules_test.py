"""Tests of dlbricks_tf/cutting/user_modules.py and the command line's --import.

A custom layer lives in a module of a temporary package, registered with
Keras; a model using it is saved as `.keras`. Without `--import` every
command that reads the model ends in one line naming the flag; with it,
decompose, run and export work, and the exported suite then times on
both backends with no import at all (a suite needs no user code).
"""

import importlib
import sys
import textwrap

import keras
import pytest

from dlbricks_tf.cutting import user_modules
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.portable import suite_dir
from dlbricks_tf.storing.store import Store
from tests.cli import FAST, dlbricks, subprocess_dlbricks

PACKAGE = "dlbricks_userpkg"  # Unique: registered once per process.
LAYERS = f"""
import keras


@keras.saving.register_keras_serializable(package="{PACKAGE}")
class Scale(keras.layers.Layer):
    def build(self, input_shape):
        self.factor = self.add_weight(shape=(), initializer="ones")

    def call(self, x):
        return x * self.factor
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A folder holding the package and `custom.keras`, which uses it."""
    root = tmp_path_factory.mktemp("project")
    (root / PACKAGE).mkdir()
    (root / PACKAGE / "__init__.py").write_text("")
    (root / PACKAGE / "layers.py").write_text(textwrap.dedent(LAYERS))
    sys.path.insert(0, str(root))
    try:
        mod = importlib.import_module(f"{PACKAGE}.layers")
    finally:
        sys.path.remove(str(root))
    inp = keras.Input((8,))
    x = mod.Scale(name="scale")(keras.layers.Dense(8)(inp))
    model = keras.Model(inp, keras.layers.Dense(4)(x))
    model.save(root / "custom.keras")
    return root


def _cli(root, *args):
    # Run from the project folder, as a user would: --import finds it there.
    # A fresh process: this one imported the package to save the model.
    return subprocess_dlbricks(
        *args, f"--models={root / 'custom.keras'}", cwd=root
    )


def _one_line_error(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    return lines[0]


def test_commands_need_the_flag_and_work_with_it(project, tmp_path):
    flag = f"--import={PACKAGE}.layers"
    out = tmp_path / "out"
    # Every command loads models through one path: one refusal is enough.
    line = _one_line_error(_cli(project, "run", f"--out={out}"))
    assert "'Scale'" in line and "--import=" in line, line
    proc = _cli(project, "decompose", flag)
    assert proc.returncode == 0, proc.stderr
    assert "Scale" in proc.stdout
    proc = _cli(project, "run", flag, f"--out={out}", "--graphs=0", *FAST)
    assert proc.returncode == 0, proc.stderr
    assert "custom" in proc.stdout
    proc = _cli(project, "export", flag, f"--out={out}")
    assert proc.returncode == 0, proc.stderr

    # The suite runs anywhere: no --import, not even the package's folder.
    suite = out / "suite"
    signatures = set(suite_dir.load_suite(suite).signatures)
    fp = system_fingerprint()
    for backend in ("tf", "onnxruntime"):
        db = tmp_path / f"{backend}.sqlite"
        proc = dlbricks(
            "bench", f"--suite={suite}", f"--backend={backend}",
            f"--db={db}", *FAST,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        settings = RunSettings.default(1, intra_op_threads=1, backend=backend)
        with Store(db) as store:
            assert set(store.results(settings, fp)) == signatures


@pytest.mark.parametrize(
    "name, words",
    [
        ("no_such_module_here", "Cannot import module 'no_such_module_here'"),
        ("mypkg/layers.py", "dotted module names"),
    ],
)
def test_bad_module_is_one_line(project, name, words):
    line = _one_line_error(dlbricks("decompose", f"--import={name}"))
    assert words in line


def test_a_module_that_raises_is_named(tmp_path, monkeypatch):
    (tmp_path / "dlbricks_broken_mod.py").write_text("1 / 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(user_modules.UserModuleError, match="ZeroDivision"):
        user_modules.import_modules(["dlbricks_broken_mod"])


def test_imported_modules_are_returned_in_order():
    assert user_modules.import_modules(["json", "csv"]) == ["json", "csv"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
