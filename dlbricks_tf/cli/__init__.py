"""The `dlbricks` command line: one module per command, with its flags.

`main` parses the flags and runs a command from its table; each
`*_command` module holds one command and the flags only it reads; the
flags several commands read are in `shared_flags`, `timing_flags` and
`limit_flags`, so that `--helpfull` lists them by group. Nothing here
imports TensorFlow before the command starts it (`startup`).
"""
