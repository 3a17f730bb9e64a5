"""keras.io's GAN ("Customizing what happens in fit()"): a model with its own optimizers.

    python -m tfdist.launch --workers 2 -- python examples/gan_script/after.py OUT

The guide's `GAN(keras.Model)`: no `call()`, `compile(d_optimizer, g_optimizer,
loss_fn)`, a `train_step` that applies both optimizers, noise from a
`keras.random.SeedGenerator`. Upgraded as a script without a strategy is: import
tfdist, `set_strategy_from_environment()` at the top, `tfdist.resumable.fit` in place
of `gan.fit` (the images are NumPy arrays: no labels), `write_path` for the files only
the chief should write. Small synthetic 8x8 images stand
in for MNIST (nothing is downloaded). Backs up to OUT/backup every 4 steps.
"""

import sys

import keras
import numpy as np
import tensorflow as tf

import tfdist.resumable

tfdist.resumable.set_strategy_from_environment()  # no `with strategy.scope():` needed
OUT = sys.argv[1]
keras.utils.set_random_seed(1)
LATENT_DIM = 16

discriminator = keras.Sequential(
    [
        keras.Input(shape=(8, 8, 1)),
        keras.layers.Conv2D(16, (3, 3), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.GlobalMaxPooling2D(),
        keras.layers.Dense(1),
    ],
    name="discriminator",
)
generator = keras.Sequential(
    [
        keras.Input(shape=(LATENT_DIM,)),
        keras.layers.Dense(4 * 4 * 16),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Reshape((4, 4, 16)),
        keras.layers.Conv2DTranspose(16, (4, 4), strides=(2, 2), padding="same"),
        keras.layers.LeakyReLU(negative_slope=0.2),
        keras.layers.Conv2D(1, (3, 3), padding="same", activation="sigmoid"),
    ],
    name="generator",
)


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
        batch_size = tf.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )
        generated_images = self.generator(random_latent_vectors)
        combined_images = tf.concat([generated_images, real_images], axis=0)
        labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply(grads, self.discriminator.trainable_weights)

        random_latent_vectors = keras.random.normal(
            shape=(batch_size, self.latent_dim), seed=self.seed_generator
        )
        misleading_labels = tf.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply(grads, self.generator.trainable_weights)

        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}


images = np.random.default_rng(0).uniform(size=(256, 8, 8, 1)).astype("float32")
gan = GAN(discriminator=discriminator, generator=generator, latent_dim=LATENT_DIM)
gan.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
)
tfdist.resumable.fit(
    gan, images, batch_size=32, epochs=2, verbose=2, backup_dir=f"{OUT}/backup", save_freq=4
)
discriminator.save(tfdist.resumable.write_path(f"{OUT}/discriminator.keras"))
generator.save(tfdist.resumable.write_path(f"{OUT}/generator.keras"))
iterations = [keras.ops.convert_to_numpy(o.iterations) for o in (gan.d_optimizer, gan.g_optimizer)]
print(f"iterations: d_optimizer {int(iterations[0])}, g_optimizer {int(iterations[1])}")
