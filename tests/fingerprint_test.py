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


def test_cpu_model_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: Fancy  CPU @ 3GHz\n")
    assert fingerprint.cpu_model(str(path)) == "Fancy CPU @ 3GHz"
    assert fingerprint.cpu_model(str(tmp_path / "absent"))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
