"""The judge (judge.py, judge_process.py): it judges the tests it is asked for, in order,
ahead of the runner, and each verdict is that test's whichever order the runner takes
them in. A judge that dies is the subject of a FAULTS row in tests/process/test_isolation.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from attention_conformance.process import wire
from attention_conformance.process.judge_proxy import Judge
from attention_conformance.process.spawn import judge_options
from attention_conformance.specs.loader import load_spec

FIRST_ROW = "worked_examples/wo-shi-xiao-gou-causal-first-row-is-one-hot[float32]"
BAD = f"{Path(__file__).resolve().parents[1] / 'known_bad' / 'causal_off_by_one.py'}:CausalOffByOne"


def _judge(reference, spec_dir) -> Judge:
    options = {"backend": reference, "device": None, "restart_every": 0, "restart_above": 0,
               "spec_dir": str(spec_dir)}
    return Judge(judge_options(options.get))


@pytest.fixture
def test_ids(worked_examples_spec):
    from attention_conformance.process.judge_host import tests_by_id
    return list(tests_by_id(load_spec(worked_examples_spec.parent)))


def test_the_judge_answers_every_test_asked_without_being_asked_again(worked_examples_spec,
                                                                    test_ids):
    judge = _judge("numpy", worked_examples_spec)
    try:
        assert judge.name == "numpy" and "float32" in judge.dtypes
        judge.ask(test_ids, timeout=60)
        while len(judge._answers) < len(test_ids):   # every verdict arrives, unasked
            assert judge._conn.poll(60)
            judge._answers.update(wire.receive(judge._conn)["verdicts"])
        assert list(judge._answers) == test_ids                 # in the order asked
        assert {v["status"] for v in judge._answers.values()} == {"pass"}
    finally:
        judge.close()


def test_each_verdict_is_its_own_tests_in_any_order_taken(worked_examples_spec, test_ids):
    """A wrong backend fails the one test it breaks, whichever order the verdicts are
    taken in; a test nobody asked for is asked for; an unknown one is a suite error."""
    judge = _judge(BAD, worked_examples_spec)
    try:
        judge.ask(test_ids, timeout=60)
        last = judge.verdict(test_ids[-1], timeout=60)
        first_row = judge.verdict(FIRST_ROW, timeout=60)
        assert first_row["status"] == "fail" and "golden out: worst abs error 1" in \
            first_row["message"]
        assert last["status"] in ("pass", "fail") and last["seconds"] > 0
        again = judge.verdict(FIRST_ROW, timeout=60)            # asked anew: judged anew
        assert again["status"] == "fail"
        unknown = judge.verdict("worked_examples/no-such-case[float32]", timeout=60)
        assert unknown["status"] == "error" and "has no test" in unknown["message"]
    finally:
        judge.close()
    assert judge._proc is None


def test_a_backend_that_fails_to_load_is_one_clear_error(worked_examples_spec):
    from attention_conformance.backend.resolve import BackendLoadError
    with pytest.raises(BackendLoadError, match="no_such_module"):
        _judge("no_such_module:Backend", worked_examples_spec)


def test_the_readme_numbers_of_calls_sent_ahead():
    """docs/running.md: up to 4 first calls sent ahead, and up to 2 calls of their properties
    beyond those, at most 32 KiB of inputs unless one call alone is larger, on sockets
    that hold that and its answers each way."""
    from attention_conformance.process import backend_proxy as isolation, judge_host as judge_process, spawn as launch
    assert judge_process.AHEAD == 4 and isolation.AHEAD_BYTES == 32 * 1024
    assert isolation.PLANNED_ROOM == 2
    assert launch.SOCKET_BYTES >= 4 * isolation.AHEAD_BYTES


def test_a_single_call_larger_than_the_limit_is_still_sent_ahead_alone():
    import numpy as np
    from attention_conformance.process.backend_proxy import AHEAD_BYTES, IsolatedBackend
    backend = IsolatedBackend("numpy", ahead=4)
    try:
        big = np.zeros((AHEAD_BYTES // 8 + 1,), np.float64).reshape(1, 1, -1)
        small = np.zeros((1, 2, 4))
        assert backend.prefetch("softmax", (big,), {})            # alone: over the limit
        assert not backend.prefetch("softmax", (small,), {})      # not beside it
        assert backend.sent_ahead() == 1
        assert backend.softmax(big).shape == big.shape
        assert backend.prefetch("softmax", (small,), {}) and backend.prefetch("softmax", (small,), {})
        assert backend.sent_ahead() == 2
    finally:
        backend.close()
