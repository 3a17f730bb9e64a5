"""Files only the chief writes: other workers get a scratch path of their own.

Every worker of a synchronous job runs the same script, so every worker's
`ModelCheckpoint`, `CSVLogger` and `model.save` would write the same files.
TensorFlow's multi-worker guide keeps the code the same on every worker (a
save may take part in collectives) and gives the workers other than the chief
a temporary path instead; this module does that.
"""

import atexit
import logging
import os
import shutil
import tempfile

import keras

from tfdist.distribute.cluster import Cluster

__all__ = ["scratch_dir", "write_path", "redirect_callbacks"]

_log = logging.getLogger(__name__)
_SCRATCH: set[str] = set()


def _remove_scratch() -> None:
    for directory in sorted(_SCRATCH):
        shutil.rmtree(directory, ignore_errors=True)
    _SCRATCH.clear()


atexit.register(_remove_scratch)


def scratch_dir(cluster: Cluster) -> str:
    """This task's scratch directory, removed when the process exits."""
    name = f"tfdist-worker-files-{cluster.task_type or 'single'}-{cluster.task_index}-{os.getpid()}"
    directory = os.path.join(tempfile.gettempdir(), name)
    os.makedirs(directory, exist_ok=True)
    _SCRATCH.add(directory)
    return directory


def write_path(path: str, cluster: Cluster) -> str:
    """`path` on the chief; on other workers the same name under `scratch_dir`.

    The whole path is kept below the scratch directory, so two files of the
    same name in different directories stay apart.
    """
    if cluster.is_chief:
        return path
    relative = path.split("://", 1)[-1].lstrip("/")
    target = os.path.join(scratch_dir(cluster), relative)
    os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
    return target


def redirect_callbacks(callbacks, cluster: Cluster) -> None:
    """Points the files of known callbacks at `write_path` on non-chief workers."""
    if cluster.is_chief:
        return
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.ModelCheckpoint):
            callback.filepath = write_path(callback.filepath, cluster)
        elif isinstance(callback, keras.callbacks.CSVLogger):
            callback.filename = write_path(callback.filename, cluster)
        elif isinstance(callback, keras.callbacks.TensorBoard):
            callback.log_dir = write_path(callback.log_dir, cluster)
        else:
            continue
        _log.debug(
            "%s writes to this worker's scratch directory (not the chief).", type(callback).__name__
        )
