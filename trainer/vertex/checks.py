"""Small helpers every check uses: a precondition and a bounded quote of a value.

`require` is `tfdist.preconditions.require`, importable from here.
"""

from typing import Any

from tfdist.preconditions import require

__all__ = ["QUOTE_LIMIT", "ServiceError", "quoted", "require"]

QUOTE_LIMIT = 100


def quoted(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, cut to about `limit` characters for error messages."""
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


class ServiceError(Exception):
    """Vertex AI or Cloud Storage failed on their side (5xx, unreachable).

    `python -m trainer.submit` prints it as one `error:` line and exits 1.
    """
