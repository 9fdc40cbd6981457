"""System fingerprint: what identifies the machine a timing was taken on.

Every stored result carries the short id of a `SystemFingerprint`, so
results from several machines (or software stacks) can sit side by side in
one store. Versions are read from package metadata, so taking a fingerprint
does not import TensorFlow.

Example:
    fp = system_fingerprint()
    fp.id  # e.g. '3f9a0c1b2d4e'
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
from collections.abc import Mapping
from importlib import metadata
from typing import Any

from dlbricks_tf.machine import process as process_lib

_ID_LENGTH = 12
# Instruction-set extensions TensorFlow, oneDNN, XLA and ONNX Runtime pick
# their kernels by: two CPUs that differ in these run other code.
ISA_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# How `SystemFingerprint.onednn` is found today (see its docstring).
ONEDNN_RULE = "tf"


@dataclasses.dataclass(frozen=True)
class SystemFingerprint:
    """The machine and software stack behind a timing.

    Attributes:
        cpu_model: CPU model name, e.g. "AMD EPYC".
        physical_cores: Physical cores usable by the process.
        logical_cpus: Logical CPUs of the machine.
        os: Operating system and kernel, e.g. "Linux-6.1.0-x86_64".
        machine: CPU architecture, e.g. "x86_64".
        python: Python version.
        tensorflow: TensorFlow version, "" if not installed.
        keras: Keras version, "" if not installed.
        onnxruntime: ONNX Runtime version, "" if not installed.
        onednn: Whether TensorFlow's oneDNN optimisations are on.
        onednn_rule: How `onednn` was found: "tf" for TensorFlow's own rule
            (`settings.onednn_in_effect`: its CPU features and
            `TF_ENABLE_ONEDNN_OPTS`, checked against TensorFlow's answer).
            None for a fingerprint written before the rule was recorded:
            its label followed the old "on for every x86 CPU" default and
            may not be what TensorFlow did. None is left out of the JSON,
            so such a fingerprint keeps its id, and a new one (always
            "tf") never takes an old one's id.
        cpu_kind: The CPU's vendor, family, model and stepping and the
            instruction-set extensions of `ISA_FLAGS` it has, from
            /proc/cpuinfo, e.g. "AuthenticAMD family 25 model 17 stepping
            1; avx avx2 ...". A VM may show two generations under one
            `cpu_model` ("AMD EPYC"); this tells them apart. "" where
            /proc/cpuinfo says nothing of it. None for a fingerprint
            written before the field existed: it is left out of the JSON,
            so such a fingerprint keeps its id (`legacy_cpu`).
    """

    cpu_model: str
    physical_cores: int
    logical_cpus: int
    os: str
    machine: str
    python: str
    tensorflow: str
    keras: str
    onnxruntime: str
    onednn: bool
    onednn_rule: str | None = ONEDNN_RULE
    cpu_kind: str | None = None

    @property
    def id(self) -> str:
        """A short, stable hash of all fields."""
        digest = hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()
        return digest[:_ID_LENGTH]

    @property
    def legacy_onednn(self) -> bool:
        """Whether `onednn` predates the rule (may be the x86 default)."""
        return self.onednn_rule is None

    @property
    def legacy_cpu(self) -> bool:
        """Whether it predates `cpu_kind` (any CPU of that name)."""
        return self.cpu_kind is None

    def to_dict(self) -> dict[str, Any]:
        """Returns the fields as a JSON-serialisable dict.

        A fingerprint written before `onednn_rule` or `cpu_kind` existed
        has no such key.
        """
        values = dataclasses.asdict(self)
        for key in ("onednn_rule", "cpu_kind"):
            if values[key] is None:
                del values[key]
        return values

    def to_json(self) -> str:
        """Returns canonical JSON (sorted keys, no spaces) of the fields."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SystemFingerprint:
        """Builds a fingerprint from `to_dict` output.

        A dict without `onednn_rule` or `cpu_kind` (stored before they
        existed) reads back with None, under the id it was stored with.
        """
        values = dict(data)
        values.setdefault("onednn_rule", None)
        values.setdefault("cpu_kind", None)
        return cls(**values)


def cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """Returns the CPU model name, or `platform.processor()` as a fallback."""
    try:
        with open(cpuinfo_path, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    if value.strip():
                        return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_kind(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """The first CPU's vendor, family, model, stepping and `ISA_FLAGS`.

    Returns "" when the file cannot be read or names none of them (a
    non-x86 machine may not).
    """
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo_path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block ends
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return ""
    parts = [
        f"{label} {fields[key]}" if label else fields[key]
        for key, label in (
            ("vendor_id", ""),
            ("cpu family", "family"),
            ("model", "model"),
            ("stepping", "stepping"),
        )
        if fields.get(key)
    ]
    have = set(fields.get("flags", "").split())
    isa = [flag for flag in ISA_FLAGS if flag in have]
    return " ".join(parts) + ("; " + " ".join(isa) if isa else "")


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


def system_fingerprint() -> SystemFingerprint:
    """Returns the fingerprint of this machine and process environment.

    Raises:
        OneDnnError: If TensorFlow is imported and its oneDNN decision is
            not the predicted one (`settings.onednn_in_effect`).
    """
    tensorflow = _version("tensorflow") or _version("tensorflow-cpu")
    return SystemFingerprint(
        cpu_model=cpu_model(),
        physical_cores=process_lib.physical_cores(),
        logical_cpus=os.cpu_count() or 1,
        os=f"{platform.system()}-{platform.release()}",
        machine=platform.machine(),
        python=platform.python_version(),
        tensorflow=tensorflow,
        keras=_version("keras"),
        onnxruntime=_version("onnxruntime"),
        onednn=process_lib.onednn_in_effect(),
        onednn_rule=ONEDNN_RULE,
        cpu_kind=cpu_kind(),
    )
