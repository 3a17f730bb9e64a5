"""The strategy factory: every name that can run on this CPU-only machine.

`mirrored` on logical CPUs and `multiworker` must be built before TensorFlow
initializes its devices, so they run in fresh subprocesses that print JSON.
"""

import json
import logging
import math
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from tfdist.distribute.cluster import Cluster, resolve_cluster
from tfdist.errors import ClusterConfigError, UsageError
from tfdist.distribute.strategy import (StrategyOptions, expected_num_replicas, make_strategy,
                             resolve_strategy_name)
from tfdist.distribute.choice import STRATEGIES, check_strategy_name, choose_strategy

REPO = pathlib.Path(__file__).resolve().parents[1]
SUBPROCESS_TIMEOUT = 300


def tf_config_cluster(cluster: dict, task_type: str = "worker", index: int = 0) -> Cluster:
    return resolve_cluster({"TF_CONFIG": json.dumps(
        {"cluster": cluster, "task": {"type": task_type, "index": index}})})


def script(*parts: str) -> str:
    """Joins indented code snippets into one program."""
    return "".join(textwrap.dedent(part) for part in parts)


def run_script(code: str, env: dict | None = None) -> dict:
    """Runs `code` in a fresh interpreter; returns the JSON on its last stdout line."""
    environ = {key: value for key, value in os.environ.items()
               if key not in ("TF_CONFIG", "CLUSTER_SPEC")}
    environ.update(env or {})
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                          environ.get("PYTHONPATH")]))
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                            env=environ, capture_output=True, text=True,
                            timeout=SUBPROCESS_TIMEOUT, check=False)
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
    report = run_script(script("""
        from tfdist.distribute.cluster import Cluster
        from tfdist.distribute.strategy import StrategyOptions, make_strategy
        strategy = make_strategy("mirrored", Cluster(), StrategyOptions(num_cpu_devices=2))
        extra = {}
    """, _FIT_AND_REPORT))
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
    code = script("""
        import os
        from tfdist import keras_compat
        from tfdist.distribute.cluster import resolve_cluster
        from tfdist.distribute.strategy import StrategyOptions, make_strategy
        strategy = make_strategy("multiworker", resolve_cluster(os.environ),
                                 StrategyOptions(all_reduce="ring"))
        extra = {"compat_applied": keras_compat.is_applied()}
    """, _FIT_AND_REPORT)
    last_error = None
    for _ in range(3):  # The port was free when picked; retry if another process took it.
        env = {"TF_CONFIG": json.dumps({"cluster": {"worker": [f"127.0.0.1:{free_port()}"]},
                                        "task": {"type": "worker", "index": 0}})}
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


def test_default_strategy():
    strategy = make_strategy("default", Cluster())
    assert strategy is tf.distribute.get_strategy()
    assert strategy.num_replicas_in_sync == 1


def test_one_device_strategy_uses_the_cpu_here():
    strategy = make_strategy("one_device", Cluster())
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert strategy.num_replicas_in_sync == 1
    assert "CPU:0" in strategy.extended.worker_devices[0].upper()
    with strategy.scope():
        variable = tf.Variable(1.0)
    assert "CPU:0" in variable.device.upper()


def test_names_are_case_insensitive():
    assert check_strategy_name("  Default ") == "default"


def test_auto_picks_default_here_and_logs_why(caplog):
    caplog.set_level(logging.INFO, logger="absl")
    strategy = make_strategy("auto", Cluster())
    assert strategy is tf.distribute.get_strategy()
    assert "--strategy=auto chose 'default' because single process with no GPU" in caplog.text


@pytest.mark.parametrize("cluster, expected", [
    ({"worker": ["localhost:1", "localhost:2"]}, "multiworker"),
    ({"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]},
     "parameter_server"),
    ({"worker": ["localhost:1"]}, "default"),
])
def test_auto_infers_from_the_cluster(cluster, expected, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    task_type = "chief" if "chief" in cluster else "worker"
    name = resolve_strategy_name("auto", tf_config_cluster(cluster, task_type),
                                 StrategyOptions())
    assert name == expected
    assert f"--strategy=auto chose {expected!r} because" in caplog.text


def test_auto_with_tpu_flag_picks_tpu():
    assert resolve_strategy_name("auto", Cluster(), StrategyOptions(tpu="my-tpu")) == "tpu"


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(UsageError) as raised:
        make_strategy("mirorred", Cluster())
    message = str(raised.value)
    assert "'mirorred'" in message
    for name in STRATEGIES:
        assert name in message
    assert "\n" not in message


def test_tpu_without_a_tpu_is_a_one_line_usage_error():
    with pytest.raises(UsageError) as raised:
        make_strategy("tpu", Cluster())
    message = str(raised.value)
    assert message.startswith("--strategy=tpu found no TPU")
    assert "pick another --strategy" in message
    assert "\n" not in message


def test_tpu_name_off_cloud_is_a_usage_error():
    with pytest.raises(UsageError, match="found no TPU"):
        make_strategy("tpu", Cluster(), StrategyOptions(tpu="no-such-tpu-name"))


def test_parameter_server_without_a_cluster_fails_before_building():
    with pytest.raises(ClusterConfigError, match="needs a cluster"):
        make_strategy("parameter_server", Cluster())


def test_multiworker_refuses_ps_tasks():
    cluster = tf_config_cluster({"chief": ["localhost:1"], "worker": ["localhost:2"],
                                 "ps": ["localhost:3"]}, "chief")
    with pytest.raises(ClusterConfigError, match="--strategy=parameter_server"):
        make_strategy("multiworker", cluster)


def test_splitting_the_cpu_after_initialization_is_a_clear_error():
    existing = len(tf.config.list_logical_devices("CPU"))  # Initializes TensorFlow.
    with pytest.raises(UsageError, match="already initialized"):
        make_strategy("mirrored", Cluster(), StrategyOptions(num_cpu_devices=existing + 1))


@pytest.mark.parametrize("options, fragment", [
    ({"all_reduce": "hierarchical"}, "--all_reduce is 'hierarchical'"),
    ({"num_cpu_devices": -1}, "--num_cpu_devices is -1"),
])
def test_strategy_options_reject_bad_values(options, fragment):
    with pytest.raises(UsageError, match=fragment):
        StrategyOptions(**options)


# --- choose_strategy: a pure table ------------------------------------------

_TWO_WORKERS = {"worker": ["localhost:1", "localhost:2"]}
_PS = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3", "localhost:4"]}

CHOICES = {
    "tpu flag wins over everything": (_PS, "chief", 8, "v3-8", "tpu", "--tpu='v3-8' is set"),
    "ps tasks": (_PS, "chief", 0, "", "parameter_server", "the cluster has 2 ps task(s)"),
    "ps tasks even with GPUs": (_PS, "chief", 4, "", "parameter_server", "2 ps task(s)"),
    "two workers": (_TWO_WORKERS, "worker", 0, "", "multiworker", "2 training tasks"),
    "two workers with GPUs": (_TWO_WORKERS, "worker", 8, "", "multiworker",
                              "2 training tasks"),
    "chief plus worker": ({"chief": ["localhost:1"], "worker": ["localhost:2"]}, "chief", 0, "",
                          "multiworker", "2 training tasks"),
    "one worker, several GPUs": ({"worker": ["localhost:1"]}, "worker", 2, "", "mirrored",
                                 "2 GPUs"),
    "single process, several GPUs": (None, None, 4, "", "mirrored", "4 GPUs"),
    "single process, one GPU": (None, None, 1, "", "one_device", "1 GPU"),
    "single process, CPU only": (None, None, 0, "", "default", "no GPU"),
}


@pytest.mark.parametrize("cluster, task_type, num_gpus, tpu, expected, reason",
                         CHOICES.values(), ids=CHOICES.keys())
def test_choose_strategy(cluster, task_type, num_gpus, tpu, expected, reason):
    resolved = tf_config_cluster(cluster, task_type) if cluster else Cluster()
    chosen, why = choose_strategy(resolved, num_gpus=num_gpus, tpu=tpu)
    assert chosen == expected
    assert reason in why


# --- expected_num_replicas ----------------------------------------------------

REPLICAS = {
    "default": ("default", None, {}, 1),
    "one_device": ("one_device", None, {}, 1),
    "mirrored, CPU not split": ("mirrored", None, {}, 1),
    "mirrored on 3 logical CPUs": ("mirrored", None, {"num_cpu_devices": 3}, 3),
    "multiworker without a cluster": ("multiworker", None, {}, 1),
    "multiworker with 3 workers": ("multiworker",
                                   {"worker": ["localhost:1", "localhost:2", "localhost:3"]},
                                   {}, 3),
    "multiworker with chief and worker": ("multiworker",
                                          {"chief": ["localhost:1"], "worker": ["localhost:2"]},
                                          {}, 2),
    "auto with 2 workers": ("auto", {"worker": ["localhost:1", "localhost:2"]}, {}, 2),
    "tpu: unknown until connected": ("tpu", None, {}, None),
}


@pytest.mark.parametrize("name, cluster, options, expected", REPLICAS.values(),
                         ids=REPLICAS.keys())
def test_expected_num_replicas(name, cluster, options, expected):
    task_type = "chief" if cluster and "chief" in cluster else "worker"
    resolved = tf_config_cluster(cluster, task_type) if cluster else Cluster()
    assert expected_num_replicas(name, resolved, StrategyOptions(**options)) == expected


def test_tpu_grpc_address_nobody_listens_on_is_a_quick_usage_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(UsageError, match="cannot reach --tpu='grpc://127.0.0.1:"):
        make_strategy("tpu", Cluster(), StrategyOptions(tpu=f"grpc://127.0.0.1:{port}"))
