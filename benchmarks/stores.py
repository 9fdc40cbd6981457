"""Stores as the evaluations read them: a copy, its timed pairs.

`cover_eval` and `predict_eval` read a store that a benchmark may still be
writing, so they read a copy (`copy_store`), and estimate against the
first (settings, fingerprint) pair whose models were timed end to end
(`first_pair_timings`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from dlbricks_tf.machine.fingerprint import SystemFingerprint
from dlbricks_tf.machine.settings import RunSettings


def copy_store(path: str | Path, folder: str | Path) -> Path:
    """Copies a store file, with its -wal and -shm if any, into `folder`.

    A store another process may still be writing is read from a copy: its
    last transactions may be in the -wal file, and opening the original
    would fold them into it.

    Returns:
        The path of the copy.
    """
    path = Path(path)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    for suffix in ("", "-wal", "-shm"):
        part = Path(f"{path}{suffix}")
        if part.is_file():
            shutil.copyfile(part, f"{target}{suffix}")
    return target


def stored_pairs(store: Any) -> list[tuple[Any, Any]]:
    """The (settings, fingerprint) pairs of the store's model timings.

    In the order first met; estimate against these to compare with the
    models timed end to end.
    """
    pairs: dict[tuple[str, str], tuple[Any, Any]] = {}
    for r in store.rows("model"):
        settings = RunSettings.from_dict(r["settings"])
        fp = SystemFingerprint.from_dict(r["fingerprint"])
        pairs.setdefault((settings.key(), fp.id), (settings, fp))
    return list(pairs.values())


def first_pair_timings(store: Any) -> tuple[Any, Any, dict, dict]:
    """(settings, fingerprint, brick results, model results) of the first
    pair of `stored_pairs`, the pair the evaluations estimate against.

    Prints a line if the store holds several pairs.
    """
    (settings, fp), *others = stored_pairs(store)
    if others:
        print(f"(several settings stored; using {settings.key()})")
    measured = {
        r["model"]: store.get_model(r["model"], settings, fp)
        for r in store.rows("model")
    }
    return settings, fp, store.results(settings, fp), measured
