"""Trusted driver for HumanEval test cases: the same code runs on both sides of the sandbox.

In the sandbox, the harness calls drive(entry, **args) with the candidate's function: the
test case runs against it and every call is recorded as plain data (the arguments and the
repr of what came back, or the exception). Nothing is judged there.

In the engine, the trusted scorer runs the same test case again with `candidate` replaced by
a replay of those records (replay_calls): the dataset's own assert decides, on values parsed
with ast.literal_eval. A candidate can therefore only pass by returning the right values;
it cannot make an assert pass by patching builtins, exiting early or printing "passed".

Both sides seed `random` the same way and the candidate's own use of `random` is hidden from
the test (the state is restored around every call), so tests that draw random inputs make
the same calls on both sides. Arguments are deep-copied before the candidate sees them: a
candidate that mutates its input cannot change what the test checks next.
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


def drive(entry, function, prelude, setup, test):
    """Sandbox side: run the test against the real candidate; return the calls it made."""
    calls = []

    def candidate(*args, **kwargs):
        record = {"call": call_key(args, kwargs)}
        calls.append(record)
        state = random.getstate()
        try:
            result = entry(*copy.deepcopy(args), **copy.deepcopy(kwargs))
            record["result"] = repr(result)
        except Exception as exc:
            record["error"] = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
            raise
        finally:
            random.setstate(state)
        return result

    try:
        run_test(candidate, function, prelude, setup, test)
    except Exception:
        pass  # the verdict is the engine's: it replays these calls against the same assert
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
