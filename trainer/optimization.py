"""The optimizer an experiment asks for, with its scaled, scheduled learning rate."""

import keras
from absl import logging

from tfdist.errors import UsageError
from tfdist.optimizers import LAMB, LARS, schedules, usual_exclusions
from tfdist.optimizers.choice import OPTIMIZERS
from trainer.config import ExperimentConfig

# LARS trust coefficient (You et al., 2017; the Model Garden and MLPerf default).
LARS_EETA = 0.001
# LAMB moments and epsilon (You et al., 2019; BERT pre-training).
LAMB_BETA_1 = 0.9
LAMB_BETA_2 = 0.999
LAMB_EPSILON = 1e-6


def build_optimizer(
    config: ExperimentConfig, *, steps_per_epoch: int, logger=logging
) -> keras.optimizers.Optimizer:
    """Builds `config.optimizer` with its learning rate scaled and scheduled.

    The base `learning_rate` is scaled from `reference_batch_size` to
    `global_batch_size` by `lr_scaling`, warmed up linearly over `warmup_steps`
    (or `warmup_epochs`), then decayed by `lr_decay` over the remaining steps
    of `epochs * steps_per_epoch`. One line names the rule and the peak rate.

    For `lars` and `lamb`, an empty `exclude_from_weight_decay` means the usual
    exclusions (biases, normalization scales and offsets: see
    `tfdist.optimizers.usual_exclusions`); an empty
    `exclude_from_layer_adaptation` excludes nothing from the trust ratio. For
    `sgd` and `adam`, `weight_decay` is Keras's decoupled decay and
    `exclude_from_weight_decay` is matched against the variable's name, which in
    the TensorFlow backend is its path.

    Args:
        config: The experiment.
        steps_per_epoch: Optimizer updates per epoch, > 0.
        logger: Where the one line goes (anything with `info`).

    Raises:
        UsageError: The schedule cannot fit the run (e.g. warmup longer than training).
    """
    if not (isinstance(steps_per_epoch, int) and steps_per_epoch > 0):
        raise UsageError(
            f"steps_per_epoch is {steps_per_epoch!r}, expected a positive "
            f"integer; set --steps_per_epoch or use a larger dataset"
        )
    peak = schedules.scale_learning_rate(
        config.learning_rate,
        rule=config.lr_scaling,
        global_batch_size=config.global_batch_size,
        reference_batch_size=config.reference_batch_size,
    )
    total_steps = config.epochs * steps_per_epoch
    warmup_steps = config.warmup_steps or round(config.warmup_epochs * steps_per_epoch)
    if warmup_steps > total_steps:
        raise UsageError(
            f"warmup is {warmup_steps} steps but training has only {total_steps} "
            f"(--epochs={config.epochs} x {steps_per_epoch} steps); shorten "
            f"--warmup_epochs/--warmup_steps or train longer"
        )
    learning_rate = _learning_rate(config, peak, total_steps, warmup_steps)
    optimizer = _optimizer(config, learning_rate)
    logger.info("%s", describe_learning_rate(config, peak, total_steps, warmup_steps))
    return optimizer


def describe_learning_rate(
    config: ExperimentConfig, peak: float, total_steps: int, warmup_steps: int
) -> str:
    """The one log line: optimizer, scaling rule, effective peak rate, schedule."""
    if config.lr_scaling == "none":
        scaling = f"lr_scaling=none: peak learning rate {peak:.6g}"
    else:
        scaling = (
            f"lr_scaling={config.lr_scaling}: base learning rate "
            f"{config.learning_rate:.6g} at reference batch "
            f"{config.reference_batch_size} -> peak learning rate {peak:.6g} at "
            f"global batch {config.global_batch_size}"
        )
    decay_steps = total_steps - warmup_steps
    decay = {
        "constant": "then constant",
        "cosine": f"then cosine decay to 0 over {decay_steps} steps",
        "polynomial": (
            f"then polynomial decay (power {config.decay_power:g}) to 0 over {decay_steps} steps"
        ),
        "step": (
            f"then x{config.decay_rate:g} at fractions "
            f"{','.join(f'{b:g}' for b in config.decay_boundaries)} of "
            f"{decay_steps} steps"
        ),
    }[config.lr_decay]
    return f"optimizer {config.optimizer}, {scaling}; warmup {warmup_steps} steps, {decay}"


def optimizer_exclusions(config: ExperimentConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The (weight decay, layer adaptation) exclusions passed to LARS or LAMB.

    Weight decay defaults to the usual exclusions. Layer adaptation defaults to
    none: an excluded variable is updated at the full, LARS-sized learning rate,
    which made zero-initialized biases diverge in bench/bench_optimizers.py.
    """
    weight_decay = config.exclude_from_weight_decay or usual_exclusions()
    return weight_decay, config.exclude_from_layer_adaptation


def _learning_rate(config, peak, total_steps, warmup_steps):
    if config.lr_decay == "constant" and not warmup_steps:
        return peak
    return schedules.WarmupDecay(
        peak,
        total_steps=total_steps,
        warmup_steps=warmup_steps,
        decay=config.lr_decay,
        power=config.decay_power,
        boundaries=config.decay_boundaries,
        decay_rate=config.decay_rate,
    )


def _optimizer(config, learning_rate):
    if config.optimizer in ("lars", "lamb"):
        weight_decay_exclusions, adaptation_exclusions = optimizer_exclusions(config)
        if config.optimizer == "lars":
            return LARS(
                learning_rate,
                momentum=config.momentum,
                weight_decay_rate=config.weight_decay,
                eeta=LARS_EETA,
                exclude_from_weight_decay=weight_decay_exclusions,
                exclude_from_layer_adaptation=adaptation_exclusions,
            )
        return LAMB(
            learning_rate,
            beta_1=LAMB_BETA_1,
            beta_2=LAMB_BETA_2,
            epsilon=LAMB_EPSILON,
            weight_decay_rate=config.weight_decay,
            exclude_from_weight_decay=weight_decay_exclusions,
            exclude_from_layer_adaptation=adaptation_exclusions,
        )
    weight_decay = config.weight_decay or None
    if config.optimizer == "sgd":
        optimizer = keras.optimizers.SGD(
            learning_rate, momentum=config.momentum, weight_decay=weight_decay
        )
    elif config.optimizer == "adam":
        optimizer = keras.optimizers.Adam(learning_rate, weight_decay=weight_decay)
    else:
        raise UsageError(
            f"--optimizer is {config.optimizer!r}, expected one of: {', '.join(OPTIMIZERS)}"
        )
    if weight_decay and config.exclude_from_weight_decay:
        optimizer.exclude_from_weight_decay(var_names=list(config.exclude_from_weight_decay))
    return optimizer
