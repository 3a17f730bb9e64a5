"""Small helpers every check uses: a precondition and a bounded quote of a value."""

from typing import Any

from tfdist.errors import UsageError

QUOTE_LIMIT = 100


def quoted(value: Any, limit: int = QUOTE_LIMIT) -> str:
    """`repr(value)`, cut to about `limit` characters for error messages."""
    text = repr(value) if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def require(condition: bool, message: str) -> None:
    """Raises `UsageError(message)` unless `condition` holds."""
    if not condition:
        raise UsageError(message)


class ServiceError(Exception):
    """Vertex AI or Cloud Storage failed on their side (5xx, unreachable).

    `python -m trainer.submit` prints it as one `error:` line and exits 1.
    """
