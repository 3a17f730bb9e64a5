"""Small helpers every check uses: a precondition and a bounded quote of a value.

`require` is `tfdist._internal.preconditions.require`, importable from here.
"""

from tfdist._internal.preconditions import QUOTE_LIMIT, quoted, require

__all__ = ["QUOTE_LIMIT", "ServiceError", "quoted", "require"]


class ServiceError(Exception):
    """Vertex AI or Cloud Storage failed on their side (5xx, unreachable).

    `python -m trainer.submit` prints it as one `error:` line and exits 1.
    """
