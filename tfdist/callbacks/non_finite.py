"""Stop training on a non-finite loss or variable, with its own error.

`BackupAndRestore` already checks the loss every batch and the variables
before every backup; `NonFiniteGuard` is for runs without backups. Both raise
`tfdist.errors.NonFiniteError`, which command-line entry points turn into
`tfdist.cli.EXIT_NON_FINITE`. Unlike `keras.callbacks.TerminateOnNaN` the run
fails instead of ending as if it had succeeded.
"""

import math

import keras

from tfdist.backups.finite import FiniteCheck
from tfdist.backups.paths import model_variable_paths
from tfdist.errors import NonFiniteError

__all__ = ["check_loss", "NonFiniteGuard"]


def check_loss(logs, *, where: str, after: str = "") -> None:
    """Raises `NonFiniteError` if `logs["loss"]` is NaN or infinite.

    Costs one float comparison: Keras hands batch callbacks Python floats.

    Args:
        logs: A Keras callback's `logs`.
        where: Where training is, e.g. `"step 120"`.
        after: Appended to the message, e.g. what the last backup holds.
    """
    loss = (logs or {}).get("loss")
    if loss is None:
        return
    value = float(loss)
    if not math.isfinite(value):
        raise NonFiniteError(
            f"the training loss is {value} at {where}; stopped{after}; lower the learning "
            f"rate or check the input data"
        )


class NonFiniteGuard(keras.callbacks.Callback):
    """Raises `NonFiniteError` on a NaN/Inf loss (every batch) or variable (every epoch).

    Args:
        check_variables: Also check every model and optimizer variable at
            the end of each epoch (one fused reduction).
    """

    def __init__(self, *, check_variables: bool = True):
        super().__init__()
        self._check_variables = bool(check_variables)
        self._epoch = 0
        self._finite_check = None

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        check_loss(logs, where=f"batch {batch} of epoch {self._epoch}")

    def on_epoch_end(self, epoch, logs=None):
        if not self._check_variables:
            return
        if self._finite_check is None:
            named = [
                (path or variable.path, variable)
                for path, variable in zip(model_variable_paths(self.model), self.model.variables)
            ]
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None:
                named += [
                    (f"optimizer {variable.path}", variable) for variable in optimizer.variables
                ]
            self._finite_check = FiniteCheck(named)
        bad = self._finite_check.non_finite()
        if bad:
            raise NonFiniteError(
                f"non-finite values (NaN or Inf) in {bad[0]}"
                + (f" and {len(bad) - 1} more" if len(bad) > 1 else "")
                + f" at the end of epoch {epoch}; lower the learning rate or check the "
                f"input data"
            )
