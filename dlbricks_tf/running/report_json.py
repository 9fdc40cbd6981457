"""report.json: a job's results, one file, rewritten as the job goes.

`new_report` starts it (the machine, the settings, the sampling options,
no rows yet); the job appends one row per model and G to "runs" and one
per G to "corpus" (`dlbricks_tf.estimating.rows`), and `write_report`
writes it after each G with non-finite numbers as null, so that a job
stopped half way leaves the G it finished. `dlbricks report` and
`dlbricks_tf.reporting.report.format_report` read it back.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dlbricks_tf import json_files


def new_report(fingerprint, settings, brick_options=None) -> dict[str, Any]:
    """An empty report.json: system, settings, options, no rows yet."""
    return {
        "system": {**fingerprint.to_dict(), "id": fingerprint.id},
        "settings": settings.to_dict(),
        "options": (
            dataclasses.asdict(brick_options) if brick_options else None
        ),
        "runs": [],
        "corpus": [],
    }


def write_report(report: Mapping[str, Any], path: str | os.PathLike) -> None:
    """Writes report.json (non-finite numbers as null)."""
    Path(path).write_text(json.dumps(json_files.finite(report), indent=1))
