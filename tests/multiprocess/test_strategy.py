"""The strategy factory: every name that can run on this CPU-only machine.

`mirrored` on logical CPUs and `multiworker` must be built before TensorFlow
initializes its devices, so they run in fresh subprocesses that print JSON.
"""

import json
import math
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

REPO = pathlib.Path(__file__).resolve().parents[2]
SUBPROCESS_TIMEOUT = 300


def script(*parts: str) -> str:
    """Joins indented code snippets into one program."""
    return "".join(textwrap.dedent(part) for part in parts)


def run_script(code: str, env: dict | None = None) -> dict:
    """Runs `code` in a fresh interpreter; returns the JSON on its last stdout line."""
    environ = {
        key: value for key, value in os.environ.items() if key not in ("TF_CONFIG", "CLUSTER_SPEC")
    }
    environ.update(env or {})
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), environ.get("PYTHONPATH")]))
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stderr[-4000:]}"
    lines = result.stdout.strip().splitlines()
    assert lines, f"no output\n{result.stderr[-4000:]}"
    return json.loads(lines[-1])


# A two-step Keras fit under the strategy, so each subprocess also shows that
# Keras 3 trains under it.
_FIT_AND_REPORT = """
    import json
    import keras
    import numpy as np
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(32, 4)).astype("float32")
    y = (x[:, 0] > 0).astype("int32")
    history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1,
                        verbose=0)
    replica_ids = strategy.run(
        lambda: tf.distribute.get_replica_context().replica_id_in_sync_group + 1)
    print(json.dumps({
        "class": type(strategy).__name__,
        "replicas": strategy.num_replicas_in_sync,
        "devices": list(strategy.extended.worker_devices),
        "replica_id_sum": int(strategy.reduce("SUM", replica_ids, axis=None)),
        "iterations": int(model.optimizer.iterations.numpy()),
        "loss": float(history.history["loss"][-1]),
        "variable_class": type(model.weights[0].value).__name__,
        **extra,
    }))
"""


def test_mirrored_on_two_logical_cpus():
    report = run_script(
        script(
            """
        from tfdist.distribute.cluster import Cluster
        from tfdist.distribute.strategy import StrategyOptions, make_strategy
        strategy = make_strategy("mirrored", Cluster(), StrategyOptions(num_cpu_devices=2))
        extra = {}
    """,
            _FIT_AND_REPORT,
        )
    )
    assert report["class"] == "MirroredStrategy"
    assert report["replicas"] == 2
    assert len(report["devices"]) == 2
    assert all("CPU" in device for device in report["devices"]), report["devices"]
    assert report["replica_id_sum"] == 1 + 2
    assert report["iterations"] == 2
    assert math.isfinite(report["loss"]) and report["loss"] > 0
    assert report["variable_class"] == "MirroredVariable"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_multiworker_with_a_one_task_cluster():
    code = script(
        """
        import os
        from tfdist import keras_compat
        from tfdist.distribute.cluster import resolve_cluster
        from tfdist.distribute.strategy import StrategyOptions, make_strategy
        strategy = make_strategy("multiworker", resolve_cluster(os.environ),
                                 StrategyOptions(all_reduce="ring"))
        extra = {"compat_applied": keras_compat.is_applied()}
    """,
        _FIT_AND_REPORT,
    )
    last_error = None
    for _ in range(3):  # The port was free when picked; retry if another process took it.
        env = {
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"worker": [f"127.0.0.1:{free_port()}"]},
                    "task": {"type": "worker", "index": 0},
                }
            )
        }
        try:
            report = run_script(code, env)
            break
        except AssertionError as error:
            if "in use" not in str(error).lower():
                raise
            last_error = error
    else:
        raise last_error
    assert report["class"] in ("MultiWorkerMirroredStrategy", "CollectiveAllReduceStrategy")
    assert report["replicas"] == 1
    assert report["replica_id_sum"] == 1
    assert report["iterations"] == 2
    assert math.isfinite(report["loss"]) and report["loss"] > 0
    assert report["compat_applied"] is True
