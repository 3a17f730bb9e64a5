"""The data and model of TensorFlow's "Multi-worker training with Keras" tutorial, in Keras 3.

The tutorial loads MNIST with `tf.keras.datasets.mnist.load_data()`, which
downloads it. Here the images are synthetic and MNIST-shaped (28x28 uint8
pixels, labels 0-9), made from a fixed seed, so nothing is downloaded and every
worker builds the same data. Each class is a fixed random pattern of strokes
under noise, so the model has something to learn.
"""

import keras
import numpy as np
import tensorflow as tf

NUM_EXAMPLES = 6000  # MNIST has 60000; a tenth is plenty for a tutorial run.


def synthetic_mnist(num_examples: int = NUM_EXAMPLES, seed: int = 0):
    """`(x_train, y_train)` shaped like MNIST's: uint8 `(n, 28, 28)` and uint8 `(n,)`."""
    rng = np.random.default_rng(seed)
    patterns = rng.random((10, 28, 28)) < 0.15
    y_train = rng.integers(0, 10, size=num_examples).astype(np.uint8)
    noise = rng.integers(0, 64, size=(num_examples, 28, 28))
    x_train = (patterns[y_train] * 191 + noise).astype(np.uint8)
    return x_train, y_train


def mnist_dataset(batch_size):
    x_train, y_train = synthetic_mnist()
    # The `x` arrays are uint8 in [0, 255]; the model wants float32 in [0, 1].
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = (
        tf.data.Dataset.from_tensor_slices((x_train, y_train))
        .shuffle(len(x_train))
        .repeat()
        .batch(batch_size)
    )
    return train_dataset


def build_and_compile_cnn_model():
    model = keras.Sequential(
        [
            keras.Input(shape=(28, 28)),
            keras.layers.Reshape(target_shape=(28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.SGD(learning_rate=0.001),
        metrics=["accuracy"],
    )
    return model
