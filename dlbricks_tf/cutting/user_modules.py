"""Importing the user's own modules, so that their Keras layers load.

A model file names its custom layers by registered name
(`@keras.saving.register_keras_serializable(package="mypkg")`); Keras finds
them only once the module that registers them has been imported. The
command line's `--import=mypkg.layers` calls `import_modules` before any
model is read. Importing a module runs its code: it is done only for the
modules the user names.

Example:
    import_modules(["mypkg.layers"])
    dlbricks_tf.decompose("custom.keras")
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable

from dlbricks_tf import errors


class UserModuleError(errors.Error):
    """A module named to be imported cannot be imported."""


def import_modules(names: Iterable[str]) -> list[str]:
    """Imports Python modules by dotted name, in order.

    The working folder joins the end of the module search path if it is
    not on it (`python -m` puts it first), so that the console script
    `dlbricks --import=mypkg.layers` finds `./mypkg` too.

    Args:
        names: Dotted module names, e.g. "mypkg.layers".

    Returns:
        The names imported.

    Raises:
        UserModuleError: If a name is malformed, or the module cannot be
            found or raises while it is imported; the message names the
            module and the error.
    """
    imported = []
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    for name in names:
        name = name.strip()
        if not name or not all(p.isidentifier() for p in name.split(".")):
            raise UserModuleError(
                f"--import takes dotted module names such as mypkg.layers, "
                f"not a path. Received: {name!r}"
            )
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            raise UserModuleError(
                f"Cannot import module {name!r} (--import): {e}; run from "
                "the folder that holds it, or add that folder to PYTHONPATH."
            ) from e
        except Exception as e:  # The user's code may raise anything.
            text = str(e).strip()
            first = text.splitlines()[0] if text else ""
            raise UserModuleError(
                f"Importing module {name!r} (--import) raised "
                f"{type(e).__name__}: {first}"
            ) from e
        imported.append(name)
    return imported
