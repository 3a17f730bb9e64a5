"""The regions Vertex AI runs in, read from the installed client library's own list.

`google.cloud.aiplatform.constants.base.SUPPORTED_REGIONS` is the list the SDK
itself checks `location` against. Importing the SDK takes seconds, so the list
is read from that module's source (a literal `frozenset({...})`) without
importing it; `tests/unit/test_vertex_validation.py` keeps the reading in step with
the imported value. Without the client library only the shape of the name is
checked (a real submission needs the library anyway).
"""

import ast
import difflib
import functools
import importlib.util
import os
import re

from trainer.vertex.checks import quoted, require

_REGION_SHAPE = re.compile(r"^[a-z]+(?:-[a-z]+)*[0-9]+$")
_SDK_CONSTANTS = ("aiplatform", "constants", "base.py")
_MAX_SOURCE_BYTES = 1 << 20


@functools.cache
def sdk_regions() -> frozenset[str]:
    """`SUPPORTED_REGIONS` of the installed SDK, or an empty set without one."""
    try:
        spec = importlib.util.find_spec("google.cloud")
    except (ImportError, ValueError):
        return frozenset()
    for directory in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(directory, *_SDK_CONSTANTS)
        if os.path.isfile(path) and os.path.getsize(path) <= _MAX_SOURCE_BYTES:
            with open(path, encoding="utf-8") as handle:
                return _supported_regions(handle.read())
    return frozenset()


def _supported_regions(source: str) -> frozenset[str]:
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "SUPPORTED_REGIONS"
            for target in node.targets
        ):
            value = node.value
            if isinstance(value, ast.Call) and value.args:  # frozenset({...})
                value = value.args[0]
            return frozenset(ast.literal_eval(value))
    return frozenset()


def check_region(region: str) -> str:
    """`region` if Vertex AI runs there.

    Raises:
        UsageError: Not a region name, or not one the SDK lists.
    """
    require(
        bool(region),
        "--region is not set, expected a Vertex AI region such as --region=us-central1",
    )
    require(
        len(region) <= 40 and bool(_REGION_SHAPE.match(region)),
        f"--region is {quoted(region)}, expected a region name such as us-central1",
    )
    known = sdk_regions()
    if known and region not in known:
        close = difflib.get_close_matches(region, sorted(known), n=3, cutoff=0.6)
        hint = (
            f"did you mean {' or '.join(close)}?"
            if close
            else "e.g. us-central1, europe-west4 or asia-southeast1"
        )
        require(
            False,
            f"--region is {quoted(region)}, which Vertex AI does not run in, "
            f"expected one of the {len(known)} regions the Vertex AI SDK lists; "
            f"{hint}",
        )
    return region
