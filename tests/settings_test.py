"""Tests for dlbricks_tf/settings.py."""

import os
import subprocess
import sys
import textwrap

import pytest

from dlbricks_tf import errors
from dlbricks_tf import settings as settings_lib

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_key_is_stable_and_distinguishes_every_field():
    base = settings_lib.RunSettings(1, 2, 1, onednn=True)
    assert base.key() == "tf-b1-t2x1-onednn1-jit0-chain"
    variants = [
        settings_lib.RunSettings(1, 2, 1, protocol="loop"),
        settings_lib.RunSettings(8, 2, 1),
        settings_lib.RunSettings(1, 1, 1),
        settings_lib.RunSettings(1, 2, 2),
        settings_lib.RunSettings(1, 2, 1, backend="onnxruntime"),
        settings_lib.RunSettings(1, 2, 1, onednn=False),
        settings_lib.RunSettings(1, 2, 1, jit_compile=True),
    ]
    keys = {base.key(), *(v.key() for v in variants)}
    assert len(keys) == 1 + len(variants)


def test_protocol_defaults_and_old_rows_read_as_loop():
    assert settings_lib.RunSettings(1, 2, 1).protocol == "chain"
    ort = settings_lib.RunSettings(1, 2, 1, backend="onnxruntime")
    assert ort.protocol == "loop"
    assert settings_lib.RunSettings(1, 2, 1, jit_compile=True).protocol == (
        "loop"
    )
    # Settings stored before the protocol existed were loop-timed and keep
    # their key.
    old = {
        "batch_size": 1,
        "intra_op_threads": 2,
        "inter_op_threads": 1,
        "backend": "tf",
        "onednn": True,
        "jit_compile": False,
    }
    restored = settings_lib.RunSettings.from_dict(old)
    assert restored.protocol == "loop"
    assert restored.key() == "tf-b1-t2x1-onednn1-jit0"
    with pytest.raises(ValueError, match="protocol"):
        settings_lib.RunSettings(
            1, 2, 1, backend="onnxruntime", protocol="chain"
        )
    with pytest.raises(ValueError, match="protocol"):
        settings_lib.RunSettings(1, 2, 1, protocol="batch")


def test_dict_and_json_round_trip():
    s = settings_lib.RunSettings(4, 2, 1, jit_compile=True)
    assert settings_lib.RunSettings.from_dict(s.to_dict()) == s
    assert '"batch_size": 4' in s.to_json()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_size": 0, "intra_op_threads": 1, "inter_op_threads": 1},
        {"batch_size": 1, "intra_op_threads": -1, "inter_op_threads": 1},
        {"batch_size": 1, "intra_op_threads": 1, "inter_op_threads": 1.5},
        {
            "batch_size": 1,
            "intra_op_threads": 1,
            "inter_op_threads": 1,
            "backend": "jax",
        },
    ],
)
def test_invalid_settings_raise(kwargs):
    with pytest.raises(ValueError):
        settings_lib.RunSettings(**kwargs)


def test_defaults():
    s = settings_lib.RunSettings.default(batch_size=2)
    assert s.batch_size == 2
    assert s.intra_op_threads == settings_lib.physical_cores() >= 1
    assert s.inter_op_threads == 1
    assert s.backend == "tf" and not s.jit_compile


def test_physical_cores_within_cpu_count():
    assert 1 <= settings_lib.physical_cores() <= (os.cpu_count() or 1)


@pytest.mark.parametrize(
    "value,expected",
    [("0", False), ("1", True), ("false", False), ("True", True)],
)
def test_onednn_flag_from_environment(value, expected):
    env = {"TF_ENABLE_ONEDNN_OPTS": value}
    assert settings_lib.onednn_enabled(env) is expected


def test_onednn_default_follows_architecture():
    import platform

    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert settings_lib.onednn_enabled({}) is x86


def test_thread_pool_error_is_a_package_error():
    assert issubclass(settings_lib.ThreadPoolError, errors.Error)


_THREADS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    import tensorflow as tf
    from dlbricks_tf import settings as s
    s.configure_threads(2, 1)
    s.check_threads(s.RunSettings(1, 2, 1))
    tf.constant(1.0) + 1.0  # TensorFlow is initialised from here on.
    s.configure_threads(2, 1)  # Same sizes: fine.
    try:
        s.configure_threads(1, 1)
    except s.ThreadPoolError as e:
        print("refused:", e)
    try:
        s.check_threads(s.RunSettings(1, 1, 1))
    except s.ThreadPoolError as e:
        print("mismatch:", e)
    """
)


def test_configure_threads_before_and_after_first_op():
    # Thread pools are per process and fixed at TensorFlow's first op, so
    # this runs in a fresh interpreter.
    result = subprocess.run(
        [sys.executable, "-c", _THREADS.format(root=_ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert result.returncode == 0, result.stderr
    assert "refused: TensorFlow is already initialised with intra=2" in (
        result.stdout
    )
    assert "mismatch:" in result.stdout


def test_configure_threads_rejects_bad_sizes():
    with pytest.raises(ValueError):
        settings_lib.configure_threads(0, 1)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
