"""Large-batch optimizers for Keras 3: LARS and LAMB, their usual exclusions, and the
optimizer names and argument ranges a configuration checks.

    choice        optimizer and schedule names, argument ranges   no TensorFlow
    exclusions    which variables skip weight decay or adaptation  no TensorFlow
    lars, lamb    the optimizers LARS and LAMB                     Keras
    schedules     the learning-rate schedule WarmupDecay           Keras

Importing this package (or `choice`, `exclusions`) loads no Keras, so that a
configuration is checked before TensorFlow starts. `LARS` and `LAMB` are loaded
on first use (`from tfdist.optimizers import LARS`, `tfdist.optimizers.LAMB`),
and that first use of either registers all of `tfdist>LARS`, `tfdist>LAMB` and
the schedule `tfdist>WarmupDecay` with Keras, so a `model.keras` saved with them
loads back by name.
"""

import importlib

from tfdist.optimizers.exclusions import usual_exclusions

__all__ = ["LAMB", "LARS", "usual_exclusions"]

# The names loaded on first use: name -> the module that defines it.
_ON_FIRST_USE = {"LAMB": "tfdist.optimizers.lamb", "LARS": "tfdist.optimizers.lars"}
# What the first use loads: every module that registers a name with Keras.
_KERAS_MODULES = ("tfdist.optimizers.lamb", "tfdist.optimizers.lars", "tfdist.optimizers.schedules")


def __getattr__(name: str):
    if name in _ON_FIRST_USE:
        for module in _KERAS_MODULES:
            importlib.import_module(module)
        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
