"""The trainer flags after `--`, read by the job writers with `trainer.task`'s own flag table.

`trainer.submission.has_flag`/`flag_value` (what `trainer.submit` and `trainer.kubernetes`
read of those flags) and `trainer.kubernetes`' refusal of the flags its shape sets parse
the arguments as absl parses them for `trainer.task`; on main they matched their text, so
`-strategy=mirrored` (one dash, which absl reads as `--strategy`) slipped past the
Kubernetes shape and the replicas got two strategies, and a value that looks like a flag
was taken for one. In-process: the functions `python -m trainer.submit` and
`python -m trainer.kubernetes` call on the arguments after `--`.
"""

import pytest

from tfdist.errors import UsageError
from trainer import submission, task_flags
from trainer.kubernetes import manifest
from trainer.kubernetes import shape as shape_lib
from trainer.vertex import options as vertex_options
from trainer.vertex import tuning
from trainer.vertex.spec import JobSpec

IMAGE = "us-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"


def _tfjob_shape(trainer_args):
    """What `python -m trainer.kubernetes ... -- ARGS` builds before writing the manifest."""
    return shape_lib.shape_from_options(
        {"name": "job", "image": IMAGE, "bucket": "gs://bucket", "trainer_args": trainer_args}
    )


def _vertex_spec(trainer_args):
    """What `python -m trainer.submit ... -- ARGS` builds and checks before any upload."""
    values = {
        "project": "my-project",
        "region": "us-central1",
        "staging_bucket": "gs://my-bucket",
        "container_uri": IMAGE,
        "trainer_args": tuple(trainer_args),
    }
    spec = JobSpec.from_options(vertex_options.merge_options({}, values), timestamp="t")
    tuning.check_trial_flags(spec, None)  # as trainer.submit's main
    return spec


def _one_line(call) -> str:
    with pytest.raises(UsageError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message, message
    return message


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--epochs=x"], "epochs"),
        (["--bogus=1"], "Unknown command line flag 'bogus'"),
        (["--epoch=3"], "Unknown command line flag 'epoch'"),  # a typo of --epochs
        (["--epochs=0"], "epochs"),
        (["--epochs", "3", "stray"], "'stray'"),
    ],
)
@pytest.mark.parametrize("writer", [_tfjob_shape, _vertex_spec], ids=["kubernetes", "submit"])
def test_a_bad_trainer_flag_after_dashdash_is_one_line_before_a_job_is_written(
    writer, args, expected
):
    message = _one_line(lambda: writer(args))
    assert expected in message, message
    assert "after --" in message, message


@pytest.mark.parametrize(
    "args",
    [
        ["-strategy=mirrored"],  # accepted on main: one dash
        ["-model_dir=/elsewhere"],
        ["--backup_dir", "/elsewhere"],
        ["--epochs=2", "-preemption_grace_seconds", "9"],
    ],
)
def test_the_flags_a_kubernetes_shape_sets_are_refused_in_every_spelling(args):
    message = _one_line(lambda: _tfjob_shape(args))
    assert "which the job shape sets" in message, message


def test_the_strategy_after_dashdash_is_refused_by_submit_in_every_spelling():
    for args in (["-strategy=mirrored"], ["--strategy", "mirrored"]):
        assert "--strategy appears after --" in _one_line(lambda args=args: _vertex_spec(args))


def test_flags_are_read_as_trainer_task_reads_them():
    # --model_dir takes the next argument as its value, as absl does: no --strategy here.
    args = ["--model_dir", "--strategy=mirrored"]
    assert not submission.has_flag(args, "strategy")
    assert submission.flag_value(args, "model_dir") == "--strategy=mirrored"
    assert submission.flag_value(["-all_reduce", "ring", "--all_reduce=nccl"], "all_reduce") == (
        "nccl"
    )
    assert submission.flag_value(["--epochs=3"], "all_reduce") is None
    assert (
        submission.flag_value(
            ["--max_restarts_without_progress", "5"], "max_restarts_without_progress"
        )
        == 5
    )


def test_the_crash_loop_guard_is_not_doubled_in_any_spelling():
    for args in (["-max_restarts_without_progress=5"], ["--max_restarts_without_progress", "5"]):
        assert submission.crash_loop_guard_args(args) == ()
        command = manifest.trainer_command(_tfjob_shape(args))
        assert [arg for arg in command if "max_restarts" in arg] == [args[0]], command
    assert submission.crash_loop_guard_args(["--epochs=3"]) == (
        "--max_restarts_without_progress=3",
    )


def test_reading_unparsable_trainer_flags_refuses_them_in_one_line():
    message = _one_line(lambda: submission.has_flag(["--bogus=1"], "strategy"))
    assert "Unknown command line flag 'bogus'" in message
    assert "not a string" in _one_line(lambda: submission.flag_value([None], "epochs"))


def test_the_parse_returns_what_the_flags_set_and_the_check_also_applies_the_rules():
    assert task_flags.parse_trainer_args(["--lr_scaling=linear"]) == {"lr_scaling": "linear"}
    # --lr_scaling=linear needs --reference_batch_size: a rule between flags, the check's.
    assert "reference_batch_size" in _one_line(
        lambda: task_flags.check_trainer_args(["--lr_scaling=linear"])
    )
