"""Reading a hand-written TFJob manifest (`python -m trainer.kubernetes --check=FILE`).

JSON through the one capped reader (`tfdist._internal.json_input`), else YAML (with
PyYAML), capped in size and depth the same way. Defines no flags, so tests and other
tools can read manifests without `trainer.kubernetes`'s command line.
"""

from tfdist._internal.json_input import MAX_JSON_DEPTH, load_json, nesting_depth
from tfdist._internal.preconditions import quoted
from tfdist.errors import UsageError
from trainer import submission


def read_manifest(path: str) -> dict:
    """A TFJob from a JSON or YAML file (the first document)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(submission.MAX_CONFIG_BYTES + 1)
    except OSError as error:
        raise UsageError(
            f"--check file {quoted(path)} cannot be read ({error.strerror}), expected a TFJob "
            f"manifest"
        ) from None
    if len(data) > submission.MAX_CONFIG_BYTES:
        raise UsageError(
            f"--check file {quoted(path)} is larger than {submission.MAX_CONFIG_BYTES} bytes, "
            f"expected a TFJob manifest"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(
            f"--check file {quoted(path)} is not UTF-8 (byte {error.start}), expected a TFJob "
            f"manifest (JSON or YAML)"
        ) from None
    if text.lstrip().startswith(("{", "[")):
        return load_json(
            text,
            source=f"--check file {quoted(path)}",
            hint="expected a TFJob manifest (JSON or YAML)",
            max_bytes=submission.MAX_CONFIG_BYTES,
        )
    if nesting_depth(text) > MAX_JSON_DEPTH:
        raise UsageError(
            f"--check file {quoted(path)} nests more than {MAX_JSON_DEPTH} levels, expected "
            f"a TFJob manifest"
        )
    try:
        import yaml  # pylint: disable=g-import-not-at-top
    except ImportError:
        raise UsageError(
            f"--check file {path!r} is not JSON, and reading YAML needs PyYAML; "
            f"pip install 'tfdist[kubernetes]'"
        ) from None
    try:
        return next(iter(yaml.safe_load_all(text)), None)
    except RecursionError:
        raise UsageError(
            f"--check file {quoted(path)} nests too deep, expected a TFJob manifest"
        ) from None
    except yaml.YAMLError as error:
        raise UsageError(
            f"--check file {path!r} is neither JSON nor YAML ({' '.join(str(error).split())[:200]})"
        ) from None
