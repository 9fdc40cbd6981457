"""`python -m tools.dlbricks`: the dlbricks command line, from a checkout.

The command line is `dlbricks_tf.cli` (installed as the `dlbricks`
console script); this module runs it for `python -m tools.dlbricks` and
`make run`. See `python -m tools.dlbricks --help`.
"""

from dlbricks_tf.cli.main import COMMANDS, main, run

__all__ = ["COMMANDS", "main", "run"]

if __name__ == "__main__":
    run()
