"""keras.io's GAN (examples/gan_script/gan.py, smaller) on `tfdist.resumable.fit`, on a tf.data pipeline.

    python tests/jobs/gan_script.py OUT [--kill_after_batches=N]

The model (the example's, with 8 filters) has no `call()`, overrides
`compile(d_optimizer, g_optimizer, loss_fn)`, draws its noise with
`keras.random.normal(seed=self.seed_generator)` and reports two `keras.metrics.Mean`
trackers; its `train_step` runs two gradient tapes. Writes OUT/result.json (the
optimizers' iterations, the seed generator's state, the history) and OUT/weights.npz
(every variable: the model's and its optimizers'), tests/support/model_state.py.
`--kill_after_batches` SIGKILLs the process after that many batches of this run.
Tests also call `run` in their own process (`crash_after_batches` raises, `strategy`).
The 2-worker kill and resume of this model runs the example itself
(tests/multiprocess/test_upgraded_scripts.py).
"""

import argparse
import pathlib
import sys

import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import tfdist.resumable  # noqa: E402  pylint: disable=wrong-import-position
from examples.gan_script.gan import GAN, build_discriminator, build_generator  # noqa: E402  pylint: disable=wrong-import-position
from tests.support import model_state  # noqa: E402  pylint: disable=wrong-import-position
from tests.support.fault_injection import CrashAfterBatches, KillAfterBatches  # noqa: E402  pylint: disable=wrong-import-position

LATENT_DIM = 8
BATCH = 16
STEPS_PER_EPOCH = 4
EPOCHS = 3


def build_gan() -> GAN:
    keras.utils.set_random_seed(0)
    gan = GAN(
        discriminator=build_discriminator(filters=8),
        generator=build_generator(LATENT_DIM, filters=8),
        latent_dim=LATENT_DIM,
    )
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
    return model_state.write(gan, history, out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=pathlib.Path)
    parser.add_argument("--kill_after_batches", type=int, default=0)
    args = parser.parse_args()
    run(args.out, kill_after_batches=args.kill_after_batches)


if __name__ == "__main__":
    main()
