"""Stable paths for a Keras model's and optimizer's variables.

`variable.path` in Keras 3 is built from layer names that come from a
per-process counter (`dense`, `dense_1`, ...): two same-shape layers of a
subclassed model created in the other order swap names, and a restore by those
names would load each into the other. The paths here follow what Keras's own
`.keras` format follows when it walks a model (`saving_lib._walk_saveable`):
the attribute names of subclassed layers and models, and the layers of a
Sequential or Functional model in order, named by class:

    q/kernel                     `self.q = Dense(...)` in a subclassed model
    blocks/1/bn/moving_mean      `self.blocks = [Block(), Block()]`
    layers/dense_1/kernel        the second Dense layer of a Sequential model
    drop/seed_generator_state    a Dropout layer's random state

A variable is named by its own name (`kernel`), or, when Keras made that name
up from its per-process counter (`add_weight()` without a name gives
`variable`, `variable_1`, ...) or two variables of one layer share it, by the
layer attribute that holds it (`self.scale = self.add_weight(...)` gives
`scale`). A variable that the walk cannot reach, or that has neither, gets no
path (`None`): such models are restored by position.

Optimizer variables are keyed by what they are for: `iteration`,
`learning_rate`, or a slot such as `momentum@q/kernel` (Keras names slots after
the model variable's `path`, which is mapped back to its stable path here).
"""

import collections.abc
import functools
import re

import keras

__all__ = [
    "attribute_items",
    "walk_layers",
    "model_variable_paths",
    "optimizer_variable_keys",
    "optimizer_class_name",
]

# Names Keras gives unnamed variables from a per-process counter.
_AUTO_VARIABLE_NAME = re.compile(r"^variable(_\d+)?$")


@functools.lru_cache(maxsize=1)
def _keras_bookkeeping() -> frozenset:
    """Instance attributes every Keras layer and model has: not the user's."""
    # Named, so that Keras's per-process name counters are left alone.
    return frozenset(vars(keras.layers.Layer(name="tfdist_reference_layer"))) | frozenset(
        vars(keras.Model(name="tfdist_reference_model"))
    )


def _snake_case(name: str) -> str:
    name = re.sub(r"(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _is_graph_model(layer) -> bool:
    """Sequential or Functional: the layer list, not attributes, is the structure."""
    return isinstance(layer, keras.Sequential) or any(
        cls.__name__ == "Functional" and cls.__module__.startswith("keras")
        for cls in type(layer).__mro__
    )


def _collect(prefix: str, value, kinds: tuple, found: list, seen: set) -> None:
    """Appends `(path, item)` for the items of type `kinds` in an attribute value."""
    if isinstance(value, kinds):
        found.append((prefix, value))
        return
    if isinstance(value, (str, bytes, keras.layers.Layer)) or id(value) in seen:
        return
    if isinstance(value, collections.abc.Mapping):
        seen.add(id(value))
        for key in value:
            _collect(f"{prefix}/{key}", value[key], kinds, found, seen)
    elif isinstance(value, collections.abc.Sequence):
        seen.add(id(value))
        for index, item in enumerate(value):
            _collect(f"{prefix}/{index}", item, kinds, found, seen)


def _user_attribute_names(layer, *, graph: bool) -> list[str]:
    """A layer's own attributes (not Keras's bookkeeping), public ones first."""
    skip = _keras_bookkeeping()
    # Public attributes first, then private ones, as Keras's own saving does.
    return sorted(
        (name for name in vars(layer) if name not in skip and not (graph and name.startswith("_"))),
        key=lambda name: (name.startswith("_"), name),
    )


def attribute_items(layer, kinds: tuple) -> list[tuple[str, object]]:
    """The objects of type `kinds` a layer holds in its own attributes.

    Looks into lists, tuples and dicts of them, not into sublayers.

    Returns:
        `(relative path, object)` pairs in a fixed order, e.g.
        `("d_optimizer", Adam)` or `("trackers/0", Mean)`.
    """
    found = []
    seen = set()
    attributes = vars(layer)
    for name in _user_attribute_names(layer, graph=_is_graph_model(layer)):
        _collect(name, attributes[name], kinds, found, seen)
    return found


def _child_layers(layer) -> list[tuple[str, object]]:
    """A layer's sublayers with their relative paths, in a fixed order."""
    children = []
    graph = _is_graph_model(layer)
    if graph:
        used = {}
        for sublayer in layer.layers:
            base = _snake_case(type(sublayer).__name__)
            count = used.get(base, 0)
            used[base] = count + 1
            children.append((f"layers/{base}" + (f"_{count}" if count else ""), sublayer))
    attributes = vars(layer)
    seen = set()
    for name in _user_attribute_names(layer, graph=graph):
        _collect(name, attributes[name], (keras.layers.Layer,), children, seen)
    return children


def walk_layers(model) -> list[tuple[str, object]]:
    """Every layer of `model` (itself first) once, with its path prefix.

    Returns:
        `(prefix, layer)` pairs depth first, e.g. `("", gan)`,
        `("discriminator/", Sequential)`, `("discriminator/layers/dense/", Dense)`;
        a layer reachable twice keeps its first path.
    """
    found: list[tuple[str, object]] = []
    visited: set[int] = set()

    def visit(layer, path: str) -> None:
        if id(layer) in visited:
            return
        visited.add(id(layer))
        found.append((path, layer))
        for name, child in _child_layers(layer):
            visit(child, f"{path}{name}/")

    visit(model, "")
    return found


def model_variable_paths(model) -> list[str | None]:
    """The stable path of each of `model.variables`, in that order.

    Args:
        model: A built Keras layer or model.

    Returns:
        One path per variable; `None` where no stable path could be had.
    """
    assigned: dict[int, str | None] = {}
    for path, layer in walk_layers(model):
        children = _child_layers(layer)
        in_children = {id(variable) for _, child in children for variable in child.variables}
        own = [variable for variable in layer.variables if id(variable) not in in_children]
        counts = collections.Counter(variable.name for variable in own)
        holders = {}
        for name, value in sorted(
            vars(layer).items(), key=lambda item: (item[0].startswith("_"), item[0])
        ):
            if isinstance(value, keras.Variable):
                holders.setdefault(id(value), name)
        for variable in own:
            if id(variable) in assigned:
                continue
            label = variable.name
            if counts[label] > 1 or _AUTO_VARIABLE_NAME.match(label):
                label = holders.get(id(variable))
            assigned[id(variable)] = f"{path}{label}" if label else None
    return [assigned.get(id(variable)) for variable in model.variables]


def _own_optimizer_variables(optimizer) -> tuple[list, object | None]:
    inner = getattr(optimizer, "inner_optimizer", None)
    if inner is None:
        return list(optimizer.variables), None
    inner_ids = {id(variable) for variable in inner.variables}
    return [v for v in optimizer.variables if id(v) not in inner_ids], inner


def optimizer_variable_keys(optimizer, model) -> list[str | None]:
    """A stable key for each of `optimizer.variables`, in that order.

    A slot of model variable `q/kernel` is `momentum@q/kernel`; others keep
    their name (`iteration`, `learning_rate`); a wrapped optimizer's (loss
    scaling) variables are prefixed with `inner/`. `None` where a slot's model
    variable cannot be told apart.
    """
    stable = dict(zip((id(v) for v in model.variables), model_variable_paths(model)))
    by_prefix: dict[str, str | None] = {}
    for variable in model.trainable_variables:
        prefix = variable.path.replace("/", "_") + "_"
        path = stable.get(id(variable))
        by_prefix[prefix] = None if prefix in by_prefix else path

    def key(variable) -> str | None:
        name = variable.name
        matches = [prefix for prefix in by_prefix if name.startswith(prefix)]
        if not matches:
            return name
        prefix = max(matches, key=len)
        path = by_prefix[prefix]
        return None if path is None else f"{name[len(prefix) :]}@{path}"

    keys = {}
    own, inner = _own_optimizer_variables(optimizer)
    for variable in own:
        keys[id(variable)] = key(variable)
    if inner is not None:
        for variable in inner.variables:
            inner_key = key(variable)
            keys[id(variable)] = None if inner_key is None else f"inner/{inner_key}"
    return [keys.get(id(variable)) for variable in optimizer.variables]


def optimizer_class_name(optimizer) -> str | None:
    """`"Adam"`, or `"LossScaleOptimizer(Adam)"` for a wrapped optimizer."""
    if optimizer is None:
        return None
    inner = getattr(optimizer, "inner_optimizer", None)
    name = type(optimizer).__name__
    return f"{name}({optimizer_class_name(inner)})" if inner is not None else name
