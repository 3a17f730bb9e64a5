"""One rule of roles per strategy: the trainer and its three submitters refuse the same shapes.

`tfdist.distribute.cluster.check_cluster_for_strategy` is the rule. The trainer calls it with
the cluster it reads from `TF_CONFIG`; `trainer.submit` (Vertex AI), `trainer.kubernetes` and
`trainer.ray` with the cluster their job shape will give (`cluster_of_shape`). Each shape below
goes through all four, which must agree, and each refusal names the caller's own flags. On
main they disagreed: the trainer and `trainer.ray` ran `mirrored` on several tasks (each
training alone), `trainer.kubernetes` refused `auto` with parameter servers, which Vertex and
the trainer run as `parameter_server`.
"""

import json

import pytest
from absl import flags
from absl.testing import flagsaver

from tfdist.distribute import cluster as cluster_lib
from tfdist.errors import UsageError
from trainer.kubernetes import shape as shape_lib
from trainer.vertex import options as vertex_options
from trainer.vertex.spec import JobSpec

IMAGE = "us-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"

# (chief, workers, ps, evaluators, strategy) -> refused?
SHAPES = {
    "multiworker, chief and a worker": ((True, 1, 0, 0, "multiworker"), False),
    "multiworker with an evaluator": ((True, 1, 0, 1, "multiworker"), False),
    "mirrored on the chief alone": ((True, 0, 0, 0, "mirrored"), False),
    "one_device on one worker": ((False, 1, 0, 0, "one_device"), False),
    "parameter_server, chief, worker, ps": ((True, 1, 1, 0, "parameter_server"), False),
    "auto with ps is parameter_server": ((True, 1, 1, 0, "auto"), False),
    "mirrored on three tasks": ((True, 2, 0, 0, "mirrored"), True),
    "default on two workers": ((False, 2, 0, 0, "default"), True),
    "parameter_server without workers": ((True, 0, 1, 0, "parameter_server"), True),
    "parameter_server without ps": ((True, 2, 0, 0, "parameter_server"), True),
    "parameter_server without chief": ((False, 2, 1, 0, "parameter_server"), True),
    "auto with ps but no workers": ((True, 0, 2, 0, "auto"), True),
    "ps under multiworker": ((True, 2, 1, 0, "multiworker"), True),
    "ps under mirrored": ((True, 0, 1, 0, "mirrored"), True),
    "no training task": ((False, 0, 1, 0, "multiworker"), True),
    "two evaluators": ((True, 1, 0, 2, "multiworker"), True),
}

# Each caller's own names for the roles; a refusal must use them, and no other caller's.
OWN_WORDS = {
    "trainer": ("TF_CONFIG",),
    "vertex": ("--workers", "--parameter_servers", "--evaluators"),
    "kubernetes": ("chief=", "workers=", "parameter_servers=", "evaluators="),
    "ray": ("--chief", "--num_workers", "--num_ps"),
}
FOREIGN_WORDS = {
    "trainer": ("--workers", "--num_ps", "parameter_servers="),
    "vertex": ("TF_CONFIG", "--num_workers", "--num_ps", "--chief"),
    "kubernetes": ("TF_CONFIG", "--num_workers", "--num_ps", "--parameter_servers"),
    "ray": ("TF_CONFIG", "--workers", "--parameter_servers"),
}


def _trainer(chief, workers, ps, evaluators, strategy):
    """What trainer.task checks at start, on its first training task (else a ps task)."""
    roles = {"chief": int(chief), "worker": workers, "ps": ps, "evaluator": evaluators}
    cluster = {
        role: [f"{role}-{index}.example:2222" for index in range(count)]
        for role, count in roles.items()
        if count
    }
    task = next(role for role in ("chief", "worker", "ps") if roles[role])
    environ = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task, "index": 0}})}
    resolved = cluster_lib.resolve_cluster_for_strategy(environ, strategy)
    cluster_lib.check_cluster_for_strategy(resolved, strategy)


def _vertex(chief, workers, ps, evaluators, strategy):
    if not chief:
        pytest.skip("a Vertex AI job always has its chief, worker pool 0")
    values = {
        "project": "my-project",
        "region": "us-central1",
        "staging_bucket": "gs://my-bucket",
        "container_uri": IMAGE,
        "strategy": strategy,
        "workers": workers,
        "parameter_servers": ps,
        "evaluators": evaluators,
    }
    JobSpec.from_options(vertex_options.merge_options({}, values), timestamp="t")


def _kubernetes(chief, workers, ps, evaluators, strategy):
    shape_lib.TFJobShape(
        name="job",
        image=IMAGE,
        bucket="gs://bucket",
        strategy=strategy,
        chief=chief,
        workers=workers,
        parameter_servers=ps,
        evaluators=evaluators,
    )


def _ray(chief, workers, ps, evaluators, strategy):
    if evaluators > 1:
        pytest.skip("trainer.ray has one --evaluator switch")
    pytest.importorskip("ray.train")
    # pylint: disable=g-import-not-at-top
    from trainer import ray as trainer_ray
    from trainer import task as _task  # noqa: F401  defines trainer.task's flags outside flagsaver

    argv = [
        "trainer.ray",
        f"--num_workers={workers}",
        f"--num_ps={ps}",
        "--chief" if chief else "--nochief",
        "--evaluator" if evaluators else "--noevaluator",
    ]
    with flagsaver.flagsaver():
        trainer_ray.RAY_FLAGS.unparse_flags()
        trainer_ray.RAY_FLAGS(argv)
        try:
            world_size = int(chief) + workers + ps + evaluators
            trainer_ray.check_task_flags([f"--strategy={strategy}"], world_size)
        finally:
            flags.FLAGS.unparse_flags()
            trainer_ray.RAY_FLAGS.unparse_flags()


CALLERS = {"trainer": _trainer, "vertex": _vertex, "kubernetes": _kubernetes, "ray": _ray}


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("shape, refused", SHAPES.values(), ids=SHAPES.keys())
def test_every_caller_refuses_the_same_shapes_in_its_own_words(shape, refused, caller):
    try:
        CALLERS[caller](*shape)
    except UsageError as error:
        message = str(error)
        assert refused, f"{caller} refused an accepted shape: {message}"
        assert "\n" not in message
        assert any(word in message for word in OWN_WORDS[caller]), message
        assert not any(word in message for word in FOREIGN_WORDS[caller]), message
        return
    assert not refused, f"{caller} accepted {shape}, which the others refuse"


def test_a_shape_cluster_is_seen_from_its_chief_with_placeholder_addresses():
    cluster = cluster_lib.cluster_of_shape(
        chief=True, workers=2, ps=1, evaluators=1, source="the job shape"
    )
    assert (cluster.task_type, cluster.task_index, cluster.source) == ("chief", 0, "the job shape")
    assert {role: cluster.count(role) for role in cluster_lib.ROLES} == {
        "chief": 1,
        "worker": 2,
        "ps": 1,
        "evaluator": 1,
    }
    without_chief = cluster_lib.cluster_of_shape(chief=False, workers=0, source="x")
    assert without_chief.task_type == "worker" and not without_chief.addresses
