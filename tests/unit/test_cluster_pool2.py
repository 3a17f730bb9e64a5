"""What Vertex AI's worker pool 2 runs: one policy for every entry point.

Pool 2 holds parameter servers (our trainer) or Reduction Server (Vertex's
image). `tfdist.distribute.cluster.pool2_is_reduction_server` decides it the same way
for `trainer.task`, `tfdist.distribute.flags` and `tfdist.resumable`.
"""

import json

import pytest

from tfdist.distribute.choice import choose_strategy
from tfdist.distribute.cluster import (
    POOL2_ROLE,
    ClusterConfigError,
    pool2_is_reduction_server,
    resolve_cluster_for_strategy,
)

CLUSTER = {
    "workerpool0": ["c:2222"],
    "workerpool1": ["w0:2222", "w1:2222"],
    "workerpool2": ["p0:2222"],
}
TF_CLUSTER = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": ["p0:2222"]}
TRAINER = {"container_spec": {"image_uri": "us-docker.pkg.dev/p/tfdist/trainer:0.1.0"}}
REDUCER = {
    "container_spec": {
        "image_uri": "us-docker.pkg.dev/vertex-ai-restricted/training/reductionserver:latest"
    }
}


def vertex_env(pool="workerpool1", index=0, job=None, **extra):
    spec = {"cluster": CLUSTER, "task": {"type": pool, "index": index}}
    if job is not None:
        spec["job"] = {"worker_pool_specs": job}
    roles = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps"}
    tf_config = {"cluster": TF_CLUSTER, "task": {"type": roles[pool], "index": index}}
    return {"CLUSTER_SPEC": json.dumps(spec), "TF_CONFIG": json.dumps(tf_config), **extra}


def test_auto_with_the_submitters_marker_trains_with_the_parameter_servers():
    env = vertex_env(**{POOL2_ROLE: "parameter_server"})
    cluster = resolve_cluster_for_strategy(env, "auto")
    assert cluster.num_ps == 1 and cluster.num_reduction_servers == 0
    assert choose_strategy(cluster, num_gpus=0)[0] == "parameter_server"


def test_auto_reads_pool_2s_image_from_the_job_spec_vertex_passes():
    ps_job = vertex_env(job=[TRAINER, TRAINER, TRAINER])
    rs_job = vertex_env(job=[TRAINER, TRAINER, REDUCER])
    assert not pool2_is_reduction_server(ps_job, "auto")
    assert pool2_is_reduction_server(rs_job, "auto")
    assert (
        choose_strategy(resolve_cluster_for_strategy(rs_job, "auto"), num_gpus=0)[0]
        == "multiworker"
    )


def test_a_replica_running_in_pool_2_knows_pool_2_runs_our_code():
    assert not pool2_is_reduction_server(vertex_env("workerpool2"), "AUTO")


def test_auto_refuses_to_guess_when_nothing_says_what_pool_2_runs():
    with pytest.raises(ClusterConfigError, match=rf"workerpool2.*{POOL2_ROLE}=parameter_server"):
        resolve_cluster_for_strategy(vertex_env(), "auto")


@pytest.mark.parametrize("strategy, expected", [("parameter_server", False), ("multiworker", True)])
def test_a_named_strategy_decides_without_a_marker(strategy, expected):
    assert pool2_is_reduction_server(vertex_env(), strategy) is expected


def test_the_marker_wins_over_the_named_strategy_and_a_bad_one_is_refused():
    env = vertex_env(**{POOL2_ROLE: "reduction_server"})
    assert pool2_is_reduction_server(env, "parameter_server")
    with pytest.raises(ClusterConfigError, match=r"TFDIST_POOL2_ROLE is 'reducers'"):
        pool2_is_reduction_server(vertex_env(**{POOL2_ROLE: "reducers"}), "auto")


def test_without_cluster_spec_the_policy_changes_nothing():
    local = {"TF_CONFIG": json.dumps({"cluster": TF_CLUSTER, "task": {"type": "chief"}})}
    assert resolve_cluster_for_strategy(local, "auto").num_ps == 1
