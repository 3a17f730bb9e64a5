"""tfdist: distributed training of Keras 3 models on TensorFlow.

Importing `tfdist` imports nothing heavy: TensorFlow is loaded by the modules
that need it (`tfdist.distribute.strategy`, `tfdist.keras_compat`, ...), never
by the configuration and cluster modules. The packages and which may import
which: docs/architecture.md. Modules that moved there stay importable under
their old paths (`tfdist._moved`).
"""

from tfdist import _moved

_moved.install()

__version__ = "0.1.0"
