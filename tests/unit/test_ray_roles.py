"""Fast, in-process (no Ray cluster started): the roles `tfdist.ray.TensorflowConfig` lays
over Ray's ranks, the one-line refusals of it, of its callbacks and of `python -m trainer.ray`,
and the bounded wait after Ray's notice."""

import json
import os

import pytest

pytest.importorskip("ray.train")

# pylint: disable=g-import-not-at-top
from absl import flags
from absl.testing import flagsaver

import tfdist.ray
from tfdist.errors import UsageError
from tfdist.ray import roles
from trainer import ray as trainer_ray
from trainer import task as _task  # noqa: F401  defines trainer.task's flags outside every flagsaver


def _roles(world_size, **options):
    layout = tfdist.ray.TensorflowConfig(**options).layout(world_size)
    urls = [f"127.0.0.1:{port}" for port in range(9000, 9000 + world_size)]
    return [json.loads(config) for config in roles.tf_configs(layout, urls)]


def test_rank_0_is_the_chief_the_last_ranks_the_parameter_servers_and_the_evaluator():
    configs = _roles(5, chief=True, parameter_servers=2, evaluator=True)
    assert [(c["task"]["type"], c["task"]["index"]) for c in configs] == [
        ("chief", 0),
        ("worker", 0),
        ("ps", 0),
        ("ps", 1),
        ("evaluator", 0),
    ]
    training = {
        "chief": ["127.0.0.1:9000"],
        "worker": ["127.0.0.1:9001"],
        "ps": ["127.0.0.1:9002", "127.0.0.1:9003"],
    }
    assert all(c["cluster"] == training for c in configs[:4])
    assert configs[4]["cluster"] == {**training, "evaluator": ["127.0.0.1:9004"]}


def test_without_options_every_rank_is_a_worker_as_in_ray():
    configs = _roles(3)
    assert [(c["task"]["type"], c["task"]["index"]) for c in configs] == [
        ("worker", 0),
        ("worker", 1),
        ("worker", 2),
    ]
    assert _roles(2, chief=True)[0]["task"] == {"type": "chief", "index": 0}


@pytest.mark.parametrize(
    "options, world_size, message",
    [
        (
            {"parameter_servers": 1},
            3,
            "parameter_servers is 1 but chief is False, expected a chief",
        ),
        (
            {"chief": True, "parameter_servers": 1},
            2,
            "Ray Train has 2 worker(s), expected at least 3",
        ),
        ({"chief": True, "parameter_servers": -1}, 3, "parameter_servers"),
        ({"evaluator": "yes"}, 2, "evaluator is 'yes', expected True or False"),
        ({"evaluator": True}, 1, "Ray Train has 1 worker(s), expected at least 2"),
    ],
)
def test_impossible_layouts_are_one_line(options, world_size, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")) as error:
        tfdist.ray.TensorflowConfig(**options).layout(world_size)
    assert "\n" not in str(error.value)


def test_the_config_takes_its_options_by_keyword_only():
    with pytest.raises(TypeError):
        tfdist.ray.TensorflowConfig(True)  # pylint: disable=too-many-function-args
    assert (
        tfdist.ray.TensorflowConfig(chief=True, parameter_servers=1).to_dict()["parameter_servers"]
        == 1
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num_ps=1"], "got --chief=false, --num_workers=2, --num_ps=1; set --chief=true"),
        (
            ["--chief", "--num_ps=1", "--num_workers=0"],
            "got --chief=true, --num_workers=0, --num_ps=1; set --num_workers=1",
        ),
        (["--num_workers=0"], "no training task, got --chief=false, --num_workers=0"),
        (["--num_workers=-1"], "-1 is not a non-negative integer"),
        (["--bogus=1"], "Unknown command line flag 'bogus'"),
        (["--", "--nosuchflag"], "Unknown command line flag 'nosuchflag' (a trainer.task flag"),
        (
            ["--", "--strategy=parameter_server"],
            "trainer.task's --strategy=parameter_server needs a chief to coordinate",
        ),
        (
            ["--chief", "--num_ps=1", "--", "--strategy=multiworker"],
            "trainer.task's --strategy=multiworker has no use for ps tasks, got --num_ps=1",
        ),
        (["--", "--epochs=0"], "epochs"),
    ],
)
def test_trainer_ray_refuses_bad_flags_in_one_line_with_exit_2(argv, message, capsys):
    with flagsaver.flagsaver(), pytest.raises(SystemExit) as exit_info:
        try:
            trainer_ray.main(["trainer.ray", *argv])
        finally:
            flags.FLAGS.unparse_flags()  # as tests/multiprocess/test_config.py leaves trainer.task's flags
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


@pytest.mark.parametrize(
    "make",
    [
        lambda path: tfdist.ray.ReportBackups(str(path)),
        lambda path: tfdist.ray.PreemptionNotice(every_steps=2),
    ],
)
def test_callbacks_of_rays_collectives_refuse_a_ps_job_the_backend_did_not_set_up(
    make, tmp_path, monkeypatch
):
    """Its worker and ps ranks would never make the calls; under the backend they follow."""
    from tfdist.ray import job_end

    layout = tfdist.ray.TensorflowConfig(chief=True, parameter_servers=1).layout(3)
    monkeypatch.setenv(
        "TF_CONFIG", roles.tf_configs(layout, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"])[0]
    )
    monkeypatch.delenv(job_end.FOLLOWED_VARIABLE, raising=False)
    with pytest.raises(UsageError, match="tfdist.ray.TensorflowConfig did not set up"):
        make(tmp_path).on_train_begin()
    monkeypatch.setenv(job_end.FOLLOWED_VARIABLE, "1")
    callback = make(tmp_path)
    if isinstance(callback, tfdist.ray.PreemptionNotice):
        callback.set_model(_model(_Steps(0)))
    callback.on_train_begin()


def _model(steps):
    """What the notice reads of a model: its optimizer's step count."""
    return type("Model", (), {"optimizer": type("Optimizer", (), {"iterations": steps})})()


class _Steps:
    def __init__(self, value):
        self.value = value

    def numpy(self):
        return self.value


def test_the_notice_is_polled_each_time_the_step_passes_a_multiple(monkeypatch):
    """Parameter-server callbacks run at sync points (every 5 steps here): still every rank
    polls at the same points, and with every_steps=1 at each of them."""
    from tfdist.ray import job_end

    polled = []
    monkeypatch.setattr(job_end, "preemption_info", lambda: polled.append(steps.value))
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for every, expected in ((1, [5, 10, 15, 20]), (8, [10, 20])):
        polled.clear()
        steps = _Steps(0)
        notice = tfdist.ray.PreemptionNotice(every_steps=every)
        notice.set_model(_model(steps))
        notice.on_train_begin()
        for step in (5, 10, 15, 20):
            steps.value = step
            notice.on_train_batch_end(step - 1)
        assert polled == expected, (every, polled)


def test_the_notice_poll_interval_is_a_whole_number_of_steps():
    with pytest.raises(UsageError, match="every_steps"):
        tfdist.ray.PreemptionNotice(every_steps=0)


def test_after_rays_notice_the_wait_for_ray_ends_at_the_deadline_plus_the_margin():
    from ray.train import PreemptionInfo

    from tfdist.ray import preemption_notice

    now = [1000.0]
    info = PreemptionInfo(deadline_ms=1_012_000, preempted_node_to_ranks={"n": [0]})
    preemption_notice.wait_for_ray(
        info, clock=lambda: now[0], sleep=lambda seconds: now.__setitem__(0, now[0] + seconds)
    )
    assert (
        1012 + preemption_notice.WAIT_MARGIN_SECONDS
        <= now[0]
        < 1012.5 + (preemption_notice.WAIT_MARGIN_SECONDS)
    )


_TWO_WORKERS = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
_WITH_PS = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}


@pytest.mark.parametrize(
    "cluster_spec,task_type,under_backend,has_evaluator,ray_calls",
    [
        (_TWO_WORKERS, "worker", True, False, True),
        (_TWO_WORKERS, "worker", False, False, False),
        (_WITH_PS, "chief", True, False, True),
        (_TWO_WORKERS, "worker", True, True, True),
        (_WITH_PS, "chief", False, False, False),
    ],
    ids=[
        "synchronous under the backend",
        "outside Ray",
        "parameter servers",
        "an evaluator rank",
        "parameter servers outside Ray",
    ],
)
def test_trainer_task_makes_rays_collective_calls_under_the_backend_with_every_role(
    tmp_path, monkeypatch, cluster_spec, task_type, under_backend, has_evaluator, ray_calls
):
    """Ray's notice is polled just before the backup, the backups reported just after it;
    both are collectives, which the ranks that never run fit (parameter-server workers and
    ps tasks, an evaluator) make after rank 0 (tfdist.ray.job_end)."""
    from tfdist.callbacks import BackupAndRestore
    from tfdist.distribute.cluster import HAS_EVALUATOR, resolve_cluster
    from tfdist.ray import job_end
    from trainer.config import ExperimentConfig
    from trainer.run import callbacks as run_callbacks
    from trainer.run.directories import OutputDirs

    monkeypatch.delenv(job_end.ACTOR_VARIABLE, raising=False)
    monkeypatch.delenv(HAS_EVALUATOR, raising=False)
    if under_backend:
        monkeypatch.setenv(job_end.ACTOR_VARIABLE, "tfdist-job-end-test")
    if has_evaluator:
        monkeypatch.setenv(HAS_EVALUATOR, "1")
    tf_config = {"cluster": cluster_spec, "task": {"type": task_type, "index": 0}}
    cluster = resolve_cluster({"TF_CONFIG": json.dumps(tf_config)})
    backup_dir = str(tmp_path / "backup")
    callbacks = run_callbacks.training_callbacks(
        config=ExperimentConfig(),
        cluster=cluster,
        backup=BackupAndRestore(backup_dir, cluster=cluster),
        exporter=None,
        environ=os.environ,
        dirs=OutputDirs(model_dir="", backup_dir=backup_dir, tensorboard_dir=""),
    )
    kinds = [type(callback).__name__ for callback in callbacks]
    if ray_calls:
        assert kinds[-3:] == ["PreemptionNotice", "BackupAndRestore", "ReportBackups"], kinds
        assert callbacks[-3].every_steps == (1 if "ps" in cluster_spec else 8)
    else:
        assert kinds[-1] == "BackupAndRestore", kinds
        assert not {"PreemptionNotice", "ReportBackups"} & set(kinds), kinds
