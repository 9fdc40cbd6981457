"""Offline stand-in for @rules_java//java:defs.bzl: Bazel's native Java rules."""

def java_binary(**kwargs):
    native.java_binary(**kwargs)  # buildifier: disable=native-java-binary

def java_import(**kwargs):
    native.java_import(**kwargs)  # buildifier: disable=native-java-import

def java_library(**kwargs):
    native.java_library(**kwargs)  # buildifier: disable=native-java-library

def java_lite_proto_library(**kwargs):
    native.java_lite_proto_library(**kwargs)  # buildifier: disable=native-java-lite-proto

def java_package_configuration(**kwargs):
    native.java_package_configuration(**kwargs)  # buildifier: disable=native-java-package-config

def java_plugin(**kwargs):
    native.java_plugin(**kwargs)  # buildifier: disable=native-java-plugin

def java_proto_library(**kwargs):
    native.java_proto_library(**kwargs)  # buildifier: disable=native-java-proto

def java_runtime(**kwargs):
    native.java_runtime(**kwargs)  # buildifier: disable=native-java-runtime

def java_test(**kwargs):
    native.java_test(**kwargs)  # buildifier: disable=native-java-test

def java_toolchain(**kwargs):
    native.java_toolchain(**kwargs)  # buildifier: disable=native-java-toolchain
