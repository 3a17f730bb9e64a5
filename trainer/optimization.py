"""Builds the optimizer an experiment asks for (minimal: sgd and adam).

The large-batch issue extends this with LARS, LAMB, scaling and schedules.
"""

import keras

from tfdist.errors import UsageError


def build_optimizer(config, *, steps_per_epoch: int) -> keras.optimizers.Optimizer:
    del steps_per_epoch
    if config.optimizer == "sgd":
        return keras.optimizers.SGD(config.learning_rate, momentum=config.momentum)
    if config.optimizer == "adam":
        return keras.optimizers.Adam(config.learning_rate)
    raise UsageError(f"--optimizer={config.optimizer} is not supported yet")
