"""Shared fixtures of the suite's own tests."""

# pytester's in-process runs restore sys.modules afterwards, and a C extension such as
# NumPy cannot be loaded twice in one process: import the runner (and so NumPy) here,
# before any in-process run, now that the plugin alone imports nothing.
import attention_conformance.pytest_cases  # noqa: F401

pytest_plugins = ["pytester"]
