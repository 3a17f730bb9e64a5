"""The cluster resolver: TF_CONFIG and CLUSTER_SPEC fixtures to clusters or errors.

Every fixture carries a secret in its `job` section (Vertex puts the whole job
spec there); no error message, log line or description may ever repeat it.
"""

import dataclasses
import json
import logging

import pytest

from tfdist.distribute.cluster import Cluster, check_cluster_for_strategy, resolve_cluster
from tfdist.errors import ClusterConfigError, UsageError

SECRET = "s3cr3t-token-value"
JOB = {"env": {"TOKEN": SECRET}, "python_package_spec": {"args": [f"--key={SECRET}"]}}

TWO_WORKERS = ["localhost:12345", "localhost:12346"]
VERTEX_POOLS = {
    "workerpool0": ["cmle-training-workerpool0-abc-0:2222"],
    "workerpool1": ["cmle-training-workerpool1-abc-0:2222", "cmle-training-workerpool1-abc-1:2222"],
    "workerpool2": ["cmle-training-workerpool2-abc-0:2222"],
    "workerpool3": ["cmle-training-workerpool3-abc-0:2222"],
}


def tf_config(cluster, task_type="worker", index=0) -> str:
    return json.dumps(
        {
            "cluster": cluster,
            "task": {"type": task_type, "index": index},
            "environment": "cloud",
            "job": JOB,
        }
    )


def cluster_spec(cluster, pool="workerpool0", index=0) -> str:
    return json.dumps(
        {
            "cluster": cluster,
            "task": {"type": pool, "index": index, "trial": ""},
            "environment": "cloud",
            "job": JOB,
        }
    )


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The expected resolved cluster."""

    task_type: str | None
    task_index: int
    is_chief: bool
    num_workers: int
    counts: dict
    source: str
    addresses: dict | None = None
    num_reduction_servers: int = 0


@dataclasses.dataclass(frozen=True)
class Fails:
    """The expected error: every fragment must appear in the message."""

    fragments: tuple[str, ...]


CASES = {
    # --- Valid TF_CONFIG ---------------------------------------------------
    "no variable: single process": ({}, {}, Resolved(None, 0, True, 1, {}, "none", addresses={})),
    "empty TF_CONFIG: single process": (
        {"TF_CONFIG": ""},
        {},
        Resolved(None, 0, True, 1, {}, "none"),
    ),
    "whitespace CLUSTER_SPEC: single process": (
        {"CLUSTER_SPEC": "  \n"},
        {},
        Resolved(None, 0, True, 1, {}, "none"),
    ),
    "two workers, worker 0 is chief": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", 0)},
        {},
        Resolved(
            "worker",
            0,
            True,
            2,
            {"worker": 2},
            "TF_CONFIG",
            addresses={"worker": tuple(TWO_WORKERS)},
        ),
    ),
    "two workers, worker 1 is not chief": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", 1)},
        {},
        Resolved("worker", 1, False, 2, {"worker": 2}, "TF_CONFIG"),
    ),
    "chief plus workers: worker 0 is not chief": (
        {
            "TF_CONFIG": tf_config(
                {"chief": ["localhost:12000"], "worker": TWO_WORKERS}, "worker", 0
            )
        },
        {},
        Resolved("worker", 0, False, 3, {"chief": 1, "worker": 2}, "TF_CONFIG"),
    ),
    "index given as a string of digits": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", "1")},
        {},
        Resolved("worker", 1, False, 2, {"worker": 2}, "TF_CONFIG"),
    ),
    "IPv6 loopback with port": (
        {"TF_CONFIG": tf_config({"worker": ["[::1]:12345", "[::1]:12346"]}, "worker", 1)},
        {},
        Resolved(
            "worker",
            1,
            False,
            2,
            {"worker": 2},
            "TF_CONFIG",
            addresses={"worker": ("[::1]:12345", "[::1]:12346")},
        ),
    ),
    "ps cluster, this task a ps": (
        {
            "TF_CONFIG": tf_config(
                {"chief": ["localhost:12000"], "worker": TWO_WORKERS, "ps": ["localhost:12100"]},
                "ps",
                0,
            )
        },
        {},
        Resolved("ps", 0, False, 3, {"chief": 1, "worker": 2, "ps": 1}, "TF_CONFIG"),
    ),
    "evaluator outside the cluster it evaluates": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "evaluator", 0)},
        {},
        Resolved("evaluator", 0, False, 2, {"worker": 2}, "TF_CONFIG"),
    ),
    "ports 1 and 65535 are valid": (
        {"TF_CONFIG": tf_config({"worker": ["localhost:1", "localhost:65535"]}, "worker", 0)},
        {},
        Resolved("worker", 0, True, 2, {"worker": 2}, "TF_CONFIG"),
    ),
    # --- Valid CLUSTER_SPEC (Vertex) -----------------------------------------
    "Vertex pools: workerpool0 is the chief": (
        {"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool0", 0)},
        {},
        Resolved(
            "chief",
            0,
            True,
            3,
            {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
            "CLUSTER_SPEC",
            addresses={
                "chief": tuple(VERTEX_POOLS["workerpool0"]),
                "worker": tuple(VERTEX_POOLS["workerpool1"]),
                "ps": tuple(VERTEX_POOLS["workerpool2"]),
                "evaluator": tuple(VERTEX_POOLS["workerpool3"]),
            },
        ),
    ),
    "Vertex pools: workerpool1 index 1 is a worker": (
        {"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool1", 1)},
        {},
        Resolved(
            "worker",
            1,
            False,
            3,
            {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
            "CLUSTER_SPEC",
        ),
    ),
    "Vertex pools: workerpool2 is ps": (
        {"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool2", 0)},
        {},
        Resolved(
            "ps", 0, False, 3, {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1}, "CLUSTER_SPEC"
        ),
    ),
    "Vertex pools: workerpool3 is the evaluator": (
        {"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool3", 0)},
        {},
        Resolved(
            "evaluator",
            0,
            False,
            3,
            {"chief": 1, "worker": 2, "ps": 1, "evaluator": 1},
            "CLUSTER_SPEC",
        ),
    ),
    "Vertex pools: workerpool2 as Reduction Server runs no task of ours": (
        {"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool1", 0)},
        {"pool2_is_reduction_server": True},
        Resolved(
            "worker",
            0,
            False,
            3,
            {"chief": 1, "worker": 2, "ps": 0, "evaluator": 1},
            "CLUSTER_SPEC",
            num_reduction_servers=1,
        ),
    ),
    "both set: TF_CONFIG wins": (
        {
            "TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", 1),
            "CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool0", 0),
        },
        {},
        Resolved("worker", 1, False, 2, {"worker": 2, "chief": 0}, "TF_CONFIG"),
    ),
    # --- Malformed JSON ------------------------------------------------------
    "TF_CONFIG does not parse": (
        {"TF_CONFIG": '{"cluster": {"worker": ["a:1"]}, "job": {"TOKEN": "' + SECRET + '"'},
        {},
        Fails(("TF_CONFIG is not valid JSON", "line 1", "unset it")),
    ),
    "CLUSTER_SPEC does not parse": (
        {"CLUSTER_SPEC": "{'cluster': 1, 'job': '" + SECRET + "'}"},
        {},
        Fails(("CLUSTER_SPEC is not valid JSON",)),
    ),
    "TF_CONFIG is a list, not an object": (
        {"TF_CONFIG": json.dumps([SECRET])},
        {},
        Fails(("TF_CONFIG holds a JSON list", "expected a JSON object")),
    ),
    "TF_CONFIG without task": (
        {"TF_CONFIG": json.dumps({"cluster": {"worker": TWO_WORKERS}, "job": JOB})},
        {},
        Fails(("TF_CONFIG['task'] is missing", "expected a JSON object")),
    ),
    "TF_CONFIG cluster is a string": (
        {"TF_CONFIG": json.dumps({"cluster": "worker", "task": {}, "job": JOB})},
        {},
        Fails(("TF_CONFIG['cluster'] is a str", "expected a JSON object")),
    ),
    # --- Roles and task types ------------------------------------------------
    "unknown role in the cluster (legacy master)": (
        {"TF_CONFIG": tf_config({"master": ["localhost:1"], "worker": TWO_WORKERS})},
        {},
        Fails(("TF_CONFIG['cluster']", "'master'", "chief, worker, ps, evaluator")),
    ),
    "unknown task type": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "trainer", 0)},
        {},
        Fails(("TF_CONFIG['task']['type']", "'trainer'", "chief, worker, ps, evaluator")),
    ),
    "two chiefs": (
        {"TF_CONFIG": tf_config({"chief": ["localhost:1", "localhost:2"]}, "chief", 0)},
        {},
        Fails(("2 chief tasks", "at most 1", "'worker'")),
    ),
    "unknown Vertex pool": (
        {"CLUSTER_SPEC": cluster_spec({**VERTEX_POOLS, "workerpool4": ["h:1"]})},
        {},
        Fails(("CLUSTER_SPEC['cluster']", "'workerpool4'", "workerpool0, workerpool1")),
    ),
    "TF_CONFIG role name as a Vertex task type": (
        {"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "chief", 0)},
        {},
        Fails(("CLUSTER_SPEC['task']['type']", "'chief'", "workerpool0")),
    ),
    "workerpool0 with 2 replicas": (
        {"CLUSTER_SPEC": cluster_spec({**VERTEX_POOLS, "workerpool0": ["a:1", "b:1"]})},
        {},
        Fails(
            ("CLUSTER_SPEC['cluster']['workerpool0']", "2 replicas", "exactly 1", "replica_count=1")
        ),
    ),
    "our task placed in a Reduction Server pool": (
        {"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool2", 0)},
        {"pool2_is_reduction_server": True},
        Fails(("CLUSTER_SPEC['task']['type']", "'workerpool2'", "Reduction Server")),
    ),
    # --- Task index ----------------------------------------------------------
    "index out of range": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", 2)},
        {},
        Fails(("TF_CONFIG['task']['index'] is 2", "2 'worker' task(s)", "from 0 to 1")),
    ),
    "Vertex index out of range": (
        {"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool1", 5)},
        {},
        Fails(("CLUSTER_SPEC['task']['index'] is 5", "from 0 to 1")),
    ),
    "negative index": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", -1)},
        {},
        Fails(("TF_CONFIG['task']['index'] is -1", "whole number >= 0")),
    ),
    "non-integer index": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", 0.5)},
        {},
        Fails(("TF_CONFIG['task']['index'] is 0.5", "whole number >= 0")),
    ),
    "boolean index": (
        {"TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", True)},
        {},
        Fails(("TF_CONFIG['task']['index'] is True", "whole number >= 0")),
    ),
    "evaluator inside the cluster with index out of range": (
        {
            "TF_CONFIG": tf_config(
                {"worker": TWO_WORKERS, "evaluator": ["localhost:3"]}, "evaluator", 1
            )
        },
        {},
        Fails(("TF_CONFIG['task']['index'] is 1", "1 'evaluator' task(s)")),
    ),
    # --- Addresses -----------------------------------------------------------
    "address without a port": (
        {"TF_CONFIG": tf_config({"worker": ["localhost:1", "localhost"]}, "worker", 0)},
        {},
        Fails(("TF_CONFIG['cluster']['worker'][1]", "'localhost'", "'host:port'")),
    ),
    "address with an empty port": (
        {"TF_CONFIG": tf_config({"worker": ["localhost:"]}, "worker", 0)},
        {},
        Fails(("TF_CONFIG['cluster']['worker'][0]", "'localhost:'", "'host:port'")),
    ),
    "IPv6 in brackets without a port": (
        {"TF_CONFIG": tf_config({"worker": ["[::1]"]}, "worker", 0)},
        {},
        Fails(("TF_CONFIG['cluster']['worker'][0]", "'[::1]'", "'host:port'")),
    ),
    "port 0": (
        {"TF_CONFIG": tf_config({"worker": ["localhost:0"]}, "worker", 0)},
        {},
        Fails(("TF_CONFIG['cluster']['worker'][0]", "port '0'", "1 to 65535")),
    ),
    "port 65536": (
        {"TF_CONFIG": tf_config({"worker": ["localhost:65536"]}, "worker", 0)},
        {},
        Fails(("TF_CONFIG['cluster']['worker'][0]", "port '65536'", "1 to 65535")),
    ),
    "non-numeric port": (
        {
            "CLUSTER_SPEC": cluster_spec(
                {**VERTEX_POOLS, "workerpool1": ["h:1", "h:http"]}, "workerpool1", 0
            )
        },
        {},
        Fails(("CLUSTER_SPEC['cluster']['workerpool1'][1]", "port 'http'", "1 to 65535")),
    ),
    "address list is a string": (
        {"TF_CONFIG": tf_config({"worker": "localhost:1"}, "worker", 0)},
        {},
        Fails(("TF_CONFIG['cluster']['worker'] is a str", "list of 'host:port'")),
    ),
    "address is a number": (
        {"TF_CONFIG": tf_config({"worker": [2222]}, "worker", 0)},
        {},
        Fails(("TF_CONFIG['cluster']['worker'][0] is 2222", "'host:port'")),
    ),
    "duplicate address across roles": (
        {
            "TF_CONFIG": tf_config(
                {"chief": ["localhost:5000"], "worker": ["localhost:5001", "localhost:5000"]},
                "chief",
                0,
            )
        },
        {},
        Fails(("'localhost:5000'", "chief[0]", "worker[1]", "own port")),
    ),
    "duplicate address across Vertex pools": (
        {"CLUSTER_SPEC": cluster_spec({"workerpool0": ["h:1"], "workerpool1": ["h:1"]})},
        {},
        Fails(("CLUSTER_SPEC", "'h:1'", "chief[0]", "worker[0]")),
    ),
}


def test_the_table_is_large_enough():
    assert len(CASES) >= 20


@pytest.mark.parametrize("environ, kwargs, expected", CASES.values(), ids=CASES.keys())
def test_resolve_cluster(environ, kwargs, expected, caplog):
    caplog.set_level(logging.DEBUG)
    if isinstance(expected, Fails):
        with pytest.raises(ClusterConfigError) as raised:
            resolve_cluster(environ, **kwargs)
        message = str(raised.value)
        assert isinstance(raised.value, ValueError)
        assert isinstance(raised.value, UsageError)
        for fragment in expected.fragments:
            assert fragment in message, message
        assert "\n" not in message
        assert SECRET not in message
    else:
        cluster = resolve_cluster(environ, **kwargs)
        assert cluster.task_type == expected.task_type
        assert cluster.task_index == expected.task_index
        assert cluster.is_chief == expected.is_chief
        assert cluster.num_workers == expected.num_workers
        assert cluster.source == expected.source
        assert cluster.num_reduction_servers == expected.num_reduction_servers
        for role, count in expected.counts.items():
            assert cluster.count(role) == count, role
        if expected.addresses is not None:
            assert dict(cluster.addresses) == expected.addresses
        assert SECRET not in cluster.describe()
        assert SECRET not in repr(cluster)
        assert SECRET not in json.dumps(cluster.tf_config())
    assert SECRET not in caplog.text


def test_tf_config_wins_and_the_log_says_why(caplog):
    caplog.set_level(logging.INFO, logger="tfdist.distribute.cluster")
    environ = {
        "TF_CONFIG": tf_config({"worker": TWO_WORKERS}, "worker", 1),
        "CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool0", 0),
    }
    cluster = resolve_cluster(environ)
    assert cluster.source == "TF_CONFIG"
    messages = [record.getMessage() for record in caplog.records]
    assert any(
        "Both TF_CONFIG and CLUSTER_SPEC are set" in message and "using TF_CONFIG" in message
        for message in messages
    ), messages
    assert SECRET not in caplog.text
    assert "cmle-training" not in caplog.text


def test_one_variable_alone_logs_nothing_about_precedence(caplog):
    caplog.set_level(logging.INFO, logger="tfdist.distribute.cluster")
    resolve_cluster({"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool1", 0)})
    assert "Both TF_CONFIG" not in caplog.text


def test_cluster_is_immutable():
    cluster = resolve_cluster({"TF_CONFIG": tf_config({"worker": TWO_WORKERS})})
    with pytest.raises(dataclasses.FrozenInstanceError):
        cluster.task_index = 1
    with pytest.raises(TypeError):
        cluster.addresses["worker"] = ("evil:1",)


def test_tf_config_round_trips_through_the_resolver():
    cluster = resolve_cluster({"CLUSTER_SPEC": cluster_spec(VERTEX_POOLS, "workerpool1", 1)})
    again = resolve_cluster({"TF_CONFIG": json.dumps(cluster.tf_config())})
    assert again.addresses == cluster.addresses
    assert (again.task_type, again.task_index) == ("worker", 1)


# --- Unicode digits: str.isdigit() accepts them, int() does not -------------


@pytest.mark.parametrize(
    "cluster, index",
    [
        ({"worker": ["localhost:1"]}, "²"),
        ({"worker": ["localhost:²²"]}, 0),
    ],
)
def test_unicode_digits_are_a_clear_error(cluster, index):
    with pytest.raises(ClusterConfigError):
        resolve_cluster({"TF_CONFIG": tf_config(cluster, "worker", index)})


def test_bare_ipv6_without_brackets_is_rejected():
    with pytest.raises(ClusterConfigError, match="port"):
        resolve_cluster({"TF_CONFIG": tf_config({"worker": ["::1"]}, "worker", 0)})


# --- Strategy / cluster combinations ----------------------------------------

PS_CLUSTER = {"chief": ["localhost:12000"], "worker": TWO_WORKERS, "ps": ["localhost:12100"]}

STRATEGY_CASES = {
    "parameter_server without any cluster": (
        None,
        "parameter_server",
        ("needs a cluster", "neither TF_CONFIG nor CLUSTER_SPEC", "tfdist.launch"),
    ),
    "parameter_server without ps": (
        {"chief": ["localhost:12000"], "worker": TWO_WORKERS},
        "parameter_server",
        ("--strategy=parameter_server needs", "0 ps task(s) in TF_CONFIG", "add ps tasks"),
    ),
    "parameter_server without workers": (
        {"chief": ["localhost:12000"], "ps": ["localhost:12100"]},
        "parameter_server",
        ("at least 1 worker", "0 worker", "add worker tasks to TF_CONFIG"),
    ),
    "parameter_server without chief": (
        {"worker": TWO_WORKERS, "ps": ["localhost:12100"]},
        "parameter_server",
        ("needs a chief to coordinate", "0 chief", "add chief tasks to TF_CONFIG"),
    ),
    "multiworker with ps tasks": (
        PS_CLUSTER,
        "multiworker",
        ("--strategy=multiworker", "1 ps task(s)", "set --strategy=parameter_server"),
    ),
    "mirrored with ps tasks": (PS_CLUSTER, "mirrored", ("--strategy=mirrored", "1 ps task(s)")),
    # Each task would train alone (and two would write one model): refused, as every
    # submitter refuses the shape.
    "mirrored on two workers": (
        {"worker": TWO_WORKERS},
        "mirrored",
        ("--strategy=mirrored trains in one process", "2 training tasks", "multiworker"),
    ),
    "default on a chief and a worker": (
        {"chief": ["localhost:12000"], "worker": TWO_WORKERS[:1]},
        "default",
        ("--strategy=default trains in one process", "2 training tasks"),
    ),
    "two evaluators": (
        {"chief": ["localhost:12000"], "evaluator": TWO_WORKERS},
        "multiworker",
        ("2 evaluator task(s) in TF_CONFIG", "expected 0 or 1"),
    ),
}


@pytest.mark.parametrize(
    "cluster, strategy, fragments", STRATEGY_CASES.values(), ids=STRATEGY_CASES.keys()
)
def test_check_cluster_for_strategy_rejects(cluster, strategy, fragments):
    task_type = "chief" if cluster and "chief" in cluster else "worker"
    environ = {"TF_CONFIG": tf_config(cluster, task_type, 0)} if cluster else {}
    with pytest.raises(ClusterConfigError) as raised:
        check_cluster_for_strategy(resolve_cluster(environ), strategy)
    for fragment in fragments:
        assert fragment in str(raised.value), str(raised.value)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize(
    "cluster, strategy",
    [
        (PS_CLUSTER, "parameter_server"),
        ({"worker": TWO_WORKERS}, "multiworker"),
        ({"chief": ["localhost:12000"], "worker": TWO_WORKERS}, "multiworker"),
        (None, "default"),
        (None, "multiworker"),
    ],
)
def test_check_cluster_for_strategy_accepts(cluster, strategy):
    task_type = "chief" if cluster and "chief" in cluster else "worker"
    environ = {"TF_CONFIG": tf_config(cluster, task_type, 0)} if cluster else {}
    assert check_cluster_for_strategy(resolve_cluster(environ), strategy) is None


def test_a_single_process_cluster_describes_itself():
    assert "single process" in Cluster().describe()
