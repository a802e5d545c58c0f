"""Faulty: the adapter imports a framework that is not installed."""

import attention_framework_that_is_not_installed  # noqa: F401

from attention_conformance.backends.numpy import NumpyBackend


class ImportFails(NumpyBackend):
    name = "faulty-import-fails"
