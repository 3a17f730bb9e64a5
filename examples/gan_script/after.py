"""keras.io's GAN ("Customizing what happens in fit()"): a model with its own optimizers.

    python -m tfdist.launch --workers 2 -- python examples/gan_script/after.py OUT

The guide's `GAN(keras.Model)` and its two networks are in ./gan.py: no `call()`,
`compile(d_optimizer, g_optimizer, loss_fn)`, a `train_step` that applies both
optimizers, noise from a `keras.random.SeedGenerator`. Upgraded from before.py as a script without a strategy is: import
tfdist, `set_strategy_from_environment()` at the top, `tfdist.resumable.fit` in place
of `gan.fit` (the images are NumPy arrays: no labels), `write_path` for the files only
the chief should write. Small synthetic 8x8 images stand
in for MNIST (nothing is downloaded). Backs up to OUT/backup every 4 steps.
"""

import sys

import keras
import numpy as np
from gan import GAN, build_discriminator, build_generator  # keras.io's model, ./gan.py

import tfdist.resumable

tfdist.resumable.set_strategy_from_environment()  # no `with strategy.scope():` needed
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
tfdist.resumable.fit(
    gan, images, batch_size=32, epochs=2, verbose=2, backup_dir=f"{OUT}/backup", save_freq=4
)
discriminator.save(tfdist.resumable.write_path(f"{OUT}/discriminator.keras"))
generator.save(tfdist.resumable.write_path(f"{OUT}/generator.keras"))
iterations = [keras.ops.convert_to_numpy(o.iterations) for o in (gan.d_optimizer, gan.g_optimizer)]
print(f"iterations: d_optimizer {int(iterations[0])}, g_optimizer {int(iterations[1])}")
