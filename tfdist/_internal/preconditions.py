"""One way to check an argument: a value of the right kind and range, or a `UsageError`.

    check_whole_number("max_to_keep", max_to_keep, minimum=1)
    check_seconds("poll_seconds", poll_seconds)

Every message names the argument, quotes the value and says what was expected;
`hint` adds how to fix it. Booleans are never numbers here (`True` is an `int`
in Python, never a count a user meant).
"""

from typing import Any

from tfdist.errors import UsageError

QUOTE_LIMIT = 100


def quoted(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)` for a string, else `str(value)`, cut to about `limit` characters."""
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def require(condition: bool, message: str, error: type[UsageError] = UsageError) -> None:
    """Raises `error(message)` unless `condition`."""
    if not condition:
        raise error(message)


def _hinted(message: str, hint: str) -> str:
    return f"{message}; {hint}" if hint else message


def check_whole_number(
    name: str, value, *, minimum: int = 1, hint: str = "", error: type[UsageError] = UsageError
) -> int:
    """Returns `value` if it is an `int` (not a bool) >= `minimum`."""
    require(
        isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
        _hinted(f"{name} is {value!r}, expected a whole number >= {minimum}", hint),
        error,
    )
    return value


def check_seconds(name: str, value, *, allow_zero: bool = False, hint: str = "") -> float:
    """Returns `value` if it is a number of seconds > 0 (or >= 0 with `allow_zero`)."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    bound = ">= 0" if allow_zero else "> 0"
    require(
        is_number and (value >= 0 if allow_zero else value > 0),
        _hinted(f"{name} is {value!r}, expected a number of seconds {bound}", hint),
    )
    return value
