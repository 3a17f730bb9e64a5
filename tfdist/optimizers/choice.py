"""Optimizer and learning-rate schedule names, and the ranges of optimizer arguments.

Kept free of TensorFlow imports (importing `tfdist.optimizers` loads no Keras),
so that a configuration is checked before any task starts TensorFlow or contacts
another; `tfdist.optimizers.LARS` and `LAMB` check their own arguments with the
same `check_arguments`:

    check_arguments("lars", {"momentum": 1.0})
    # UsageError: LARS momentum is 1.0, expected a number in [0, 1), e.g. momentum=0.9
"""

import dataclasses
import math
from typing import Mapping

from tfdist.errors import UsageError

__all__ = [
    "OPTIMIZERS",
    "SCALING_RULES",
    "DECAYS",
    "Interval",
    "ARGUMENT_RANGES",
    "check_arguments",
]

OPTIMIZERS = ("sgd", "adam", "lars", "lamb")
SCALING_RULES = ("none", "linear", "sqrt")
DECAYS = ("constant", "cosine", "polynomial", "step")


@dataclasses.dataclass(frozen=True)
class Interval:
    """The numbers an argument takes: `low` <= x, x < `high` (x <= `high` if `closed`)."""

    low: float = 0.0
    high: float = math.inf
    closed: bool = False
    example: float = 0.0

    def __contains__(self, value) -> bool:
        # Numbers and what converts to one (a NumPy scalar, a scalar tensor); never a
        # bool or a string.
        if isinstance(value, (bool, str, bytes)):
            return False
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        return self.low <= number and (number <= self.high if self.closed else number < self.high)

    def __str__(self) -> str:
        if self.high == math.inf:
            return f">= {self.low:g}"
        return f"in [{self.low:g}, {self.high:g}{']' if self.closed else ')'}"


_NOT_NEGATIVE = Interval()
_MOMENTUM = Interval(0.0, 1.0, example=0.9)

# Per optimizer of `OPTIMIZERS`: its arguments' ranges. `sgd` is Keras's SGD,
# which refuses a momentum outside [0, 1] with a ValueError (and a traceback).
ARGUMENT_RANGES: Mapping[str, Mapping[str, Interval]] = {
    "lars": {
        "momentum": _MOMENTUM,
        "weight_decay_rate": _NOT_NEGATIVE,
        "eeta": Interval(example=0.001),
        "epsilon": _NOT_NEGATIVE,
    },
    "lamb": {
        "beta_1": Interval(0.0, 1.0, example=0.9),
        "beta_2": Interval(0.0, 1.0, example=0.999),
        "epsilon": Interval(example=1e-6),
        "weight_decay_rate": _NOT_NEGATIVE,
    },
    "sgd": {"momentum": Interval(0.0, 1.0, closed=True, example=0.9)},
}


def check_arguments(
    optimizer: str,
    arguments: Mapping[str, object],
    *,
    names: Mapping[str, str] | None = None,
    prefix: str = "",
) -> None:
    """Raises `UsageError` unless each argument is in its optimizer's range.

    Args:
        optimizer: A name of `OPTIMIZERS`; one without ranges (`adam`) accepts
            anything.
        arguments: Argument name to value; names without a range are not checked.
        names: How the message calls each argument (e.g. `{"momentum":
            "--momentum"}`); default: the argument's own name.
        prefix: Starts the message (default: the optimizer's name in capitals).
    """
    names = names or {}
    ranges = ARGUMENT_RANGES.get(optimizer, {})
    for argument, value in arguments.items():
        interval = ranges.get(argument)
        if interval is None or value in interval:
            continue
        name = names.get(argument, argument)
        raise UsageError(
            f"{prefix or optimizer.upper()} {name} is {value!r}, expected a "
            f"number {interval}, e.g. {name}={interval.example:g}"
        )
