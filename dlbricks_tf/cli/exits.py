"""How the command line ends: one line on stderr and an exit code.

Bad flags and bad input end with exit code 2 (`absl.app.UsageError`) or 1
(`Fail`, any `dlbricks_tf.Error`, the machine's `OSError`s, out of
memory); SIGINT and SIGTERM with 130 and 143. No traceback is shown for
any of them: each says what went wrong and what to do.
"""

from __future__ import annotations

import contextlib
import sys

from absl import app

from dlbricks_tf import errors

_SMALLER = "use a smaller --batch_size, or fewer copies (--input_copies)."


class Fail(Exception):
    """Ends the program with one line on stderr and an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt (past `except Exception`)."""


def raise_terminated(signum, frame) -> None:
    """The SIGTERM handler: raises `Terminated`."""
    del signum, frame  # Unused.
    raise Terminated()


def one_line(message: object) -> str:
    """`message` with its white space (newlines too) folded."""
    return " ".join(str(message).split())


def first_line(e: BaseException) -> str:
    """The first line of an error's message, or its type's name."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def exit_with(message: str, code: int) -> None:
    """Prints `dlbricks: error: MESSAGE` on one line and exits."""
    sys.stdout.flush()
    print(f"dlbricks: error: {one_line(message)}", file=sys.stderr)
    sys.exit(code)


@contextlib.contextmanager
def exit_on_signals():
    """Ends SIGINT and SIGTERM in one line and exit code 130 or 143."""
    try:
        yield
    except KeyboardInterrupt:
        exit_with(
            "Interrupted (SIGINT): the results stored so far are kept; run "
            "the same command again to resume.",
            130,
        )
    except Terminated:
        exit_with(
            "Terminated (SIGTERM): the results stored so far are kept; run "
            "the same command again to resume.",
            143,
        )


@contextlib.contextmanager
def exit_on_errors():
    """Ends bad input and the machine's errors in one line, exit 1 or 2.

    A bug (any other exception) keeps its traceback.
    """

    try:
        yield
    except app.UsageError as e:
        exit_with(f"{e} See --helpfull.", 2)
    except Fail as e:
        exit_with(str(e), e.code)
    except errors.Error as e:
        exit_with(str(e), 1)
    except OSError as e:  # The machine's, not a bug: disk full, access.
        exit_with(f"{e.filename or ''} {e.strerror or e}".strip(), 1)
    except MemoryError as e:  # numpy's allocation errors derive from it.
        exit_with(f"Out of memory: {first_line(e)}; {_SMALLER}", 1)
    except Exception as e:
        if not _is_resource_exhausted(e):
            raise
        exit_with(
            f"Out of memory in TensorFlow: {first_line(e)}; {_SMALLER}", 1
        )


def _is_resource_exhausted(e: BaseException) -> bool:
    """Whether `e` is TensorFlow's out-of-memory error (if TF is loaded)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(e, tf.errors.ResourceExhaustedError)
