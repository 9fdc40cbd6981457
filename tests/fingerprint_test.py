"""Tests for dlbricks_tf/fingerprint.py."""

import dataclasses
import platform
from importlib import metadata

import pytest

from dlbricks_tf import fingerprint


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


def test_cpu_model_from_cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nmodel name\t: Fancy  CPU @ 3GHz\n")
    assert fingerprint.cpu_model(str(path)) == "Fancy CPU @ 3GHz"
    assert fingerprint.cpu_model(str(tmp_path / "absent"))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
