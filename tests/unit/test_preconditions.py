"""`tfdist._internal.preconditions`: one message shape for every bad argument."""

import pytest

from tfdist._internal.preconditions import check_seconds, check_whole_number, require
from tfdist.errors import ClusterConfigError, UsageError


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "3", None])
def test_whole_numbers_refuse_bools_floats_strings_and_small_values(value):
    with pytest.raises(UsageError, match=rf"^steps is {value!r}, expected a whole number >= 1$"):
        check_whole_number("steps", value)


def test_whole_numbers_pass_through_and_hints_follow_the_expectation():
    assert check_whole_number("retries", 0, minimum=0) == 0
    with pytest.raises(
        ClusterConfigError,
        match=r"index is -2, expected a whole number >= 0; "
        r"use the task's position",
    ):
        check_whole_number(
            "index", -2, minimum=0, hint="use the task's position", error=ClusterConfigError
        )


@pytest.mark.parametrize(
    "value, allow_zero, ok",
    [
        (0.5, False, True),
        (3, False, True),
        (0, False, False),
        (0, True, True),
        (-1, True, False),
        (True, False, False),
        ("1", False, False),
    ],
)
def test_seconds(value, allow_zero, ok):
    if ok:
        assert check_seconds("timeout", value, allow_zero=allow_zero) == value
    else:
        with pytest.raises(UsageError, match=r"^timeout is .*, expected a number of seconds"):
            check_seconds("timeout", value, allow_zero=allow_zero)


def test_require_raises_only_when_the_condition_fails():
    require(True, "unused")
    with pytest.raises(UsageError, match="^the message$"):
        require(False, "the message")
