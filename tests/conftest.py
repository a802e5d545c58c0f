"""Shared fixtures of the suite's own tests."""

pytest_plugins = ["pytester"]
