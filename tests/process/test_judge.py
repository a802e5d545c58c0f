"""The judge (process/judge_proxy.py in pytest's process, judge_host.py in its own): it
judges the tests it is asked for, in order, ahead of the runner, and each verdict is
that test's whichever order the runner takes them in. A judge that stops answering
(stopped by its backend, say) is found within seconds, ended with everything of its
run, and replaced. A judge that dies is the subject of FAULTS rows in test_isolation.py."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from attention_conformance.backend.resolve import BackendLoadError
from attention_conformance.process import judge_host, judge_proxy, protocol, spawn
from attention_conformance.process.judge_proxy import JudgeProxy
from attention_conformance.specs.loader import load_spec

TESTS = Path(__file__).resolve().parents[1]
FIRST_ROW = "worked_examples/wo-shi-xiao-gou-causal-first-row-is-one-hot[float32]"
BAD = f"{TESTS / 'known_bad' / 'causal_off_by_one.py'}:CausalOffByOne"


def _judge(reference, spec_dir) -> JudgeProxy:
    options = protocol.JudgeOptions(reference=reference, device=None, spec_dir=str(spec_dir),
                                    case_timeout=60.0, restart_every=0, restart_above_mib=0.0)
    judge = JudgeProxy(options)
    judge.wait_loaded()
    return judge


@pytest.fixture
def test_ids(worked_examples_spec):
    return list(judge_host.tests_by_id(load_spec(worked_examples_spec.parent)))


def test_the_judge_answers_every_test_asked_without_being_asked_again(worked_examples_spec,
                                                                    test_ids):
    judge = _judge("numpy", worked_examples_spec)
    try:
        assert judge.declaration.name == "numpy" and "float32" in judge.declaration.dtypes
        judge.ask(test_ids)
        judge._await(test_ids[-1])                  # every verdict arrives, unasked
        assert list(judge._answers) == test_ids                 # in the order asked
        assert {v["status"] for v in judge._answers.values()} == {"pass"}
    finally:
        judge.close()


def test_each_verdict_is_its_own_tests_in_any_order_taken(worked_examples_spec, test_ids):
    """A wrong backend fails the one test it breaks, whichever order the verdicts are
    taken in; a test nobody asked for is asked for; an unknown one is a suite error."""
    judge = _judge(BAD, worked_examples_spec)
    try:
        judge.ask(test_ids)
        last = judge.verdict(test_ids[-1])
        first_row = judge.verdict(FIRST_ROW)
        assert first_row["status"] == "fail" and "golden out: worst abs error 1" in \
            first_row["message"]
        assert last["status"] in ("pass", "fail") and last["seconds"] > 0
        again = judge.verdict(FIRST_ROW)            # asked anew: judged anew
        assert again["status"] == "fail"
        unknown = judge.verdict("worked_examples/no-such-case[float32]")
        assert unknown["status"] == "error" and "has no test" in unknown["message"]
    finally:
        judge.close()
    assert judge._proc is None


def test_a_backend_that_fails_to_load_is_one_clear_error(worked_examples_spec):
    with pytest.raises(BackendLoadError, match="no_such_module"):
        _judge("no_such_module:Backend", worked_examples_spec)


def test_a_judge_stopped_by_its_backend_is_found_within_seconds_and_the_test_crashes(
        worked_examples_spec, test_ids, monkeypatch):
    """The backend stops its judge (SIGSTOP) in every sdpa call: the runner hears nothing
    (not even the judge's heartbeat) for STALLED_SECONDS, ends the judge and everything
    of its run, and judges the test again with a fresh judge, which is stopped too: the
    test crashes with what happened, and a fresh judge judges the tests after it."""
    monkeypatch.setattr(judge_proxy, "STALLED_SECONDS", 3.0)
    judge = _judge(f"{TESTS / 'faulty' / 'stops_its_judge.py'}:StopsItsJudge",
                   worked_examples_spec)
    sdpa = next(t for t in test_ids if "wo-ai-zhong-guo-cross-attention" in t)
    weights = next(t for t in test_ids if "wo-ai-zhong-guo-weights" in t)
    try:
        stopped_tag = judge._tag
        started = time.monotonic()
        verdict = judge.verdict(sdpa)
        assert time.monotonic() - started < 2 * 3.0 + 30
        assert verdict["status"] == "crash"
        assert "it was stopped (SIGSTOP, by the backend's process most likely) and sent " \
               "nothing for 3 s: it was killed" in verdict["message"]
        assert not spawn.tree(None, stopped_tag)        # the stopped judges' runs ended
        assert judge.verdict(weights)["status"] == "pass"   # a fresh judge goes on
    finally:
        judge.close()
