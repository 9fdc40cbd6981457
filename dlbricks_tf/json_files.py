"""The JSON files dlbricks_tf writes and reads back.

A recipe and a suite's manifest start with a header, `{"format": NAME,
"format_version": N, ...}`. `Header.parse` parses such a document within
the limits of `dlbricks_tf.limits` and checks its header, each refusal one
line saying what to do. `finite` turns NaN and infinities into None before
`json.dumps` (JSON has no literal for them), for report.json and the
analysis files.

This module imports no TensorFlow.

Example:
    HEADER = Header("dlbricks-recipe", 1, RecipeError, kind="file",
                    instead="give a file written by `dlbricks export`",
                    again="write it again with `dlbricks export`.")
    data = HEADER.parse(limits.read_file(path, what, RecipeError), what)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from dlbricks_tf import errors, limits


@dataclasses.dataclass(frozen=True)
class Header:
    """The header of one kind of file, and how its refusals read.

    Attributes:
        format: The `format` the file must name.
        version: The `format_version` this dlbricks_tf reads.
        error: The reader's error class.
        kind: What the file is, after its format: "file", "manifest".
        instead: What to give instead of a file of another format.
        again: How to write the file again, a sentence.
    """

    format: str
    version: int
    error: type[errors.Error]
    kind: str
    instead: str
    again: str

    def parse(
        self, text: bytes | str, what: str, shown: str, named: str | None = None
    ) -> dict[str, Any]:
        """Parses a document and checks its header.

        Args:
            text: The document.
            what: The file, for the limits' messages ("Recipe 'a.json'").
            shown: The file's path as messages show it ("'a.json'").
            named: How the version message names the file (default:
                `shown`).

        Returns:
            The document, a dict of the right format and version.

        Raises:
            error: Over a limit, not JSON, of another format or version.
        """
        data = limits.parse_json(text, what, self.error, f"; {self.again[:-1]}")
        found = data.get("format") if isinstance(data, dict) else None
        if not isinstance(data, dict) or found != self.format:
            raise self.error(
                f"{shown} is not a {self.format} {self.kind} (format "
                f"{found!r}); {self.instead}."
            )
        version = data.get("format_version")
        if version != self.version:
            raise self.error(
                f"{named or shown} has format_version {version!r}; this "
                f"dlbricks_tf reads version {self.version}: upgrade "
                f"dlbricks_tf or {self.again}"
            )
        return data


def finite(value: Any) -> Any:
    """`value` with NaN and infinities as None, in mappings and sequences.

    Mappings become dicts and tuples lists, as `json.dumps` writes them.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value
