"""Small helpers every check uses: a precondition and a bounded quote of a value (tfdist's own)."""

from tfdist._internal.preconditions import QUOTE_LIMIT, quoted, require  # noqa: F401  (re-exported)


class ServiceError(Exception):
    """Vertex AI or Cloud Storage failed on their side (5xx, unreachable).

    `python -m trainer.submit` prints it as one `error:` line and exits 1.
    """
