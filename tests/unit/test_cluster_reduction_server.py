"""A Vertex job with Reduction Server: TF_CONFIG may list the reducers as "ps"."""

import json

import pytest

from tfdist.distribute.cluster import (
    ClusterConfigError,
    check_cluster_for_strategy,
    resolve_cluster,
)

TF_CONFIG = {
    "cluster": {"chief": ["chief:2222"], "worker": ["w0:2222"], "ps": ["rs0:2222", "rs1:2222"]},
    "task": {"type": "worker", "index": 0},
}
CLUSTER_SPEC = {
    "cluster": {
        "workerpool0": ["chief:2222"],
        "workerpool1": ["w0:2222"],
        "workerpool2": ["rs0:2222", "rs1:2222"],
    },
    "task": {"type": "workerpool1", "index": 0},
}
VERTEX_ENV = {"TF_CONFIG": json.dumps(TF_CONFIG), "CLUSTER_SPEC": json.dumps(CLUSTER_SPEC)}


def test_reducers_listed_as_ps_are_not_parameter_servers():
    cluster = resolve_cluster(VERTEX_ENV, pool2_is_reduction_server=True)
    assert (cluster.num_ps, cluster.num_reduction_servers, cluster.num_workers) == (0, 2, 2)
    check_cluster_for_strategy(cluster, "multiworker")


def test_without_a_reduction_server_pool_ps_tasks_stay_parameter_servers():
    cluster = resolve_cluster(VERTEX_ENV, pool2_is_reduction_server=False)
    assert (cluster.num_ps, cluster.num_reduction_servers) == (2, 0)


def test_a_local_tf_config_with_ps_is_still_refused_for_multiworker():
    cluster = resolve_cluster({"TF_CONFIG": json.dumps(TF_CONFIG)}, pool2_is_reduction_server=True)
    with pytest.raises(ClusterConfigError, match="ps task"):
        check_cluster_for_strategy(cluster, "multiworker")
