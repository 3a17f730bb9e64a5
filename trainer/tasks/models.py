"""Built-in models, by name."""

from typing import Callable

import keras

from tfdist.errors import UsageError


def _logits(num_classes: int) -> keras.layers.Layer:
    # float32 logits keep the loss numerically stable under mixed precision.
    return keras.layers.Dense(num_classes, dtype="float32", name="logits")


def mlp(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """Two hidden layers on the flattened input."""
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(64, activation="relu"),
            _logits(num_classes),
        ],
        name="mlp",
    )


def cnn(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """A small convolutional network for 28x28-style images."""
    return keras.Sequential(
        [
            keras.Input(shape=input_shape),
            keras.layers.Conv2D(16, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            _logits(num_classes),
        ],
        name="cnn",
    )


MODELS: dict[str, Callable[[tuple[int, ...], int], keras.Model]] = {"mlp": mlp, "cnn": cnn}


def check_model_name(name: str) -> None:
    """Raises a `UsageError` unless `name` is a registered model."""
    if name not in MODELS:
        raise UsageError(f"--model is {name!r}, expected one of: {', '.join(MODELS)}")
