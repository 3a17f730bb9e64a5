"""keras.io's GAN (the custom-train-step guide) on `tfdist.resumable.fit`, on small data.

    python tests/jobs/gan_script.py OUT [--kill_after_batches=N] [--multiworker]
        [--chief_lingers=SECONDS]

The model has no `call()`, overrides `compile(d_optimizer, g_optimizer,
loss_fn)`, draws its noise with `keras.random.normal(seed=self.seed_generator)`
and reports two `keras.metrics.Mean` trackers; its `train_step` runs two
gradient tapes. Writes OUT/result.json (both optimizers' iterations, the
seed generator's state, the final logs) and OUT/weights.npz (every variable:
the model's and both optimizers'). `--kill_after_batches` SIGKILLs the process
after that many batches of this run; `--chief_lingers` keeps the chief's process
that long after its outputs are written (a chief that writes large outputs), past
TensorFlow's 10 s heartbeat timeout. Tests also call `run` in their own process
(`crash_after_batches` raises).
"""

import argparse
import json
import os
import pathlib
import sys
import time

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import tfdist.resumable  # noqa: E402  pylint: disable=wrong-import-position
from tests.support.fault_injection import CrashAfterBatches, KillAfterBatches  # noqa: E402  pylint: disable=wrong-import-position

LATENT_DIM = 8
BATCH = 16
STEPS_PER_EPOCH = 4
EPOCHS = 3


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
        self.seed_generator = keras.random.SeedGenerator(1337)

    @property
    def metrics(self):
        return [self.d_loss_tracker, self.g_loss_tracker]

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn

    def train_step(self, real_images):
        if isinstance(real_images, tuple):
            real_images = real_images[0]
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )
        generated_images = self.generator(random_latent_vectors)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )
        misleading_labels = ops.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


def build_gan() -> GAN:
    keras.utils.set_random_seed(0)
    discriminator = keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1)),
            layers.Conv2D(8, 3, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.GlobalMaxPooling2D(),
            layers.Dense(1),
        ],
        name="discriminator",
    )
    generator = keras.Sequential(
        [
            keras.Input(shape=(LATENT_DIM,)),
            layers.Dense(4 * 4 * 8),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Reshape((4, 4, 8)),
            layers.Conv2DTranspose(8, 4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(1, 3, padding="same", activation="sigmoid"),
        ],
        name="generator",
    )
    gan = GAN(discriminator=discriminator, generator=generator, latent_dim=LATENT_DIM)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    return gan


def dataset() -> tf.data.Dataset:
    images = np.random.default_rng(0).random((STEPS_PER_EPOCH * BATCH, 8, 8, 1))
    return (
        tf.data.Dataset.from_tensor_slices(images.astype("float32"))
        .shuffle(1024, seed=0, reshuffle_each_iteration=False)
        .batch(BATCH)
    )


def state_arrays(gan: GAN) -> dict[str, np.ndarray]:
    """Every variable of the model and of both optimizers, by role and position."""
    arrays = {f"model/{i}": np.asarray(v.numpy()) for i, v in enumerate(gan.variables)}
    for name in ("d_optimizer", "g_optimizer"):
        for i, variable in enumerate(getattr(gan, name).variables):
            arrays[f"{name}/{i}"] = np.asarray(variable.numpy())
    return arrays


def run(
    out: pathlib.Path,
    *,
    kill_after_batches: int = 0,
    crash_after_batches: int = 0,
    strategy=None,
    save_freq=3,
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    if strategy is None:
        gan = build_gan()
    else:
        with strategy.scope():
            gan = build_gan()
    callbacks = []
    if kill_after_batches:
        callbacks.append(KillAfterBatches(kill_after_batches))
    if crash_after_batches:
        callbacks.append(CrashAfterBatches(crash_after_batches))
    history = tfdist.resumable.fit(
        gan,
        dataset(),
        epochs=EPOCHS,
        save_freq=save_freq,
        backup_dir=str(out / "backup"),
        callbacks=callbacks,
        verbose=0,
    )
    result = {
        "d_iterations": int(gan.d_optimizer.iterations.numpy()),
        "g_iterations": int(gan.g_optimizer.iterations.numpy()),
        "seed_state": [int(x) for x in gan.seed_generator.state.numpy()],
        "history": history.history,
    }
    path = pathlib.Path(tfdist.resumable.write_path(str(out / "result.json")))
    path.write_text(json.dumps(result, indent=1, default=float))
    np.savez(tfdist.resumable.write_path(str(out / "weights.npz")), **state_arrays(gan))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--kill_after_batches", type=int, default=0)
    parser.add_argument("--multiworker", action="store_true")
    parser.add_argument("--chief_lingers", type=float, default=0.0)
    args = parser.parse_args()
    strategy = tfdist.resumable.strategy_from_environment() if args.multiworker else None
    run(args.out, kill_after_batches=args.kill_after_batches, strategy=strategy)
    chief = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0) == 0
    if chief:
        time.sleep(args.chief_lingers)


if __name__ == "__main__":
    main()
