"""keras.io's GAN ("Customizing what happens in fit()"): a model with its own optimizers.

    python examples/gan_script/before.py OUT

The guide's `GAN(keras.Model)` and its two networks are in ./gan.py: no `call()`,
`compile(d_optimizer, g_optimizer, loss_fn)`, a `train_step` that applies both
optimizers, noise from a `keras.random.SeedGenerator`. Small synthetic 8x8 images stand
in for MNIST (nothing is downloaded). after.py is this script on tfdist: 2 workers,
backups, an exact resume.
"""

import sys

import keras
import numpy as np
from gan import GAN, build_discriminator, build_generator  # keras.io's model, ./gan.py

OUT = sys.argv[1]
keras.utils.set_random_seed(1)
LATENT_DIM = 16

discriminator = build_discriminator()
generator = build_generator(LATENT_DIM)

images = np.random.default_rng(0).uniform(size=(256, 8, 8, 1)).astype("float32")
gan = GAN(discriminator=discriminator, generator=generator, latent_dim=LATENT_DIM)
gan.compile(
    d_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    g_optimizer=keras.optimizers.Adam(learning_rate=0.0003),
    loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
)
gan.fit(images, batch_size=32, epochs=2, verbose=2)
discriminator.save(f"{OUT}/discriminator.keras")
generator.save(f"{OUT}/generator.keras")
iterations = [keras.ops.convert_to_numpy(o.iterations) for o in (gan.d_optimizer, gan.g_optimizer)]
print(f"iterations: d_optimizer {int(iterations[0])}, g_optimizer {int(iterations[1])}")
