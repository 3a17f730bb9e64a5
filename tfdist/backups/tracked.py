"""What a model tracks beyond `model.variables` and `model.optimizer`.

A `tf.train.Checkpoint` of an object follows every trackable attribute of it;
a model's training state, in its users' eyes, is all of them. Keras 3's
`model.variables` holds the weights and the layers' seed-generator states, and
`model.optimizer` the compiled optimizer, but a model may hold more, as
keras.io's GAN does (`compile(d_optimizer, g_optimizer, loss_fn)`):

    d_optimizer/iteration                          an optimizer of its own
    d_optimizer/momentum@discriminator/layers/conv2d/kernel
    seen/total                                     a metric Keras does not reset
    noise/state                                    a `tf.random.Generator`
    step_counter                                   a `tf.Variable` attribute

Each is keyed by the attribute path that holds it (the layer's path, as in
`paths`, then the attribute) and the variable's own key: an optimizer's slots
by the stable path of the model variable they belong to, so a restore by key is
a restore by stable path. Metrics the model reports (`model.metrics`) are left
out: Keras resets them at every epoch and the backup callback carries an
interrupted epoch's sums itself.
"""

import collections
import contextlib
import dataclasses
from typing import Mapping

import keras
import tensorflow as tf

from tfdist.backups.paths import (
    attribute_items,
    model_variable_paths,
    optimizer_variable_keys,
    walk_layers,
)
from tfdist.errors import UsageError

__all__ = [
    "Entry",
    "TrackedState",
    "tracked_state",
    "entries_of",
    "build_saved_optimizers",
    "ensure_built",
]

# (key, shape, dtype), as `fingerprint.VariableEntry`.
Entry = tuple[str, list[int], str]

_KINDS = (
    keras.optimizers.Optimizer,
    keras.metrics.Metric,
    keras.random.SeedGenerator,
    keras.Variable,
    tf.Variable,
    tf.random.Generator,
    tf.Module,
)


@dataclasses.dataclass(frozen=True)
class TrackedState:
    """The extra state of a model, keyed for a checkpoint.

    Attributes:
        variables: Key to variable, in a fixed order.
        optimizers: Attribute path to each optimizer other than `model.optimizer`.
    """

    variables: Mapping[str, object]
    optimizers: Mapping[str, object]


def _held_variables(item) -> list[tuple[str | None, object]]:
    """`(key within the holder, variable)` of one tracked object."""
    if isinstance(item, keras.random.SeedGenerator):
        return [(item.state.name, item.state)]
    if isinstance(item, keras.metrics.Metric):
        return [(variable.name, variable) for variable in item.variables]
    if isinstance(item, (keras.Variable, tf.Variable)):
        return [(None, item)]
    if isinstance(item, tf.random.Generator):
        return [("state", item.state)]
    return [(str(index), variable) for index, variable in enumerate(item.variables)]


def _dtype_name(variable) -> str:
    dtype = variable.dtype
    return getattr(dtype, "name", None) or str(dtype)


def tracked_state(model) -> TrackedState:
    """The state `model` holds outside `model.variables`, `model.optimizer` and `model.metrics`.

    Args:
        model: A Keras model (built or not).
    """
    covered = {id(variable) for variable in model.variables}
    optimizer = getattr(model, "optimizer", None)
    skip_optimizers = set()
    if optimizer is not None:
        covered |= {id(variable) for variable in optimizer.variables}
        skip_optimizers = {id(optimizer), id(getattr(optimizer, "inner_optimizer", None))}
    covered |= {id(variable) for variable in getattr(model, "metrics_variables", [])}
    variables: dict[str, object] = {}
    optimizers: dict[str, object] = {}

    def add(key: str, variable) -> None:
        if id(variable) in covered:
            return
        covered.add(id(variable))
        while key in variables:  # two unnamed variables of one holder
            key = f"{key}#"
        variables[key] = variable

    for prefix, layer in walk_layers(model):
        for name, item in attribute_items(layer, _KINDS):
            path = f"{prefix}{name}"
            if isinstance(item, keras.optimizers.Optimizer):
                if id(item) in skip_optimizers or path in optimizers:
                    continue
                if any(item is other for other in optimizers.values()):
                    continue
                optimizers[path] = item
                keys = optimizer_variable_keys(item, model)
                for index, (key, variable) in enumerate(zip(keys, item.variables)):
                    add(f"{path}/{key or f'#{index}'}", variable)
                continue
            for key, variable in _held_variables(item):
                add(path if key is None else f"{path}/{key}", variable)
    return TrackedState(variables=variables, optimizers=optimizers)


def entries_of(state: TrackedState) -> tuple[Entry, ...]:
    """`(key, shape, dtype)` of each tracked variable, as a fingerprint records them."""
    return tuple(
        (key, [int(d) for d in variable.shape], _dtype_name(variable))
        for key, variable in state.variables.items()
    )


def build_saved_optimizers(
    state: TrackedState, saved: tuple[Entry, ...], model, *, strategy=None
) -> bool:
    """Builds each unbuilt extra optimizer for the model variables it had slots for in a backup.

    Keras builds an optimizer at its first `apply_gradients`, for the
    variables given there; a backup taken later holds the slots of those
    variables, which must exist before it can be read into them.

    Returns:
        Whether an optimizer was built (the tracked state changed).
    """
    by_path = dict(zip(model_variable_paths(model), model.variables))
    built_any = False
    for path, optimizer in state.optimizers.items():
        if optimizer.built:
            continue
        wanted = collections.OrderedDict()
        for key, _, _ in saved:
            if key.startswith(f"{path}/") and "@" in key:
                wanted.setdefault(key.split("@", 1)[1], None)
        targets = [by_path[name] for name in wanted if name in by_path]
        if not targets:
            continue
        scope = strategy.scope() if strategy is not None else contextlib.nullcontext()
        with scope:
            optimizer.build(targets)
        built_any = True
    return built_any


def _has_own_call(model) -> bool:
    return type(model).call not in (keras.Model.call, keras.layers.Layer.call)


def ensure_built(model) -> None:
    """Marks a model without `call()` built, as Keras's default `build` does.

    Such a model (keras.io's GAN) trains through its own `train_step` on
    layers built with their own inputs; Keras never builds it, and under a
    distribution strategy `fit` refuses it unless it is marked built.

    Raises:
        UsageError: The model is unbuilt and can be built (it has a `call()`),
            or it has no `call()` and one of its layers that creates weights
            is unbuilt.
    """
    if model.built:
        return
    if _has_own_call(model):
        raise UsageError(
            f"model {model.name!r} is not built, expected a built model to back up; "
            f"build it (call it on a batch or give it an Input) before training"
        )
    unbuilt = [
        path.rstrip("/")
        for path, layer in walk_layers(model)[1:]
        if not layer.built and type(layer).build is not keras.layers.Layer.build
    ]
    if unbuilt:
        raise UsageError(
            f"model {model.name!r} has no call() and its layer(s) {', '.join(unbuilt)} are "
            f"not built, expected their weights to exist before training so that a backup "
            f"can restore them; give each a keras.Input (keras.Sequential([keras.Input(shape), "
            f"...])) or call layer.build(input_shape) before training"
        )
    model.built = True
