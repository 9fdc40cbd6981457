"""Offline stand-in for @rules_python//python:defs.bzl.

Re-exports Bazel's native Python rules, so BUILD files can use the
forward-compatible `load("@rules_python//python:defs.bzl", ...)` without
fetching rules_python. Python packages (tensorflow, keras, ...) are not
managed by Bazel: they come from the first `python3` on PATH.
"""

load(
    "@bazel_tools//tools/python:toolchain.bzl",
    _py_runtime_pair = "py_runtime_pair",
)

py_runtime_pair = _py_runtime_pair

def py_binary(**kwargs):
    native.py_binary(**kwargs)  # buildifier: disable=native-py

def py_library(**kwargs):
    native.py_library(**kwargs)  # buildifier: disable=native-py

def py_runtime(**kwargs):
    native.py_runtime(**kwargs)  # buildifier: disable=native-py

def py_test(**kwargs):
    native.py_test(**kwargs)  # buildifier: disable=native-py
