"""Exports a trained Keras model as a SavedModel that Vertex AI Prediction serves.

Vertex AI Prediction's prebuilt TensorFlow containers run TensorFlow Serving,
which loads a SavedModel (`saved_model.pb` plus `variables/`) from the model's
artifact directory and answers requests through its `serving_default`
signature. A `model.keras` file is not something they can load.

    export_saved_model(model, "/out/model")   # or gs://bucket/run/model

writes `saved_model.pb`, `variables/`, `assets/` and `fingerprint.pb` into the
directory, next to whatever is already there (such as `model.keras` and
`summary.json`): `AIP_MODEL_DIR` itself is then the artifact directory to
upload. The SavedModel is written to a temporary subdirectory first and moved
into place with `saved_model.pb` last, so a reader that finds `saved_model.pb`
finds the variables that belong to it.

The format helpers (`EXPORT_FORMATS`, `check_export_format`,
`default_export_format`) import nothing heavy, so flag parsing can use them;
TensorFlow is imported only by `export_saved_model`.
"""

import os
import posixpath
from typing import Any, Mapping, Sequence

from tfdist.errors import UsageError

__all__ = [
    "EXPORT_FORMATS",
    "SAVED_MODEL_FILE",
    "check_export_format",
    "default_export_format",
    "wants_saved_model",
    "wants_keras",
    "export_saved_model",
]

EXPORT_FORMATS = ("savedmodel", "keras", "both")
SAVED_MODEL_FILE = "saved_model.pb"
_TEMPORARY_PREFIX = ".savedmodel-tmp-"


def check_export_format(value: str) -> str:
    """`value` lowercased if it names an export format.

    Raises:
        UsageError: `value` is not one of `EXPORT_FORMATS`.
    """
    text = str(value).strip().lower()
    if text not in EXPORT_FORMATS:
        raise UsageError(
            f"--export is {str(value)[:100]!r}, expected one of: "
            f"{', '.join(EXPORT_FORMATS)} (savedmodel is what Vertex AI "
            f"Prediction serves, keras writes model.keras)"
        )
    return text


def default_export_format(environ: Mapping[str, str] | None = None) -> str:
    """`both` on Vertex AI (`AIP_MODEL_DIR` is set), `keras` elsewhere."""
    environ = os.environ if environ is None else environ
    return "both" if environ.get("AIP_MODEL_DIR") else "keras"


def wants_saved_model(export_format: str) -> bool:
    """Whether `export_format` (`savedmodel`, `keras` or `both`) includes a SavedModel."""
    return check_export_format(export_format) in ("savedmodel", "both")


def wants_keras(export_format: str) -> bool:
    """Whether `export_format` includes `model.keras`."""
    return check_export_format(export_format) in ("keras", "both")


def export_saved_model(
    model: Any, export_dir: str, *, input_signature: Sequence[Any] | None = None
) -> str:
    """Writes `model` as a SavedModel with a `serving_default` signature.

    Call it on the chief only, outside any `strategy.scope()`, after training.

    Args:
        model: A built Keras 3 model (functional, sequential, or subclassed
            and already called on data).
        export_dir: Local directory or `gs://` URI; created if missing. Other
            files in it are kept; an older SavedModel there is replaced.
        input_signature: `tf.TensorSpec`s of the serving inputs, for models
            whose input shapes Keras cannot infer; by default Keras derives
            them from the model's inputs (batch dimension left free).

    Returns:
        The path of the written `saved_model.pb`.

    Raises:
        UsageError: The model was never built, so its inputs are unknown.
    """
    import tensorflow as tf  # Only the export itself needs TensorFlow.

    if not getattr(model, "built", False):
        raise UsageError(
            f"the model {getattr(model, 'name', type(model).__name__)!r} is not "
            f"built, expected a model whose inputs are known; call it on a "
            f"batch or pass input_signature"
        )
    export_dir = str(export_dir).rstrip("/")
    staging = f"{export_dir}/{_TEMPORARY_PREFIX}{os.getpid()}"
    gfile = tf.io.gfile
    if gfile.exists(staging):
        gfile.rmtree(staging)
    gfile.makedirs(export_dir)
    model.export(staging, format="tf_saved_model", verbose=False, input_signature=input_signature)
    target_pb = posixpath.join(export_dir, SAVED_MODEL_FILE)
    if gfile.exists(target_pb):
        gfile.remove(target_pb)  # never a new saved_model.pb beside old variables
    for name in sorted(gfile.listdir(staging)):
        name = name.rstrip("/")
        if name != SAVED_MODEL_FILE:
            _move(gfile, posixpath.join(staging, name), posixpath.join(export_dir, name))
    _move(gfile, posixpath.join(staging, SAVED_MODEL_FILE), target_pb)
    gfile.rmtree(staging)
    return target_pb


def _move(gfile, source: str, target: str) -> None:
    """Moves a file or a directory tree; object stores cannot rename directories."""
    if not gfile.isdir(source):
        gfile.rename(source, target, overwrite=True)
        return
    if gfile.exists(target):
        gfile.rmtree(target)
    gfile.makedirs(target)
    for name in gfile.listdir(source):
        name = name.rstrip("/")
        _move(gfile, posixpath.join(source, name), posixpath.join(target, name))
