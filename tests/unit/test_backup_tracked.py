"""What a model tracks beyond its variables and compiled optimizer is backed up too.

keras.io's GAN (examples/gan_script/gan.py, run by tests/jobs/gan_script.py) holds two optimizers of its own, a
seed generator and two metric trackers, and has no `call()`. Killing real
processes (1 and 2 workers) is in tests/multiprocess/test_backup_tracked.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.jobs import gan_script
from tfdist.backups import BackupStore, TrainingBackup
from tfdist.backups.tracked import tracked_state
from tfdist.errors import BackupMismatchError, UsageError


@pytest.fixture(scope="module")
def strategy():
    # One replica, but a strategy: Keras's fit then builds the model symbolically
    # and refuses a model without call() that is not marked built.
    return tf.distribute.MirroredStrategy(["/cpu:0"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, strategy):
    out = tmp_path_factory.mktemp("gan_reference")
    return out, gan_script.run(out, strategy=strategy)


def _arrays(out) -> dict[str, np.ndarray]:
    with np.load(out / "weights.npz") as data:
        return {name: data[name] for name in data.files}


def test_a_crashed_gan_resumes_bit_for_bit_both_optimizers_included(tmp_path, strategy, reference):
    # Backups every 3 steps; the crash after step 7 resumes from step 6, mid-epoch 1.
    with pytest.raises(RuntimeError, match="simulated crash"):
        gan_script.run(tmp_path, crash_after_batches=7, strategy=strategy)
    result = gan_script.run(tmp_path, strategy=strategy)

    out, expected = reference
    steps = gan_script.EPOCHS * gan_script.STEPS_PER_EPOCH
    assert [expected["iterations"][name] for name in ("d_optimizer", "g_optimizer")] == [steps] * 2
    assert result["iterations"] == expected["iterations"]
    assert result["seed_states"] == expected["seed_states"]
    assert result["history"] == expected["history"]
    want, got = _arrays(out), _arrays(tmp_path)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_the_gan_s_own_optimizers_are_tracked_by_attribute_and_stable_path(strategy):
    with strategy.scope():
        gan = gan_script.build_gan()
    before = tracked_state(gan)
    assert list(before.optimizers) == ["d_optimizer", "g_optimizer"]
    # Before the first step Keras has not built them: their counters only.
    assert list(before.variables) == [
        "d_optimizer/iteration",
        "d_optimizer/learning_rate",
        "g_optimizer/iteration",
        "g_optimizer/learning_rate",
    ]
    with strategy.scope():
        gan.d_optimizer.build(gan.discriminator.trainable_variables)
    keys = list(tracked_state(gan).variables)
    assert "d_optimizer/momentum@discriminator/layers/conv2_d/kernel" in keys
    assert "d_optimizer/velocity@discriminator/layers/dense/bias" in keys
    # The reported metrics are not: Keras resets them every epoch.
    assert not [key for key in keys if "loss" in key]


def test_state_a_model_holds_outside_its_layers_is_tracked():
    class Counting(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)
            self.noise = tf.random.Generator.from_seed(1)
            self.extra_optimizers = [keras.optimizers.SGD(0.1)]

        def call(self, x):
            return self.dense(x)

    model = Counting()
    model(np.zeros((1, 3), "float32"))
    keys = list(tracked_state(model).variables)
    assert keys == [
        "extra_optimizers/0/iteration",
        "extra_optimizers/0/learning_rate",
        "noise/state",
    ]


def test_a_model_that_tracks_nothing_more_writes_the_checkpoint_it_always_did(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    assert not tracked_state(model).variables
    backup = TrainingBackup(BackupStore(str(tmp_path)), model)
    backup.restore()
    info = backup.save(global_step=1, epoch=0, step_in_epoch=1)
    names = [name for name, _ in tf.train.list_variables(info.checkpoint_prefix)]
    assert not [name for name in names if name.startswith("tracked")]
    assert info.metadata["fingerprint"]["tracked"] == []


def _gan_backup(directory, strategy, *, g_optimizer=None):
    with strategy.scope():
        gan = gan_script.build_gan()
        if g_optimizer is not None:
            gan.g_optimizer = g_optimizer
    return gan, TrainingBackup(BackupStore(str(directory)), gan, strategy=strategy)


def test_a_gan_whose_optimizer_changed_is_refused_in_one_line(tmp_path, strategy):
    gan, backup = _gan_backup(tmp_path, strategy)
    backup.restore()
    with strategy.scope():
        gan.d_optimizer.build(gan.discriminator.trainable_variables)
        gan.g_optimizer.build(gan.generator.trainable_variables)
    backup.save(global_step=1, epoch=0, step_in_epoch=1)

    _, other = _gan_backup(tmp_path, strategy, g_optimizer=keras.optimizers.SGD(0.1))
    with pytest.raises(BackupMismatchError, match=r"tracked g_optimizer/") as error:
        other.restore()
    assert "\n" not in str(error.value)

    # The same model restores, its optimizers built for the variables of the backup.
    gan, same = _gan_backup(tmp_path, strategy)
    assert same.restore().global_step == 1
    assert gan.d_optimizer.built and gan.g_optimizer.built


def test_a_model_without_call_and_an_unbuilt_layer_is_refused_naming_the_layer(tmp_path):
    class Pair(keras.Model):
        def __init__(self):
            super().__init__()
            self.encoder = keras.layers.Dense(4)

        def train_step(self, data):
            return {}

    model = Pair()
    model.compile(optimizer="sgd")
    with pytest.raises(
        UsageError, match=r"has no call\(\) and its layer\(s\) encoder are not built"
    ):
        TrainingBackup(BackupStore(str(tmp_path)), model).restore()
