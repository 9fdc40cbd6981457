"""Tests for dlbricks_tf/machine/settings.py."""

import gc
import os
import subprocess
import sys
import textwrap

import pytest

from dlbricks_tf import errors
from dlbricks_tf.machine import process as process_lib
from dlbricks_tf.machine import settings as settings_lib

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
    assert ort.protocol == "chain"
    assert ort.key() == "onnxruntime-b1-t2x1-onednn1-jit0-chain"
    # ONNX Runtime rows stored before its chains keep their (loop) key.
    loop = settings_lib.RunSettings(
        1, 2, 1, backend="onnxruntime", protocol="loop"
    )
    assert loop.key() == "onnxruntime-b1-t2x1-onednn1-jit0"
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
        settings_lib.RunSettings(1, 2, 1, jit_compile=True, protocol="chain")
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
    assert s.intra_op_threads == process_lib.physical_cores() >= 1
    assert s.inter_op_threads == 1
    assert s.backend == "tf" and not s.jit_compile


def test_physical_cores_within_cpu_count():
    assert 1 <= process_lib.physical_cores() <= (os.cpu_count() or 1)


def test_collector_paused_restores_the_collector_as_it_was():
    assert gc.isenabled()
    with process_lib.collector_paused():
        assert not gc.isenabled()
        with process_lib.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # The outer pause still holds.
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="inside"):
        with process_lib.collector_paused():
            raise RuntimeError("inside")
    assert gc.isenabled()
    gc.disable()  # Paused by someone else: left paused.
    try:
        with process_lib.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


# /proc/cpuinfo lines as the kernel writes them (flags shortened).
_EPYC_GENOA = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
_ICE_LAKE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n"
_ALDER_LAKE = "processor\t: 0\nflags\t\t: fpu avx2 avx_vnni\n"
_SAPPHIRE = "flags\t\t: avx2 amx_bf16 amx_tile amx_int8\n"
_SKYLAKE = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512bw avx512vl\n"
_ZEN3 = "processor\t: 0\nflags\t\t: fpu avx avx2 fma vaes vpclmulqdq\n"
_GRAVITON3 = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd40\n"
_GRAVITON2 = "processor\t: 0\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"


@pytest.mark.parametrize(
    "cpuinfo,system,machine,expected",
    [
        (_EPYC_GENOA, "Linux", "x86_64", True),
        (_ICE_LAKE, "Linux", "x86_64", True),
        (_ALDER_LAKE, "Linux", "x86_64", True),
        (_SAPPHIRE, "Linux", "x86_64", True),
        (_SKYLAKE, "Linux", "x86_64", False),  # AVX-512 without VNNI/BF16.
        (_ZEN3, "Linux", "x86_64", False),
        ("", "Linux", "x86_64", False),  # No /proc/cpuinfo: no features.
        (_GRAVITON3, "Linux", "aarch64", True),  # Arm Neoverse V1.
        (_GRAVITON2, "Linux", "aarch64", False),  # Arm Neoverse N1.
        ("processor\t: 0\n", "Linux", "aarch64", False),
        (_EPYC_GENOA, "Linux", "ppc64le", False),
        (_ZEN3, "Windows", "AMD64", True),
        (_EPYC_GENOA, "Darwin", "x86_64", False),
        (_GRAVITON3, "Darwin", "arm64", False),
    ],
)
def test_onednn_default_follows_tensorflows_cpu_rule(
    cpuinfo, system, machine, expected
):
    default = process_lib.onednn_default(
        cpuinfo, system=system, machine=machine
    )
    assert default is expected


@pytest.mark.parametrize("default", [False, True])
@pytest.mark.parametrize(
    "value,expected",
    [
        ("0", False),
        ("1", True),
        ("false", False),
        ("True", True),
        ("FALSE", False),
        # TensorFlow ignores anything else (with a warning): the default.
        ("off", None),
        ("yes", None),
        (" 0", None),
        ("", None),
    ],
)
def test_onednn_flag_from_environment(value, expected, default):
    env = {"TF_ENABLE_ONEDNN_OPTS": value}
    flag = process_lib.onednn_enabled(env, default=default)
    assert flag is (default if expected is None else expected)


def test_onednn_unset_is_this_cpus_default():
    assert process_lib.onednn_enabled({}) is process_lib.onednn_default()
    assert process_lib.onednn_enabled({}, default=False) is False


_NO_TENSORFLOW = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    from dlbricks_tf.machine import fingerprint
    from dlbricks_tf.machine import process as process_lib
    fp = fingerprint.system_fingerprint()
    print(process_lib.tensorflow_onednn(),
          process_lib.onednn_in_effect() == fp.onednn)
    print("tensorflow" in sys.modules)
    """
)


def test_onednn_rule_does_not_import_tensorflow():
    result = subprocess.run(
        [sys.executable, "-c", _NO_TENSORFLOW.format(root=_ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["None", "True", "False"]


def test_onednn_rule_agrees_with_tensorflow_in_this_process(monkeypatch):
    import tensorflow  # noqa: F401  TensorFlow decides at its import.
    from tensorflow.python.util import _pywrap_util_port

    actual = bool(_pywrap_util_port.IsMklEnabled())
    assert process_lib.tensorflow_onednn() is actual
    assert process_lib.onednn_enabled() is actual
    assert process_lib.onednn_in_effect() is actual
    assert settings_lib.RunSettings.default().onednn is actual
    # TensorFlow read the variable once: changing it now makes the
    # prediction wrong, and the check says so.
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0" if actual else "1")
    with pytest.raises(process_lib.OneDnnError, match="TensorFlow runs"):
        process_lib.onednn_in_effect()


_WITH_TENSORFLOW = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    import tensorflow
    from tensorflow.python.util import _pywrap_util_port
    from dlbricks_tf.machine import process as process_lib
    print(_pywrap_util_port.IsMklEnabled(), process_lib.onednn_enabled(),
          process_lib.onednn_in_effect(), process_lib.onednn_default())
    """
)


@pytest.mark.parametrize("value", ["0", "1", "off"])
def test_onednn_rule_agrees_with_tensorflow_when_forced(value):
    # TensorFlow reads TF_ENABLE_ONEDNN_OPTS once per process.
    result = subprocess.run(
        [sys.executable, "-c", _WITH_TENSORFLOW.format(root=_ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(
            os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_ENABLE_ONEDNN_OPTS=value
        ),
    )
    assert result.returncode == 0, result.stderr
    tensorflow, predicted, in_effect, default = result.stdout.split()
    assert predicted == in_effect == tensorflow
    expected = {"0": "False", "1": "True", "off": default}[value]
    assert tensorflow == expected


def test_thread_pool_error_is_a_package_error():
    assert issubclass(process_lib.ThreadPoolError, errors.Error)


_THREADS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    import tensorflow as tf
    from dlbricks_tf.machine import process as process_lib
    from dlbricks_tf.machine import settings as s
    process_lib.configure_threads(2, 1)
    s.check_threads(s.RunSettings(1, 2, 1))
    tf.constant(1.0) + 1.0  # TensorFlow is initialised from here on.
    process_lib.configure_threads(2, 1)  # Same sizes: fine.
    try:
        process_lib.configure_threads(1, 1)
    except process_lib.ThreadPoolError as e:
        print("refused:", e)
    try:
        s.check_threads(s.RunSettings(1, 1, 1))
    except process_lib.ThreadPoolError as e:
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
        process_lib.configure_threads(0, 1)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
