"""Trusted driver for HumanEval test cases: what runs on each side of the sandbox.

Only inputs enter the sandbox. In the engine, the template runs each test case once against
the task's canonical solution (trusted dataset code) and records the calls the test makes:
their arguments, as Python literals (record_calls). A case's sandbox arguments are those
calls and nothing else; the test's source, with its expected values, stays in the engine.

In the sandbox, the harness calls drive(entry, calls) with the candidate's function: each
recorded call is made on it and answered as plain data (the repr of what came back, or the
exception). Nothing is judged there, and there is nothing to read that would say what is right.

In the engine, the trusted scorer runs the test case with `candidate` replaced by a replay of
those answers (replay_calls): the dataset's own assert decides, on values parsed with
ast.literal_eval. A candidate can therefore only pass by returning the right values; it
cannot make an assert pass by patching builtins, exiting early or printing "passed".

The test seeds `random` the same way whenever it runs, so tests that draw random inputs make
the same calls when recorded and when replayed. Arguments are deep-copied before a function
sees them: a candidate that mutates its input cannot change what is checked next.
"""
import ast
import copy
import random

TEST_SEED = 1234  # seeds `random` before every test case, on both sides
MAX_ERROR_CHARS = 300


class CandidateFailed(Exception):
    """The candidate raised, returned something that is not a literal, or the replay diverged."""


def run_test(candidate, function, prelude, setup, test):
    """One test case: the task's prompt (its helpers), check()'s setup lines, then the assert."""
    namespace = {"__name__": "humaneval_test"}
    random.seed(TEST_SEED)
    exec(prelude, namespace)  # defines helpers the tests call, e.g. poly() or encode_cyclic()
    # A few tests call the function by its own name (HumanEval/33 compares candidate(x) with
    # sort_third(x)); in the original harness that name is the candidate's function too.
    namespace["candidate"] = namespace[function] = candidate
    exec(setup, namespace)
    exec(test, namespace)


def call_key(args, kwargs):
    return repr((args, sorted(kwargs.items())))


def drive(entry, calls):
    """Sandbox side: make each recorded call on the candidate; return its answers."""
    answers = []
    for key in calls:
        record = {"call": key}
        answers.append(record)
        args, kwargs = ast.literal_eval(key)
        try:
            record["result"] = repr(entry(*args, **dict(kwargs)))
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
    return answers


class NotLiteral(Exception):
    """A test input that does not survive repr -> ast.literal_eval: it cannot be sent."""


def record_calls(solution, function, prelude, setup, test):
    """Engine side: the calls one test case makes, run against a trusted solution."""
    calls = []

    def candidate(*args, **kwargs):
        key = call_key(args, kwargs)
        try:
            same = ast.literal_eval(key) == (args, sorted(kwargs.items()))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            same = False
        if not same:
            raise NotLiteral(key[:200])
        calls.append(key)
        state = random.getstate()
        try:
            return solution(*copy.deepcopy(args), **copy.deepcopy(kwargs))
        finally:
            random.setstate(state)

    run_test(candidate, function, prelude, setup, test)
    return calls


def replay_calls(calls):
    """Engine side: a stand-in for the candidate that answers from the recorded calls."""
    queue = list(calls)

    def candidate(*args, **kwargs):
        if not queue:
            raise CandidateFailed("the test made a call the sandbox did not record")
        record = queue.pop(0)
        if record.get("call") != call_key(args, kwargs):
            raise CandidateFailed("the recorded call does not match the test's call")
        if "result" not in record:
            raise CandidateFailed(f"the candidate raised {record.get('error', '?')}")
        try:
            return ast.literal_eval(record["result"])
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            raise CandidateFailed("the candidate returned a value that is not a Python literal") from None

    return candidate
