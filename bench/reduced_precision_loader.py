"""Finds `tfdist.keras_compat._reduced_precision` in either layout of tfdist.keras_compat.

On branch `compat` keras_compat is a package and the module imports normally;
where keras_compat is still a single module, the file is loaded by path.
"""

import importlib.util
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent


def reduced_precision():
    try:
        from tfdist.keras_compat import _reduced_precision  # pylint: disable=g-import-not-at-top
        return _reduced_precision
    except ImportError:
        path = REPO / "tfdist" / "keras_compat" / "_reduced_precision.py"
        spec = importlib.util.spec_from_file_location("_reduced_precision", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
