"""Errors raised by dlbricks_tf.

Every error the package raises on purpose derives from `Error`, so a caller
(and the command line) can tell bad input from a bug.
"""


class Error(Exception):
    """Base class of the errors dlbricks_tf raises on purpose."""


class DecompositionError(Error):
    """A model (or one of its layers) cannot be decomposed into bricks."""


class LoadError(DecompositionError):
    """A model file cannot be read: missing, corrupt or of an unknown kind."""
