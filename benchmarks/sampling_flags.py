"""The accuracy benchmarks' flags: the command line's, and --all.

`benchmarks.accuracy` (TensorFlow) and `benchmarks.ort_accuracy` (ONNX
Runtime) time the same corpus the same way as the command line: --models
(`dlbricks_tf.cli.model_flags`), the batch size and thread pools
(`settings_flags`) and the sampling (`timing_flags`) are its flags,
re-exported here. Without --models they time one model per family.
"""

from absl import flags

from dlbricks_tf.cli import model_flags, settings_flags, timing_flags
from dlbricks_tf.models import corpus

MODELS = model_flags.MODELS
BATCH = settings_flags.BATCH
INTRA = settings_flags.INTRA
INTER = settings_flags.INTER
options = timing_flags.options

ALL = flags.DEFINE_bool(
    "all",
    False,
    "Use all keras.applications models (overrides --models). Without "
    "either: one model per family (dlbricks_tf.models.corpus.FAMILIES).",
)

# Key flags of this module, shown by the --helpshort of a script that
# adopts them.
flags.declare_key_flag("models")
flags.adopt_module_key_flags(settings_flags)
flags.adopt_module_key_flags(timing_flags)


def model_names() -> list[str]:
    """--models; all keras.applications with --all; else one per family."""
    if ALL.value:
        return list(corpus.APPLICATIONS)
    return list(MODELS.value or corpus.FAMILIES)
