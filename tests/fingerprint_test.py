"""Tests for dlbricks_tf/machine/fingerprint.py."""

import dataclasses
import json
import platform
from importlib import metadata

import pytest

from dlbricks_tf.machine import fingerprint
from dlbricks_tf.machine import process as process_lib


def test_current_fingerprint_fields():
    fp = fingerprint.system_fingerprint()
    assert fp.cpu_model
    assert fp.physical_cores >= 1 and fp.logical_cpus >= fp.physical_cores
    assert fp.python == platform.python_version()
    assert fp.tensorflow == metadata.version("tensorflow")
    assert fp.keras == metadata.version("keras")


def test_id_is_short_stable_and_sensitive():
    fp = fingerprint.system_fingerprint()
    assert fp.id == fingerprint.system_fingerprint().id
    assert len(fp.id) == 12 and int(fp.id, 16) >= 0
    other = dataclasses.replace(fp, onednn=not fp.onednn)
    assert other.id != fp.id


def test_round_trip():
    fp = fingerprint.system_fingerprint()
    again = fingerprint.SystemFingerprint.from_dict(fp.to_dict())
    assert again == fp and again.id == fp.id


# A fingerprint as stored before `onednn_rule` existed, and its id then.
OLD_JSON = (
    '{"cpu_model":"Test CPU","keras":"3.15.1","logical_cpus":2,'
    '"machine":"x86_64","onednn":true,"onnxruntime":"","os":"Linux-test",'
    '"physical_cores":2,"python":"3.11.0","tensorflow":"2.21.0"}'
)
OLD_ID = "2f0be3936240"


def test_current_fingerprint_records_tensorflows_rule():
    fp = fingerprint.system_fingerprint()
    assert fp.onednn_rule == fingerprint.ONEDNN_RULE == "tf"
    assert not fp.legacy_onednn
    assert fp.onednn is process_lib.onednn_in_effect()
    assert json.loads(fp.to_json())["onednn_rule"] == "tf"


def test_old_fingerprint_reads_back_as_legacy_under_its_id():
    old = fingerprint.SystemFingerprint.from_dict(json.loads(OLD_JSON))
    assert old.onednn_rule is None and old.legacy_onednn
    assert old.to_json() == OLD_JSON
    assert old.id == OLD_ID
    # The same machine fingerprinted today never takes the old id.
    new = dataclasses.replace(old, onednn_rule=fingerprint.ONEDNN_RULE)
    assert new.id != OLD_ID
    assert fingerprint.SystemFingerprint.from_dict(new.to_dict()) == new


# Two processors of a VM whose model name hides the CPU's generation.
CPUINFO = (
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
    "model\t\t: 17\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
    "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 avx512_vnni\n\n"
    "processor\t: 1\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\n"
)


def test_cpu_kind_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert fingerprint.cpu_kind(str(path)) == (
        "AuthenticAMD family 25 model 17 stepping 1; "
        "avx avx2 fma avx512f avx512_vnni avx512_bf16"
    )
    zen5 = CPUINFO.replace(": 25\n", ": 26\n", 1).replace(": 17\n", ": 2\n")
    path.write_text(zen5)
    assert fingerprint.cpu_kind(str(path)).startswith(
        "AuthenticAMD family 26 model 2 stepping 1; "
    )
    path.write_text("processor\t: 0\nflags\t\t: fp asimd\n")
    assert fingerprint.cpu_kind(str(path)) == ""
    assert fingerprint.cpu_kind(str(tmp_path / "absent")) == ""


def test_two_cpu_generations_of_one_model_name_differ():
    fp = fingerprint.system_fingerprint()
    assert fp.cpu_kind == fingerprint.cpu_kind() and not fp.legacy_cpu
    assert json.loads(fp.to_json())["cpu_kind"] == fp.cpu_kind
    zen4 = dataclasses.replace(
        fp, cpu_model="AMD EPYC", cpu_kind="AuthenticAMD family 25 model 17"
    )
    zen5 = dataclasses.replace(zen4, cpu_kind="AuthenticAMD family 26 model 2")
    assert zen4.id != zen5.id


def test_fingerprint_before_cpu_kind_keeps_its_id():
    old = fingerprint.SystemFingerprint.from_dict(json.loads(OLD_JSON))
    assert old.cpu_kind is None and old.legacy_cpu
    assert "cpu_kind" not in old.to_dict() and old.id == OLD_ID
    # Written with the rule, before `cpu_kind`: its id is unchanged too.
    ruled = dataclasses.replace(old, onednn_rule=fingerprint.ONEDNN_RULE)
    again = fingerprint.SystemFingerprint.from_dict(json.loads(ruled.to_json()))
    assert again == ruled and again.id == ruled.id and again.legacy_cpu
    # The same machine fingerprinted today never takes the old ids.
    new = dataclasses.replace(ruled, cpu_kind="AuthenticAMD family 25")
    assert new.id not in (OLD_ID, ruled.id)


def test_cpu_model_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: Fancy  CPU @ 3GHz\n")
    assert fingerprint.cpu_model(str(path)) == "Fancy CPU @ 3GHz"
    assert fingerprint.cpu_model(str(tmp_path / "absent"))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
