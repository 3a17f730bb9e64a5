"""LARS and LAMB in fresh processes: a user's bad argument, and 2-CPU MirroredStrategy.

The in-process halves (the update rules against float64 NumPy) are
tests/unit/test_optimizers_lars.py and tests/unit/test_optimizers_lamb.py.
"""

import functools
import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


USER_SCRIPT = textwrap.dedent("""
    from tfdist.distribute import flags as tfdist_flags
    from tfdist.optimizers import LARS

    def main(argv):
        LARS(0.1, momentum=1.0)

    tfdist_flags.run(main)
""")


def test_a_users_script_reports_a_bad_argument_in_one_line_and_exits_2():
    result = subprocess.run(
        [sys.executable, "-c", USER_SCRIPT],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "3"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: LARS momentum is 1.0, expected a number in [0, 1), e.g. momentum=0.9"
    )


MIRRORED_SCRIPT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np
    from tfdist.optimizers import LARS, LAMB

    optimizers = {
        "lars": lambda: LARS(2.0, weight_decay_rate=1e-3, nesterov=True,
                             exclude_from_weight_decay=["bias"]),
        "lamb": lambda: LAMB(0.02, weight_decay_rate=1e-2,
                             exclude_from_weight_decay=["bias"]),
    }
    rng = np.random.default_rng(0)
    x = rng.standard_normal((128, 6)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    keras.utils.set_random_seed(0)
    initial = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                keras.layers.Dense(2)]).get_weights()

    def train(strategy, make_optimizer):
        with strategy.scope():
            model = keras.Sequential([keras.Input((6,)),
                                      keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dense(2)])
            model.set_weights(initial)
            model.compile(optimizer=make_optimizer(), loss=keras.losses.
                          SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
        return model.get_weights(), int(model.optimizer.iterations.numpy())

    mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result = {"replicas": mirrored.num_replicas_in_sync}
    for name in sys.argv[1:]:
        single, single_steps = train(tf.distribute.get_strategy(), optimizers[name])
        multi, multi_steps = train(mirrored, optimizers[name])
        result[name] = {
            "steps": [single_steps, multi_steps],
            "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(single, multi)),
            "moved": min(float(np.abs(a - b).max()) for a, b in zip(single, initial)),
        }
    print(json.dumps(result))
""")


@functools.lru_cache(maxsize=None)
def run_mirrored(*names):
    """Trains under the default strategy and 2-CPU MirroredStrategy in a fresh process.

    Cached: the LARS and LAMB tests below share one process start (they once
    lived in two files, which `--dist loadfile` could send to two workers).
    """
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    completed = subprocess.run(
        [sys.executable, "-c", MIRRORED_SCRIPT, *names],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


def test_mirrored_two_cpus_matches_single_device():
    result = run_mirrored("lars", "lamb")
    assert result["replicas"] == 2
    assert result["lars"]["steps"] == [8, 8]
    assert result["lars"]["moved"] > 1e-3
    assert result["lars"]["max_diff"] < 1e-5, result


def test_lamb_on_mirrored_two_cpus_matches_single_device():
    result = run_mirrored("lars", "lamb")
    assert result["replicas"] == 2
    assert result["lamb"]["steps"] == [8, 8]
    assert result["lamb"]["moved"] > 1e-3
    assert result["lamb"]["max_diff"] < 1e-5, result
