"""tfdist: distributed training of Keras 3 models on TensorFlow.

Importing `tfdist` imports nothing heavy: TensorFlow is loaded by the modules
that need it (`tfdist.distribute.strategy`, `tfdist.keras_compat`, ...), never
by the configuration and cluster modules. The packages and which may import
which: docs/architecture.md.
"""

__version__ = "0.1.0"
