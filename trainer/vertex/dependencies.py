"""Optional packages, imported on demand and named by the extra that installs them.

The dry run needs only absl; building and staging a package needs `build`, and
a real submission the Vertex AI and Cloud Storage client libraries: all in
`pip install 'tfdist[vertex]'`.
"""

import importlib
import importlib.util
from types import ModuleType

from tfdist.errors import UsageError

VERTEX_EXTRA = "vertex"


def check_installed(*names: str, purpose: str, extra: str = VERTEX_EXTRA) -> None:
    """Raises the `require_module` error for the first of `names` not installed.

    Cheap (finds, does not import), so a real submission can check everything
    it will need before it prints, builds or uploads anything.
    """
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent missing, or a module set to None
            found = False
        if not found:
            require_module(name, purpose=purpose, extra=extra)


def require_module(name: str, *, purpose: str, extra: str = VERTEX_EXTRA) -> ModuleType:
    """Imports `name`, or raises a `UsageError` naming the extra to install.

    Args:
        name: Module to import, e.g. `build` or `google.cloud.storage`.
        purpose: What needs it, e.g. "building the trainer's sdist".
        extra: The setup.cfg extra that installs it.
    """
    try:
        return importlib.import_module(name)
    except ImportError as error:
        missing = getattr(error, "name", None) or name
        raise UsageError(
            f"{purpose} needs the Python package {missing!r}, which is not "
            f"installed; install the {extra} extra: pip install "
            f"'tfdist[{extra}]' (or pip install -e '.[{extra}]' in a "
            f"checkout)"
        ) from None
