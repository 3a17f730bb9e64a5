"""Models that compute their own loss (keras.io "Customizing what happens in `fit`").

The lower-level variant overrides `train_step`, computes the loss itself and is
compiled without a loss. Such a model trains; Keras's default `test_step` then
has no loss to compute ("No loss to compute"), so tfdist evaluates only models
that can: those with a compiled loss, their own `test_step` or their own
`compute_loss`.
"""

import keras

__all__ = ["computes_own_loss", "evaluation_skip_reason"]


def _overrides(model: keras.Model, name: str) -> bool:
    return getattr(type(model), name, None) is not getattr(keras.Model, name)


def computes_own_loss(model: keras.Model) -> bool:
    """Whether training needs no compiled loss (`train_step` or `compute_loss` overridden)."""
    return _overrides(model, "train_step") or _overrides(model, "compute_loss")


def evaluation_skip_reason(model: keras.Model) -> str | None:
    """Why `model.evaluate` cannot run, or None when it can.

    The model must be compiled.
    """
    if getattr(model, "loss", None) is not None:
        return None
    if _overrides(model, "test_step") or _overrides(model, "compute_loss"):
        return None
    return (
        f"{type(model).__name__} overrides train_step but not test_step and was compiled "
        f"without a loss (the task's loss() is None), so Keras's test_step has no loss "
        f"to compute; override test_step (or compute_loss) to evaluate it"
    )
