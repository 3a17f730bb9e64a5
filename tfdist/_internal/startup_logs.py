"""Keeps TensorFlow's start-up banners and per-save INFO lines out of a command's output.

TensorFlow's native libraries log a few lines while they load, before absl's
C++ logging is initialized, and absl writes those to stderr whatever
`TF_CPP_MIN_LOG_LEVEL` says (abseil/abseil-cpp#1718, still open):

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 ... port.cc:153] oneDNN custom operations are on. ...
    I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, ...
    E0000 ... cuda_platform.cc:52] failed call to cuInit: ...

`import_tensorflow_quietly` imports TensorFlow and looks for GPUs (which is
when CUDA is initialized) with file descriptor 2 sent to a temporary file,
then writes back every captured line except those banners. The CUDA lines
are kept on a machine with an NVIDIA device node, where they explain a GPU
that was not found. `TF_CPP_MIN_LOG_LEVEL=0` keeps everything.

`quiet_tensorflow_info` drops TensorFlow's Python INFO records (e.g. the
"Sharding callback duration" line of every checkpoint save); its warnings
and errors still show.
"""

import logging
import os
import re
import sys
import tempfile
from typing import Iterable

_BANNERS = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called"),
    re.compile(r"^I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on"),
)
_CUDA_BANNERS = (
    re.compile(r"^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers"),
    re.compile(r"^E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit"),
)
NVIDIA_DEVICE_NODE = "/dev/nvidiactl"


def without_banners(lines: Iterable[str], *, has_nvidia_device: bool) -> list[str]:
    """The lines that are not TensorFlow's start-up banners."""
    patterns = _BANNERS if has_nvidia_device else _BANNERS + _CUDA_BANNERS
    return [line for line in lines if not any(p.match(line) for p in patterns)]


def import_tensorflow_quietly(environ=os.environ):
    """Imports TensorFlow and lists its GPUs without the start-up banners; returns the module."""
    if "tensorflow" in sys.modules or environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        import tensorflow as tf  # pylint: disable=g-import-not-at-top

        return tf
    sys.stderr.flush()
    saved_stderr = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf  # pylint: disable=g-import-not-at-top

            tf.config.list_physical_devices("GPU")
        finally:
            sys.stderr.flush()
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
            captured.seek(0)
            text = captured.read().decode("utf-8", errors="replace")
            kept = without_banners(
                text.splitlines(keepends=True), has_nvidia_device=os.path.exists(NVIDIA_DEVICE_NODE)
            )
            sys.stderr.write("".join(kept))
            sys.stderr.flush()
    return tf


class _DropInfoFromPackage(logging.Filter):
    """Drops records below WARNING that were logged by code under one directory."""

    def __init__(self, directory: str):
        super().__init__()
        self.directory = os.path.join(directory, "")

    def filter(self, record: logging.LogRecord) -> bool:
        # `pathname` is the code's file as imported, the same form as `__file__`.
        return record.levelno >= logging.WARNING or not record.pathname.startswith(self.directory)


def quiet_tensorflow_info(tf_module) -> None:
    """Only warnings and errors of TensorFlow's Python code reach the log.

    TensorFlow logs through its own `tensorflow` logger and, in places such as
    the checkpoint saver, through absl's, which tfdist logs through too: that
    one gets a filter by source file instead of a level.
    """
    logging.getLogger("tensorflow").setLevel(logging.WARNING)
    absl_logger = logging.getLogger("absl")
    if not any(isinstance(f, _DropInfoFromPackage) for f in absl_logger.filters):
        absl_logger.addFilter(_DropInfoFromPackage(os.path.dirname(tf_module.__file__)))
