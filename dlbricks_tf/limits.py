"""Limits on what is read from a file someone else wrote.

A model file, a suite's manifest or a recipe may come from anyone. Each
reader checks what it is about to read against these limits before it
reads it, so a small file cannot make the process read gigabytes (a zip
bomb), recurse until Python gives up (a JSON document nested 200,000
deep), or walk a graph of millions of layers. Every refusal is one line
that names the limit and the command-line flag that raises it.

The defaults sit far above the largest real configs measured (see
docs/untrusted-files.md): EfficientNetV2L and NASNetLarge have configs of
about 1 MB, JSON nested 11 deep and about 1,040 layers; ConvNeXtXLarge has
1.3 GiB of weights.

The limits in force are process-wide: the command line sets them once from
its flags (`set_limits`); a library user may do the same, or use `using` to
change them for a block.

Example:
    with limits.using(limits.Limits(json_depth=20)):
        dlbricks_tf.decompose("model.keras")
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Iterator
from typing import IO, Any

from dlbricks_tf import errors

MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Limits:
    """What a reader accepts from a file.

    Attributes:
        file_bytes: Size of a JSON document read whole: a model config
            (`.json`, a `.keras` archive's `config.json`, an `.h5` file's
            `model_config`), a suite's `manifest.json`, a recipe.
        member_bytes: Uncompressed size of any member of a `.keras`
            archive (its weights, mostly).
        json_depth: Nesting of JSON arrays and objects.
        layers: Layer entries in a model config, nested models included.
        bricks: Bricks listed in a suite manifest or a recipe.
    """

    file_bytes: int = 64 * MIB
    member_bytes: int = 16384 * MIB
    json_depth: int = 100
    layers: int = 100_000
    bricks: int = 100_000


# The command-line flag that sets each limit, and the unit it takes.
FLAGS = {
    "file_bytes": ("--max_file_mb", MIB),
    "member_bytes": ("--max_member_mb", MIB),
    "json_depth": ("--max_json_depth", 1),
    "layers": ("--max_layers", 1),
    "bricks": ("--max_bricks", 1),
}

_current = Limits()


def current() -> Limits:
    """The limits in force in this process."""
    return _current


def set_limits(limits: Limits) -> None:
    """Puts `limits` in force for the rest of the process."""
    global _current
    _current = limits


@contextlib.contextmanager
def using(limits: Limits) -> Iterator[Limits]:
    """Puts `limits` in force inside a `with` block."""
    global _current
    previous, _current = _current, limits
    try:
        yield limits
    finally:
        _current = previous


def exceeded(name: str, what: str, found: str, error: type[errors.Error]):
    """The error for `what` exceeding limit `name` (found: what it holds)."""
    flag, unit = FLAGS[name]
    limit = getattr(_current, name)
    shown = f"{limit // MIB} MiB" if unit == MIB else f"{limit:,}"
    return error(
        f"{what} {found}, over the limit of {shown}; if you trust the "
        f"file, raise it with {flag}."
    )


def check_count(
    name: str, count: int, what: str, error: type[errors.Error]
) -> None:
    """Raises `error` if `count` exceeds limit `name` ("layers", "bricks").

    Args:
        name: The limit: "layers" or "bricks".
        count: How many the file holds.
        what: The file, for the message ("Model file 'm.keras'").
        error: The reader's error class.
    """
    if count > getattr(_current, name):
        raise exceeded(name, what, f"holds {count:,} {name}", error)


def check_bytes(
    name: str, size: int, what: str, error: type[errors.Error]
) -> None:
    """Raises `error` if a size exceeds limit `name` ("file_bytes", ...)."""
    if size > getattr(_current, name):
        raise exceeded(name, what, f"is {_mib(size)}", error)


def read_capped(
    stream: IO[bytes], name: str, what: str, error: type[errors.Error]
) -> bytes:
    """Reads a stream whole, stopping as soon as it passes limit `name`.

    For streams whose announced size may lie (a zip member's header):
    never more than the limit plus one block is read.
    """
    limit = getattr(_current, name)
    chunks, total = [], 0
    while block := stream.read(min(MIB, limit + 1 - total)):
        chunks.append(block)
        total += len(block)
        if total > limit:
            raise exceeded(name, what, "is larger", error)
    return b"".join(chunks)


def read_file(
    path: str | os.PathLike, what: str, error: type[errors.Error]
) -> bytes:
    """A whole file, refused before reading it if over `file_bytes`.

    Args:
        path: The file.
        what: The file, for messages ("Recipe 'a.recipe.json'").
        error: The reader's error class.

    Raises:
        error: The file is over the limit (its size, or what it turns out
            to hold).
        OSError: As `open` and `read` raise them: the caller says what to
            do about a missing or unreadable file.
    """
    with open(path, "rb") as f:
        check_bytes("file_bytes", os.fstat(f.fileno()).st_size, what, error)
        return read_capped(f, "file_bytes", what, error)


# A JSON string, escapes included; possessive (no backtracking) and with
# an optional closing quote, so an unterminated string ends the scan
# instead of being retried from every later quote (quadratic time).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"?')
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_BLOCK = 1 << 20


def json_depth(data: bytes) -> int:
    """Deepest nesting of arrays and objects in a JSON text, without recursion.

    Brackets inside strings do not count. Malformed text gets a number too
    (the parser refuses it afterwards). Runs at C speed (a regular
    expression, `bytes.translate`, numpy), so a large document costs
    milliseconds, not a Python loop per bracket.
    """
    import numpy as np

    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    steps = np.frombuffer(brackets, np.uint8)
    deepest = level = 0
    for start in range(0, len(steps), _BLOCK):
        block = steps[start : start + _BLOCK]
        # "[" and "{" open (+1); "]" and "}" close (-1).
        opens = (block == ord("[")) | (block == ord("{"))
        depth = level + np.cumsum(np.where(opens, 1, -1), dtype=np.int64)
        deepest = max(deepest, int(depth.max()))
        level = int(depth[-1])
    return deepest


def parse_json(
    data: bytes | str,
    what: str,
    error: type[errors.Error],
    advice: str = "",
) -> Any:
    """Parses a JSON document within the size and depth limits.

    Args:
        data: The document.
        what: The file, for messages ("Recipe 'a.recipe.json'").
        error: The reader's error class.
        advice: What to do about malformed JSON, ending its message.

    Returns:
        The parsed value.

    Raises:
        error: Too large, nested too deep, or not JSON; one line.
    """
    raw = (
        data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    )
    check_bytes("file_bytes", len(raw), what, error)
    depth = json_depth(raw)
    if depth > _current.json_depth:
        raise exceeded("json_depth", what, f"nests JSON {depth:,} deep", error)
    try:
        return json.loads(raw.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError) as e:
        # ValueError: malformed JSON, or an integer of over 4,300 digits.
        raise error(
            f"{what} is not valid JSON ({_first_line(e)}){advice}."
        ) from e


def _mib(size: int) -> str:
    return f"{size / MIB:,.1f} MiB" if size >= MIB else f"{size:,} bytes"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
