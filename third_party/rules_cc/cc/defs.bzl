"""Offline stand-in for @rules_cc//cc:defs.bzl: Bazel's native C++ rules."""

def cc_binary(**kwargs):
    native.cc_binary(**kwargs)  # buildifier: disable=native-cc-binary

def cc_import(**kwargs):
    native.cc_import(**kwargs)  # buildifier: disable=native-cc-import

def cc_library(**kwargs):
    native.cc_library(**kwargs)  # buildifier: disable=native-cc-library

def cc_proto_library(**kwargs):
    native.cc_proto_library(**kwargs)  # buildifier: disable=native-cc-proto

def cc_test(**kwargs):
    native.cc_test(**kwargs)  # buildifier: disable=native-cc-test

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)  # buildifier: disable=native-cc-toolchain

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)  # buildifier: disable=native-cc-toolchain-suite

def fdo_prefetch_hints(**kwargs):
    native.fdo_prefetch_hints(**kwargs)  # buildifier: disable=native-cc-fdo-prefetch-hints

def fdo_profile(**kwargs):
    native.fdo_profile(**kwargs)  # buildifier: disable=native-cc-fdo-profile

def objc_import(**kwargs):
    native.objc_import(**kwargs)  # buildifier: disable=native-cc-objc-import

def objc_library(**kwargs):
    native.objc_library(**kwargs)  # buildifier: disable=native-cc-objc-library
