"""The strategy factory: every name that can run on this CPU-only machine.

`mirrored` on logical CPUs and `multiworker` must be built before TensorFlow
initializes its devices, so they run in fresh subprocesses that print JSON.
"""

import json
import logging
import socket

import pytest
import tensorflow as tf

from tfdist.distribute.choice import STRATEGIES, check_strategy_name, choose_strategy
from tfdist.distribute.cluster import Cluster, resolve_cluster
from tfdist.distribute.strategy import (
    StrategyOptions,
    expected_num_replicas,
    make_strategy,
    resolve_strategy_name,
)
from tfdist.errors import ClusterConfigError, UsageError


def tf_config_cluster(cluster: dict, task_type: str = "worker", index: int = 0) -> Cluster:
    return resolve_cluster(
        {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})}
    )


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


@pytest.mark.parametrize(
    "cluster, expected",
    [
        ({"worker": ["localhost:1", "localhost:2"]}, "multiworker"),
        (
            {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]},
            "parameter_server",
        ),
        ({"worker": ["localhost:1"]}, "default"),
    ],
)
def test_auto_infers_from_the_cluster(cluster, expected, caplog):
    caplog.set_level(logging.INFO, logger="absl")
    task_type = "chief" if "chief" in cluster else "worker"
    name = resolve_strategy_name("auto", tf_config_cluster(cluster, task_type), StrategyOptions())
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
    cluster = tf_config_cluster(
        {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}, "chief"
    )
    with pytest.raises(ClusterConfigError, match="--strategy=parameter_server"):
        make_strategy("multiworker", cluster)


def test_splitting_the_cpu_after_initialization_is_a_clear_error():
    existing = len(tf.config.list_logical_devices("CPU"))  # Initializes TensorFlow.
    with pytest.raises(UsageError, match="already initialized"):
        make_strategy("mirrored", Cluster(), StrategyOptions(num_cpu_devices=existing + 1))


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"all_reduce": "hierarchical"}, "--all_reduce is 'hierarchical'"),
        ({"num_cpu_devices": -1}, "--num_cpu_devices is -1"),
    ],
)
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
    "two workers with GPUs": (_TWO_WORKERS, "worker", 8, "", "multiworker", "2 training tasks"),
    "chief plus worker": (
        {"chief": ["localhost:1"], "worker": ["localhost:2"]},
        "chief",
        0,
        "",
        "multiworker",
        "2 training tasks",
    ),
    "one worker, several GPUs": (
        {"worker": ["localhost:1"]},
        "worker",
        2,
        "",
        "mirrored",
        "2 GPUs",
    ),
    "single process, several GPUs": (None, None, 4, "", "mirrored", "4 GPUs"),
    "single process, one GPU": (None, None, 1, "", "one_device", "1 GPU"),
    "single process, CPU only": (None, None, 0, "", "default", "no GPU"),
}


@pytest.mark.parametrize(
    "cluster, task_type, num_gpus, tpu, expected, reason", CHOICES.values(), ids=CHOICES.keys()
)
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
    "multiworker with 3 workers": (
        "multiworker",
        {"worker": ["localhost:1", "localhost:2", "localhost:3"]},
        {},
        3,
    ),
    "multiworker with chief and worker": (
        "multiworker",
        {"chief": ["localhost:1"], "worker": ["localhost:2"]},
        {},
        2,
    ),
    "auto with 2 workers": ("auto", {"worker": ["localhost:1", "localhost:2"]}, {}, 2),
    "tpu: unknown until connected": ("tpu", None, {}, None),
}


@pytest.mark.parametrize("name, cluster, options, expected", REPLICAS.values(), ids=REPLICAS.keys())
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


def test_the_strategy_defaults_are_written_once():
    from tfdist.distribute.choice import STRATEGY_DEFAULTS  # pylint: disable=g-import-not-at-top
    from trainer.config import ExperimentConfig  # pylint: disable=g-import-not-at-top

    built = StrategyOptions()
    trainer_defaults = ExperimentConfig()
    assert set(STRATEGY_DEFAULTS) == {
        "strategy",
        "all_reduce",
        "num_cpu_devices",
        "tpu",
        "peer_timeout_seconds",
    }
    for name, default in STRATEGY_DEFAULTS.items():
        assert getattr(trainer_defaults, name) == default, name
        if name != "strategy":
            assert getattr(built, name) == default, name
