"""`python -m trainer.task` with --backup_dir: preemption, resume, completion.

Runs the trainer as real processes: SIGTERM after a backup exists, exit 143,
restart, and compare the final model with an uninterrupted run's.
"""

from trainer.config import ExperimentConfig


def test_backup_dir_defaults_to_aip_checkpoint_dir():
    from trainer.run.directories import OutputDirs  # pylint: disable=g-import-not-at-top

    environ = {"AIP_CHECKPOINT_DIR": "gs://bucket/job/checkpoints/"}
    assert (
        OutputDirs.from_config(ExperimentConfig(), environ).backup_dir
        == environ["AIP_CHECKPOINT_DIR"]
    )
    assert (
        OutputDirs.from_config(ExperimentConfig(backup_dir="/tmp/mine"), environ).backup_dir
        == "/tmp/mine"
    )
    assert OutputDirs.from_config(ExperimentConfig(), {}).backup_dir == ""
