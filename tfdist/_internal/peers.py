"""What a collective or a remote call raises when another task of the job died or hung."""

import tensorflow as tf

# The same four under MultiWorkerMirroredStrategy collectives and on a
# ParameterServerStrategy coordinator whose parameter server is gone.
PEER_FAILURES = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)
