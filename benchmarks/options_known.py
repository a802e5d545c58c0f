"""A pytest plugin that ends the run the moment a plugin can know the run's options
(pytest_load_initial_conftests, the hook where attention_conformance starts the judge's
and the backend's processes), printing the clock's time then:

    PYTHONPATH=benchmarks python -m pytest -p options_known -p no:attention_conformance ...

benchmarks/targets.py (target 4) measures with it how long pytest's own start takes
before any backend's process can start: no certification run through pytest can cost
less than that plus the framework's floor.
"""

import os
import sys
import time

import pytest

PREFIX = "options known at "


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    sys.stdout.write(f"{PREFIX}{time.time():.6f}\n")
    sys.stdout.flush()
    os._exit(0)
    return (yield)  # never reached: a wrapper must be a generator
