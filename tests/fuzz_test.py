"""A fuzz campaign of the readers of files someone else wrote.

Seeded mutations (bit flips, byte runs inserted or deleted, truncation,
JSON values swapped for others of any type, deep nesting) of real files:
a `.keras` archive (whole, and rebuilt around a mutated config.json), a
config `.json`, an `.h5` file's `model_config` attribute (and the file
truncated), a suite's `manifest.json`, a recipe and a store file. Every
input must end in success or in one `dlbricks_tf.Error` whose message is
one line; anything else (another exception type, a hang past the time
bound) fails the test, which lists the inputs. An existing store is never
changed: a bad store merged into it leaves it byte for byte as it was.

None of this runs TensorFlow: the readers only parse. The number of
inputs is `DLBRICKS_FUZZ_INPUTS` (default 600); the seed is
`DLBRICKS_FUZZ_SEED` (default 17).

Example:
    DLBRICKS_FUZZ_INPUTS=20000 python -m pytest tests/fuzz_test.py -q
"""

import collections
import hashlib
import io
import json
import os
import random
import shutil
import signal
import zipfile
from pathlib import Path

import h5py
import keras
import pytest

import dlbricks_tf
from dlbricks_tf import errors
from dlbricks_tf.cutting import graph, loading, suite
from dlbricks_tf.machine.fingerprint import system_fingerprint
from dlbricks_tf.machine.settings import RunSettings
from dlbricks_tf.portable import export, recipe
from dlbricks_tf.portable import suite_dir as suite_dir_lib
from dlbricks_tf.stats import Timing
from dlbricks_tf.storing.store import Store

INPUTS = int(os.environ.get("DLBRICKS_FUZZ_INPUTS", "600"))
SEED = int(os.environ.get("DLBRICKS_FUZZ_SEED", "17"))
TIME_BOUND_S = 20  # A hang, not a speed: the slowest input takes ~0.1 s.


class _Hang(Exception):
    pass


def _model() -> keras.Model:
    inp = keras.Input((6,))
    x = keras.layers.Dense(5, activation="relu")(inp)
    x = keras.layers.Add()([x, keras.layers.Dense(5)(x)])
    return keras.Model(inp, keras.layers.Dense(2)(x), name="tiny")


def _timing(ms: float) -> Timing:
    return Timing(
        min_ms=ms,
        median_ms=ms,
        trimmed_mean_ms=ms,
        max_ms=ms,
        samples=10,
        ci_low_ms=ms,
        ci_high_ms=ms,
        noisy=False,
    )


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seeds")
    model = _model()
    model.save(folder / "m.keras")
    model.save(folder / "m.h5")
    d = dlbricks_tf.decompose(model, 1)
    export.export_suite(suite.build_suite({"m": d}), folder / "suite")
    recipe.from_decomposition("m", d).save(folder / "m.recipe.json")
    settings = RunSettings.default(1, intra_op_threads=1)
    with Store(folder / "store.sqlite") as store:
        for i, s in enumerate(b.signature for b in d.bricks):
            store.put(s, settings, system_fingerprint(), _timing(1.0 + i))
    with zipfile.ZipFile(folder / "m.keras") as z:
        config = z.read("config.json")
    return {
        "folder": folder,
        "keras": (folder / "m.keras").read_bytes(),
        "config": config,
        "manifest": (folder / "suite" / suite_dir_lib.MANIFEST).read_bytes(),
        "recipe": (folder / "m.recipe.json").read_bytes(),
        "store": (folder / "store.sqlite").read_bytes(),
        "h5": (folder / "m.h5").read_bytes(),
    }


# --- mutations --------------------------------------------------------------

_VALUES = [
    None, True, 0, -1, 2**63, 1e308, "", "x" * 1000, [], {}, [[[]]],
    {"class_name": "Dense"}, {"config": {}}, ["layers"], "Functional",
]  # fmt: skip


def _bytes_mutation(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    kind = rng.randrange(5)
    if kind == 0 or not data:  # Truncate.
        return bytes(data[: rng.randrange(len(data) + 1)])
    i = rng.randrange(len(data))
    if kind == 1:  # Flip bits.
        for _ in range(rng.randint(1, 8)):
            j = rng.randrange(len(data))
            data[j] ^= 1 << rng.randrange(8)
    elif kind == 2:  # Insert a run.
        run = rng.choice([b"[", b"{", b'"', b"\\", b"\0", b"9", b"\xff"])
        data[i:i] = run * rng.choice([1, 10, 1000])
    elif kind == 3:  # Delete a run.
        del data[i : i + rng.randint(1, 64)]
    else:  # Copy a chunk elsewhere.
        j = rng.randrange(len(data))
        data[j:j] = data[i : i + rng.randint(1, 256)]
    return bytes(data)


def _paths(value, path=()):
    yield path
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*path, k))
    elif isinstance(value, list):
        for k, v in enumerate(value):
            yield from _paths(v, (*path, k))


def _json_mutation(rng: random.Random, data: bytes) -> bytes:
    """A structural mutation of a JSON document, or a byte-level one."""
    if rng.random() < 0.3:
        return _bytes_mutation(rng, data)
    value = json.loads(data)
    paths = list(_paths(value))
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        if not path:
            continue
        parent = value
        try:
            for key in path[:-1]:
                parent = parent[key]
            if rng.random() < 0.2 and isinstance(parent, dict):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = rng.choice(_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # An earlier change moved this path.
    if rng.random() < 0.05:
        value = {"config": value, "deep": json.loads("[" * 150 + "]" * 150)}
    return json.dumps(value).encode()


# --- targets ----------------------------------------------------------------


def _read_model(path: Path) -> None:
    source = loading.load(str(path))
    graph.walk(source.entry)


def _keras_archive(rng, seeds, path):
    path = path.with_suffix(".keras")
    path.write_bytes(_bytes_mutation(rng, seeds["keras"]))
    _read_model(path)


def _keras_config(rng, seeds, path):
    path = path.with_suffix(".keras")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("config.json", _json_mutation(rng, seeds["config"]))
    path.write_bytes(buffer.getvalue())
    _read_model(path)


def _json_config(rng, seeds, path):
    path = path.with_suffix(".json")
    path.write_bytes(_json_mutation(rng, seeds["config"]))
    _read_model(path)


def _h5(rng, seeds, path):
    path = path.with_suffix(".h5")
    if rng.random() < 0.2:
        path.write_bytes(seeds["h5"][: rng.randrange(len(seeds["h5"]))])
    else:
        path.write_bytes(seeds["h5"])
        with h5py.File(path, "r+") as f:
            text = _json_mutation(rng, seeds["config"])
            # HDF5 strings hold no NUL: the attribute is what Keras would
            # write, only its JSON is mutated.
            text = text.replace(b"\0", b" ").decode("utf-8", "replace")
            f.attrs["model_config"] = text
    _read_model(path)


def _manifest(rng, seeds, path):
    folder = path.with_suffix("")
    shutil.copytree(seeds["folder"] / "suite", folder, dirs_exist_ok=True)
    (folder / suite_dir_lib.MANIFEST).write_bytes(
        _json_mutation(rng, seeds["manifest"])
    )
    suite_dir_lib.load_suite(folder)


def _recipe(rng, seeds, path):
    path = path.with_suffix(recipe.SUFFIX)
    path.write_bytes(_json_mutation(rng, seeds["recipe"]))
    recipe.load(path)


def _store(rng, seeds, path):
    bad = path.with_suffix(".sqlite")
    bad.write_bytes(_bytes_mutation(rng, seeds["store"]))
    target = seeds["folder"] / "target.sqlite"
    shutil.copyfile(seeds["folder"] / "store.sqlite", target)
    with Store(target) as store:
        before = store.rows()
        try:
            store.merge_from(bad)
        except errors.Error:
            # Refused: the existing store holds exactly what it held.
            assert store.rows() == before
            raise
    with Store(bad) as store:
        store.rows()


TARGETS = {
    "keras_archive": _keras_archive,
    "keras_config": _keras_config,
    "json_config": _json_config,
    "h5": _h5,
    "manifest": _manifest,
    "recipe": _recipe,
    "store": _store,
}


def _alarm(signum, frame):
    raise _Hang()


def test_readers_end_in_success_or_one_line_errors(seeds, tmp_path):
    assert INPUTS >= 1
    reference = seeds["folder"] / "store.sqlite"
    reference_digest = hashlib.sha256(reference.read_bytes()).hexdigest()
    rng = random.Random(SEED)
    outcomes = collections.Counter()
    bad = []
    previous = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i in range(INPUTS):
            name = list(TARGETS)[i % len(TARGETS)]
            case = tmp_path / f"{i:06d}"
            signal.alarm(TIME_BOUND_S)
            try:
                TARGETS[name](rng, seeds, case)
                outcomes[name, "ok"] += 1
            except errors.Error as e:
                outcomes[name, "error"] += 1
                if "\n" in str(e) or not str(e).strip():
                    outcomes[name, "error"] -= 1
                    bad.append((i, name, f"message not one line: {e!r}"))
            except _Hang:
                bad.append((i, name, f"no answer within {TIME_BOUND_S} s"))
            except Exception as e:  # noqa: BLE001 - what the fuzz hunts.
                bad.append((i, name, f"{type(e).__name__}: {e}"[:300]))
            finally:
                signal.alarm(0)
            for p in tmp_path.glob(f"{i:06d}*"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    finally:
        signal.signal(signal.SIGALRM, previous)
    tried = sum(outcomes.values()) + len(bad)
    print(f"\nfuzz: {tried} inputs, seed {SEED}: {dict(outcomes)}")
    assert not bad, "\n".join(map(str, bad[:20]))
    assert tried == INPUTS
    # Both outcomes happen: the mutations are neither all harmless nor all
    # rejected.
    assert sum(v for (_, o), v in outcomes.items() if o == "ok") > 0
    assert sum(v for (_, o), v in outcomes.items() if o == "error") > 0
    assert hashlib.sha256(reference.read_bytes()).hexdigest() == (
        reference_digest
    )


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
