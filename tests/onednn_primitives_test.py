"""With oneDNN forced on, timed calls create no oneDNN primitive.

A primitive created inside a timed sample (a cache miss of oneDNN's or
TensorFlow's primitive cache) would be charged to the brick or model as
latency. oneDNN's own log (`ONEDNN_VERBOSE=2`) names every creation; a
subprocess with TensorFlow's oneDNN path forced on prepares a chain of
bricks and a whole model, then samples both, and the creations logged
after each timer's preparation are counted. Nothing is timed here.
"""

import os
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent(
    """
    import os
    from dlbricks_tf.machine import settings as settings_lib
    from dlbricks_tf.machine import process as process_lib
    process_lib.configure_threads(1, 1)
    import keras
    import dlbricks_tf
    from dlbricks_tf.measuring import chain, timing

    def mark(text):
        os.write(1, f"=== {text}\\n".encode())

    x = keras.Input((32, 32, 3))
    y = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(x)
    y = keras.layers.DepthwiseConv2D(3, padding="same")(y)
    y = keras.layers.Conv2D(16, 1)(y)
    y = keras.layers.GlobalAveragePooling2D()(y)
    model = keras.Model(x, keras.layers.Dense(10, activation="softmax")(y))
    d = dlbricks_tf.decompose(model, granularity=1)
    bricks = {b.signature: b.build(1, source=model) for b in d.bricks}
    settings = settings_lib.RunSettings.default(1, intra_op_threads=1)
    options = timing.TimingOptions(min_samples=3, max_samples=6)
    chained = chain.ChainTimer(list(bricks.items()), settings)
    whole = timing.Timer(model, settings, options)
    mark("prepare")
    chained.sample()
    whole.sample()
    mark("sample")
    for _ in range(5):
        chained.sample()
        whole.sample()
    mark("end")
    """
)


def _log_by_phase(text: str) -> dict[str, dict[str, int]]:
    phase, counts = "start", {}
    for line in text.splitlines():
        if line.startswith("=== "):
            phase = line[4:].strip()
            continue
        parts = line.split(",")
        if line.startswith("onednn_verbose") and len(parts) > 3:
            kind = "create" if parts[3].startswith("create") else parts[3]
            counts.setdefault(phase, {}).setdefault(kind, 0)
            counts[phase][kind] += 1
    return counts


@pytest.mark.skipif(
    os.uname().machine not in ("x86_64", "AMD64"),
    reason="TensorFlow's oneDNN path is x86 here",
)
def test_sampling_creates_no_primitive_with_onednn_on():
    env = dict(
        os.environ,
        TF_ENABLE_ONEDNN_OPTS="1",
        ONEDNN_VERBOSE="2",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    counts = _log_by_phase(done.stdout)
    # The log has teeth: preparing creates primitives, sampling runs them.
    assert counts["prepare"].get("create", 0) > 0
    assert counts["sample"].get("exec", 0) > 0
    assert counts["sample"].get("create", 0) == 0, counts["sample"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
