"""Undoing an early start of TensorFlow's eager runtime, so collectives can still be configured.

Tracing any dataset function (`TFRecordDataset`, `TextLineDataset`, `.map`,
`.interleave`), even inside a throwaway `tf.Graph`, registers the function
with the eager context and so initializes TensorFlow's runtime; afterwards
`MultiWorkerMirroredStrategy()` fails with "Collective ops must be configured
at program startup". tfdist builds a task's inputs in such a graph before
the strategy exists (to refuse contract violations before any peer is
contacted), then starts a fresh eager context when that build, and only that
build, initialized the runtime. `tests/multiprocess/test_keras_compat.py` shows that the
upstream behaviour still exists.
"""

import contextlib

from tensorflow.python.eager import context as eager_context


def runtime_initialized() -> bool:
    return eager_context.context()._context_handle is not None  # pylint: disable=protected-access


@contextlib.contextmanager
def runtime_left_unstarted():
    """Runs the body; if it started the eager runtime (and nothing had before), resets it.

    Nothing made inside the body may be used afterwards: it belongs to the old
    context. When the runtime was already running, nothing is reset.
    """
    was_initialized = runtime_initialized()
    try:
        yield
    finally:
        if not was_initialized and runtime_initialized():
            eager_context._reset_context()  # pylint: disable=protected-access
