"""Mixed precision in the trainer: train, save, reload and resume exactly.

`mixed_float16` must train with dynamic loss scaling (Keras 3 wraps the
optimizer in `LossScaleOptimizer` when the policy is mixed_float16), LARS and
LAMB included, on one process and on 2 workers; `mixed_bfloat16` needs no
loss scaling. A preempted run resumed from its backup must end with the
weights *and optimizer state* (loss scale and its counter included) of an
uninterrupted run.
"""

import keras


def test_mixed_float16_compiles_lars_and_lamb_inside_a_loss_scale_optimizer():
    from trainer.config import ExperimentConfig  # pylint: disable=g-import-not-at-top
    from trainer.optimization import build_optimizer  # pylint: disable=g-import-not-at-top
    from trainer.tasks import models  # pylint: disable=g-import-not-at-top

    previous = keras.mixed_precision.global_policy()
    try:
        for policy, wrapped in (("mixed_float16", True), ("mixed_bfloat16", False)):
            keras.mixed_precision.set_global_policy(policy)
            for name in ("lars", "lamb"):
                model = models.mlp((28, 28, 1), 10)
                optimizer = build_optimizer(ExperimentConfig(optimizer=name), steps_per_epoch=10)
                model.compile(optimizer=optimizer, loss="mse")
                is_wrapped = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
                assert is_wrapped == wrapped, (policy, name)
                inner = model.optimizer.inner_optimizer if is_wrapped else model.optimizer
                assert type(inner).__name__ == name.upper()
                assert model.layers[1].compute_dtype == policy.split("_")[1]
    finally:
        keras.mixed_precision.set_global_policy(previous)
