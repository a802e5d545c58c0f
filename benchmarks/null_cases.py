#!/usr/bin/env python3
"""A certification run whose cases do nothing: pytest, the plugin, the spec, the backend's
process and the report all as in a real run, but no input is built, no backend call made
and nothing checked. ``python benchmarks/null_cases.py spec/cases --backend numpy -q``
(pytest's arguments). benchmarks/targets.py (target 3) sets it beside a bare pytest run
of as many items: what the runner's own machinery costs, apart from the work of the cases.
"""

import sys

import pytest

from attention_conformance import pytest_cases


class _Passed:
    worst_ratio = 0.0


if __name__ == "__main__":
    pytest_cases.run_case = lambda *args, **kwargs: _Passed()
    pytest_cases.send_ahead = lambda *args, **kwargs: None
    sys.exit(pytest.main(sys.argv[1:]))
