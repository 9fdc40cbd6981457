"""The `dlbricks` command line: one module per command, with its flags.

`main` parses the flags and runs a command from its table; each
`*_command` module holds one command and the flags only it reads; the
flags several commands read are in `shared_flags` (which re-exports
`model_flags` and `settings_flags`), `timing_flags` and `limit_flags`, so
that `--helpfull` lists them by group; the benchmark scripts take theirs
from these modules too. Nothing here imports TensorFlow before the command
starts it (`startup`).
"""
