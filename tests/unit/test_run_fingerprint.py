"""A restart under other settings is refused, never resumed silently wrong.

Every backup carries a run fingerprint: the model's variables by stable path
(attribute names, not Keras's per-process layer names), the optimizer's class
and variables, the mixed-precision policy and the caller's run settings. These
tests restart with one thing changed and check what the user sees: a one-line
`UsageError` naming the field, old and new value, and a backup directory whose
files are byte-for-byte what they were; or, for the q/k swap, each weight
restored into the layer it was trained in.
"""

import json
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.support.backup_files import snapshot
from tfdist.backups import BackupStore, TrainingBackup
from tfdist.backups.paths import model_variable_paths
from tfdist.callbacks import BackupAndRestore
from tfdist.errors import UsageError
from tfdist.optimizers import LAMB, LARS


@pytest.fixture(autouse=True)
def _float32_policy():
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


def _x(n=32):
    return np.random.RandomState(0).rand(n, 4).astype("float32")


def _sequential(optimizer=None, seed=1):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer or keras.optimizers.Adam(0.01), "mse")
    return model


def _trained_backup_dir(tmp_path, model, *, steps=(4, 8), **kwargs) -> str:
    backup_dir = str(tmp_path / "backup")
    backup = TrainingBackup(BackupStore(backup_dir), model, **kwargs)
    x = _x()
    for step in steps:
        model.fit(x, x.sum(1), epochs=1, batch_size=8, verbose=0)
        backup.save(global_step=step, epoch=step // 4, step_in_epoch=0, steps_per_epoch=4)
    return backup_dir


def _assert_refused(backup_dir, model, match, **kwargs) -> UsageError:
    before = snapshot(backup_dir)
    with pytest.raises(UsageError, match=match) as error:
        TrainingBackup(BackupStore(backup_dir), model, **kwargs).restore()
    assert "\n" not in str(error.value)
    assert snapshot(backup_dir) == before  # no prune, delete, quarantine or marker
    return error.value


# ------------------------------------------------------------- mixed precision


def test_mixed_precision_restart_is_refused_and_no_backup_is_touched(tmp_path):
    backup_dir = _trained_backup_dir(tmp_path, _sequential())
    keras.config.set_dtype_policy("mixed_float16")
    error = _assert_refused(
        backup_dir,
        _sequential(),
        r"was made with dtype_policy=\"float32\", this run has "
        r"\"mixed_float16\"",
    )
    assert backup_dir in str(error)


def test_mixed_precision_restart_through_the_callback_leaves_every_backup(tmp_path):
    backup_dir = str(tmp_path / "backup")
    model = _sequential()
    backup = BackupAndRestore(backup_dir, save_freq=2, preemption=None, delete_checkpoint=False)
    x = _x()
    model.fit(x, x.sum(1), epochs=2, batch_size=8, verbose=0, callbacks=[backup])
    listing = sorted(os.listdir(backup_dir))
    os.remove(os.path.join(backup_dir, "COMPLETED.json"))  # an interrupted run
    before = snapshot(backup_dir)
    keras.config.set_dtype_policy("mixed_float16")
    restarted = BackupAndRestore(backup_dir, save_freq=2, preemption=None)
    with pytest.raises(UsageError, match="dtype_policy"):
        restarted.resume(_sequential(), epochs=3, steps_per_epoch=4)
    assert snapshot(backup_dir) == before
    assert "backup-000000000008" in listing


# ------------------------------------------------------------------ q/k swap


class Attention(keras.Model):
    """Two same-shape projections whose creation order is a constructor flag."""

    def __init__(self, k_first: bool = False):
        super().__init__()
        if k_first:
            self.k = keras.layers.Dense(4)
            self.q = keras.layers.Dense(4)
        else:
            self.q = keras.layers.Dense(4)
            self.k = keras.layers.Dense(4)
        self.norm = keras.layers.BatchNormalization()
        self.head = keras.layers.Dense(1)

    def call(self, inputs, training=False):
        mixed = self.q(inputs) * 0.5 + self.k(inputs) * 2.0
        return self.head(self.norm(mixed, training=training))


def _attention(k_first: bool, seed: int):
    keras.utils.set_random_seed(seed)
    model = Attention(k_first=k_first)
    model(_x(2))
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def test_stable_paths_follow_attribute_names_not_creation_order():
    q_first, k_first = _attention(False, 1), _attention(True, 1)
    assert q_first.variables[0] is q_first.q.kernel
    assert k_first.variables[0] is k_first.k.kernel
    assert dict(zip(model_variable_paths(q_first), [v.shape for v in q_first.variables])) == dict(
        zip(model_variable_paths(k_first), [v.shape for v in k_first.variables])
    )
    paths = model_variable_paths(k_first)
    assert paths[:2] == ["k/kernel", "k/bias"]
    assert "norm/moving_mean" in paths and "head/kernel" in paths
    assert model_variable_paths(_sequential()) == [
        "layers/dense/kernel",
        "layers/dense/bias",
        "layers/batch_normalization/gamma",
        "layers/batch_normalization/beta",
        "layers/batch_normalization/moving_mean",
        "layers/batch_normalization/moving_variance",
        "layers/dense_1/kernel",
        "layers/dense_1/bias",
    ]


def test_q_k_created_in_the_other_order_restore_into_the_right_layers(tmp_path):
    trained = _attention(k_first=False, seed=1)
    backup_dir = _trained_backup_dir(tmp_path, trained)
    restarted = _attention(k_first=True, seed=2)
    assert restarted.variables[0] is restarted.k.kernel  # position 0 is k here, q there

    TrainingBackup(BackupStore(backup_dir), restarted).restore()

    for name in ("q", "k", "norm", "head"):
        for want, got in zip(getattr(trained, name).variables, getattr(restarted, name).variables):
            np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=name)

    # Adam's moments follow their variables too.
    def slot(model, layer, kind):
        key = getattr(model, layer).kernel.path.replace("/", "_") + "_" + kind
        return next(v for v in model.optimizer.variables if v.name == key).numpy()

    for layer in ("q", "k"):
        for kind in ("momentum", "velocity"):
            np.testing.assert_array_equal(slot(restarted, layer, kind), slot(trained, layer, kind))


# ----------------------------------------------------------------- optimizer


@pytest.mark.parametrize(
    "saved, restarted, names",
    [
        (
            lambda: keras.optimizers.SGD(0.01, momentum=0.9),
            lambda: LARS(0.01, momentum=0.9),
            ('"SGD"', '"LARS"'),
        ),
        (lambda: keras.optimizers.Adam(0.01), lambda: LAMB(0.01), ('"Adam"', '"LAMB"')),
    ],
)
def test_changed_optimizer_is_refused(tmp_path, saved, restarted, names):
    backup_dir = _trained_backup_dir(tmp_path, _sequential(saved()))
    error = _assert_refused(
        backup_dir,
        _sequential(restarted()),
        f"was made with optimizer={names[0]}, this run has {names[1]}",
    )
    assert str(error).endswith("use a new backup directory")


# -------------------------------------------------------------- run settings


def test_changed_run_setting_is_refused_naming_field_old_and_new(tmp_path):
    backup_dir = _trained_backup_dir(
        tmp_path, _sequential(), run_settings={"global_batch_size": 64, "seed": 1}
    )
    error = _assert_refused(
        backup_dir,
        _sequential(),
        "global_batch_size",
        run_settings={"global_batch_size": 128, "seed": 1},
    )
    assert str(error) == (
        f"the backup in {backup_dir} was made with global_batch_size=64, this run has "
        f"128; restart with the same value or use a new backup directory"
    )


def test_setting_missing_from_this_run_is_refused(tmp_path):
    backup_dir = _trained_backup_dir(tmp_path, _sequential(), run_settings={"dataset": "mnist"})
    _assert_refused(
        backup_dir,
        _sequential(),
        r"was made with dataset=\"mnist\", this run has \(not set\)",
        run_settings={},
    )


def test_changeable_setting_is_allowed_and_logged_in_one_line(tmp_path, caplog):
    model = _sequential()
    backup_dir = _trained_backup_dir(tmp_path, model, run_settings={"epochs": 3, "num_workers": 2})
    restarted = _sequential(seed=5)
    with caplog.at_level(logging.INFO, logger="tfdist.backups"):
        point = TrainingBackup(
            BackupStore(backup_dir),
            restarted,
            run_settings={"epochs": 5, "num_workers": 4},
            changeable={
                "epochs": "the learning rate is constant",
                "num_workers": "the global batch is unchanged",
            },
        ).restore()
    assert point.global_step == 8
    for want, got in zip(model.get_weights(), restarted.get_weights()):
        np.testing.assert_array_equal(got, want)
    lines = [r.getMessage() for r in caplog.records if "epochs" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "epochs=3" in lines[0] and "5" in lines[0] and "constant" in lines[0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"run_settings": {"x": object()}}, "run_settings"),
        ({"run_settings": {1: 2}}, "run_settings"),
        ({"changeable": {"x": 1}}, "changeable"),
    ],
)
def test_bad_fingerprint_arguments_are_usage_errors(tmp_path, kwargs, message):
    with pytest.raises(UsageError, match=message):
        BackupAndRestore(str(tmp_path), preemption=None, **kwargs)


# ---------------------------------------------------------- model differences


def test_other_model_is_refused_naming_the_variable(tmp_path):
    backup_dir = _trained_backup_dir(tmp_path, _sequential())
    keras.utils.set_random_seed(1)
    wider = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(16),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(1),
        ]
    )
    wider.compile(keras.optimizers.Adam(0.01), "mse")
    _assert_refused(
        backup_dir,
        wider,
        r"model variable layers/dense/kernel=\[4, 8\] float32, this run has "
        r"\[4, 16\] float32",
    )


def test_backup_without_fingerprint_restores_by_position_with_a_warning(tmp_path, caplog):
    """Backups written before fingerprints existed (tfdist-backup/1 as of 2026-11)."""
    model = _sequential()
    x = _x()
    model.fit(x, x.sum(1), epochs=1, batch_size=8, verbose=0)
    backup_dir = str(tmp_path / "legacy")
    checkpoint = tf.train.Checkpoint(
        model_variables=list(model.variables), optimizer_variables=list(model.optimizer.variables)
    )
    BackupStore(backup_dir).save(
        checkpoint.write,
        step=4,
        metadata={
            "global_step": 4,
            "epoch": 1,
            "step_in_epoch": 0,
            "steps_per_epoch": 4,
            "model_variable_shapes": [list(v.shape) for v in model.variables],
        },
    )
    restarted = _sequential(seed=3)
    with caplog.at_level(logging.WARNING, logger="tfdist.backups"):
        point = TrainingBackup(BackupStore(backup_dir), restarted).restore()
    assert point.global_step == 4
    for want, got in zip(model.get_weights(), restarted.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert "no run fingerprint" in caplog.text and "by position" in caplog.text


def test_read_error_of_an_intact_backup_is_a_configuration_error(tmp_path):
    """An old backup (no fingerprint) under mixed precision: TF's dtype error is no damage."""
    model = _sequential()
    backup_dir = str(tmp_path / "legacy")
    model.optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(
        model_variables=list(model.variables), optimizer_variables=list(model.optimizer.variables)
    )
    for step in (4, 8):
        BackupStore(backup_dir).save(
            checkpoint.write,
            step=step,
            metadata={"global_step": step, "epoch": 1, "step_in_epoch": 0},
        )
    keras.config.set_dtype_policy("mixed_float16")
    _assert_refused(backup_dir, _sequential(), "cannot be loaded into this run")


def test_fingerprint_is_recorded_in_the_backup_metadata(tmp_path):
    backup_dir = _trained_backup_dir(
        tmp_path, _attention(False, 1), steps=(4,), run_settings={"global_batch_size": 8}
    )
    with open(os.path.join(backup_dir, "backup-000000000004", "metadata.json")) as handle:
        fingerprint = json.load(handle)["user"]["fingerprint"]
    assert fingerprint["run"] == {"global_batch_size": 8}
    assert fingerprint["optimizer"] == "Adam" and fingerprint["dtype_policy"] == "float32"
    assert fingerprint["model_variables"][0] == ["q/kernel", [4, 4], "float32"]
    assert ["momentum@q/kernel", [4, 4], "float32"] in fingerprint["optimizer_variables"]


class TwoScales(keras.layers.Layer):
    """Two weights with the same name, held in a list: no stable path for either."""

    def build(self, input_shape):
        self.scales = [
            self.add_weight(shape=(4,), initializer="random_normal", name="scale") for _ in range(2)
        ]

    def call(self, inputs):
        return inputs * self.scales[0] + inputs * self.scales[1]


def _scaled(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), TwoScales(), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    return model


def test_variables_without_stable_paths_restore_by_position_with_a_warning(tmp_path, caplog):
    trained = _scaled(1)
    assert model_variable_paths(trained)[:2] == [None, None]
    backup_dir = _trained_backup_dir(tmp_path, trained)
    restarted = _scaled(2)
    with caplog.at_level(logging.WARNING, logger="tfdist.backups"):
        TrainingBackup(BackupStore(backup_dir), restarted).restore()
    for want, got in zip(trained.get_weights(), restarted.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert "Restoring the model variables by position" in caplog.text


class UnnamedScales(keras.layers.Layer):
    """`add_weight()` without names: Keras names them from a per-process counter."""

    def build(self, input_shape):
        self.first = self.add_weight(shape=(4,), initializer="random_normal")
        self.second = self.add_weight(shape=(4,), initializer="random_normal")

    def call(self, inputs):
        return inputs * self.first - inputs * self.second


def _unnamed(seed):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), UnnamedScales(), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse")
    return model


def test_unnamed_weights_are_matched_by_attribute_not_by_counter_name(tmp_path, caplog):
    trained = _unnamed(1)
    backup_dir = _trained_backup_dir(tmp_path, trained)
    keras.Variable(0.0)  # what else the restarted program creates first shifts the names
    restarted = _unnamed(2)
    assert restarted.layers[0].first.name != trained.layers[0].first.name
    assert model_variable_paths(restarted)[:2] == [
        "layers/unnamed_scales/first",
        "layers/unnamed_scales/second",
    ]
    with caplog.at_level(logging.WARNING, logger="tfdist.backups"):
        TrainingBackup(BackupStore(backup_dir), restarted).restore()
    for want, got in zip(trained.get_weights(), restarted.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert "by position" not in caplog.text
