"""A made-up machine and settings for tests that fill a store by hand."""

from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings

SETTINGS = RunSettings(batch_size=1, intra_op_threads=1, inter_op_threads=1)
FP = SystemFingerprint(
    cpu_model="Test CPU",
    physical_cores=1,
    logical_cpus=1,
    os="Linux",
    machine="x86_64",
    python="3.11",
    tensorflow="2.21",
    keras="3.15",
    onnxruntime="",
    onednn=True,
)
