"""Which variables an optimizer leaves out of weight decay or layer adaptation.

Exclusions are regular expressions searched (`re.search`) in a variable's path,
such as `"sequential/dense/bias"`, so `"bias"` excludes every bias and
`"dense_1/"` every variable of the layer named `dense_1`.
"""

import re
from typing import Iterable, Sequence

from tfdist.errors import UsageError

__all__ = [
    "USUAL_EXCLUSIONS",
    "usual_exclusions",
    "normalize_patterns",
    "variable_path",
    "is_excluded",
    "layer_masks",
]

# Biases, and the scales and offsets of normalization layers (BatchNormalization,
# LayerNormalization, GroupNormalization name them gamma and beta, RMSNormalization
# names its scale "scale"), also when the layer has a custom name.
USUAL_EXCLUSIONS = (
    r"(^|/)bias$",
    r"(^|/)(gamma|beta|scale)$",
    r"normalization",
)

_TF_OUTPUT_SUFFIX = re.compile(r":\d+$")


def usual_exclusions() -> tuple[str, ...]:
    """The patterns usually left out of weight decay and layer adaptation.

    They match biases and the scales and offsets of normalization layers: the
    choice of the LARS and LAMB papers' reference implementations.
    """
    return USUAL_EXCLUSIONS


def normalize_patterns(
    patterns: str | Iterable[str] | None, argument: str
) -> tuple[str, ...] | None:
    """Checks exclusion patterns and returns them as a tuple.

    Args:
        patterns: None, one pattern, or an iterable of patterns.
        argument: The argument's name, quoted in error messages.

    Returns:
        None if `patterns` is None, else a tuple of valid regular expressions.

    Raises:
        UsageError: A pattern is not a string or not a valid regular expression.
    """
    if patterns is None:
        return None
    if isinstance(patterns, str):
        patterns = (patterns,)
    checked = []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise UsageError(
                f"{argument} holds {pattern!r}, expected non-empty regular expression "
                f"strings such as 'bias'; fix the list"
            )
        try:
            re.compile(pattern)
        except re.error as error:
            raise UsageError(
                f"{argument} holds {pattern!r}, which is not a regular expression "
                f"({error}); escape special characters, e.g. 'dense\\.bias'"
            ) from None
        checked.append(pattern)
    return tuple(checked)


def variable_path(variable) -> str:
    """The path of a Keras variable, or the name of a bare `tf.Variable`."""
    path = getattr(variable, "path", None)
    if not isinstance(path, str):
        path = _TF_OUTPUT_SUFFIX.sub("", str(variable.name))
    return path


def is_excluded(variable, patterns: Sequence[str] | None) -> bool:
    """Whether any of `patterns` is found in the variable's path."""
    if not patterns:
        return False
    path = variable_path(variable)
    return any(re.search(pattern, path) for pattern in patterns)


def layer_masks(
    variables: Sequence,
    weight_decay_rate: float,
    exclude_from_weight_decay: Sequence[str] | None,
    exclude_from_layer_adaptation: Sequence[str] | None,
) -> tuple[list[bool], list[bool]]:
    """Per variable: whether it gets weight decay, whether it gets a trust ratio.

    The two lists are independent; None or empty excludes nothing.
    """
    decays = [
        weight_decay_rate > 0 and not is_excluded(v, exclude_from_weight_decay) for v in variables
    ]
    adapts = [not is_excluded(v, exclude_from_layer_adaptation) for v in variables]
    return decays, adapts
