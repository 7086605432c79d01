"""``call_each``: a check's calls of one function on one rank in one launch, each on its own copy
of its arguments, a failure reported on the case that raised (``distlab.checks.ranks``)."""
import pytest

from distlab.checks.ranks import Answers, SubmittedError, call_each, call_each_of
from distlab.grading.statuses import status_of_exception


# Module level: the rank imports them by name.
def _append_and_count(items: list, value: int) -> int:
    items.append(value)
    return len(items)


def _inverse(x: float) -> float:
    if x == 0:
        raise ZeroDivisionError(f"no inverse of {x}")
    return 1 / x


def _stub(x):
    raise NotImplementedError("write this function")


def test_each_call_answers_on_its_own_copy_of_the_arguments():
    shared = [0]
    calls = [(shared, v) for v in range(4)]
    # A function that changes what it was given cannot change a later case: each sees one item.
    assert call_each(_append_and_count, calls) == [len(shared) + 1] * 4
    assert call_each(_inverse, [(x,) for x in (1.0, 2.0, 4.0)]) == [1 / x for x in (1.0, 2.0, 4.0)]


def test_a_raise_is_reported_on_its_case_after_the_earlier_answers():
    cases = (2.0, 0.0, 5.0)
    answers = call_each(_inverse, [(x,) for x in cases], names=[f"inverse of {x}" for x in cases])
    assert isinstance(answers, Answers)
    assert answers[0] == 0.5          # the case before is there to compare first, as in a loop
    seen = []
    with pytest.raises(SubmittedError) as caught:
        for x, got in zip(cases, answers):
            seen.append(got)
    assert seen == [0.5]
    message = str(caught.value)
    assert caught.value.exc_type == "ZeroDivisionError"
    assert message.startswith("_inverse raised ZeroDivisionError on case 2 of 3, inverse of 0.0:")
    assert message.splitlines()[-1] == "ZeroDivisionError: no inverse of 0.0"
    assert "in _inverse" in message   # the traceback starts at the student's function
    with pytest.raises(SubmittedError):
        answers[1]


def test_unnamed_cases_show_the_call_and_a_stub_counts_as_not_done():
    answers = call_each(_stub, [(3,)])
    with pytest.raises(SubmittedError) as caught:
        list(answers)
    assert "on case 1 of 1, _stub(3):" in str(caught.value)
    assert status_of_exception(caught.value) == "not-done"


def _bytes_of(rank: int, world_size: int) -> int:
    return 10 * rank + world_size


def test_a_dict_is_a_call_with_keywords_shown_by_name():
    # As a test that names the arguments calls: the parameters' names matter, not their order.
    calls = [dict(world_size=4, rank=1), dict(rank=2, world_size=3)]
    assert call_each(_bytes_of, calls) == [14, 23]
    answers = call_each(_inverse, [dict(x=2.0), dict(x=0.0)])
    with pytest.raises(SubmittedError) as caught:
        list(answers)
    assert "on case 2 of 2, _inverse(x=0.0):" in str(caught.value)
    with pytest.raises(SubmittedError) as caught:   # another name: a TypeError, as a call made
        list(call_each(_inverse, [dict(value=1.0)]))
    assert caught.value.exc_type == "TypeError"


def test_two_functions_in_one_launch_each_on_its_own_copies():
    shared = [0]
    counts, inverses = call_each_of([_append_and_count, _inverse], [(shared, 1), (shared, 2)])
    assert counts == [len(shared) + 1] * 2          # neither call saw the other's change
    with pytest.raises(SubmittedError) as caught:   # _inverse's raise is its own, on its case
        list(inverses)   # 1 / [0]: a TypeError on the first case
    assert "_inverse raised TypeError on case 1 of 2" in str(caught.value)
    shares, exposed = call_each_of([_inverse, _inverse], [(2.0,), (4.0,)])
    assert shares == exposed == [0.5, 0.25]


def _sleeps(seconds: float) -> float:
    import time
    time.sleep(seconds)
    return seconds


def test_a_hang_stops_the_launch_and_says_where_the_rank_was(monkeypatch):
    from distlab.checks.ranks import ENV_RANK_TIMEOUT
    from distlab.runtime.outcome import HangError
    monkeypatch.setenv(ENV_RANK_TIMEOUT, "3")
    with pytest.raises(HangError) as caught:
        call_each(_sleeps, [(0.0,), (3600.0,)])
    message = str(caught.value)
    assert message.startswith("_sleeps, called on 2 cases one after another on one rank, did not "
                              "return: the ranks did not finish within 3 s")
