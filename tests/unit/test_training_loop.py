"""The one training loop, `trainer.run.loop.train`, with a strategy's driver as its parameter.

The loop does the steps every strategy shares (prepare, the restart after the end,
the segments, the final evaluation, the outputs); the driver only runs them. The
parameter-server driver runs in tests/multiprocess/test_parameter_server.py.
"""

import json

import tensorflow as tf

from tfdist.distribute.cluster import resolve_cluster
from trainer import config as config_lib
from trainer import tasks
from trainer.run import loop
from trainer.run.directories import OutputDirs
from trainer.run.synchronous import SynchronousDriver


class _Recording(SynchronousDriver):
    """The synchronous driver, noting what the loop asked of it."""

    def __init__(self, cluster, strategy):
        super().__init__(cluster, strategy)
        self.calls = []

    def begin(self, run):
        self.calls.append("begin")
        super().begin(run)

    def fit(self, run, segment, validation):
        self.calls.append(("fit", segment.first_step))
        return super().fit(run, segment, validation)

    def evaluate(self, run, stream):
        self.calls.append("evaluate")
        return super().evaluate(run, stream)


def _train(config: config_lib.ExperimentConfig) -> tuple[dict, list]:
    cluster = resolve_cluster({})
    strategy = tf.distribute.get_strategy()
    driver = _Recording(cluster, strategy)
    summary = loop.train(
        config,
        cluster,
        OutputDirs.from_config(config, {}),
        tasks.load(config),
        strategy=strategy,
        environ={},
        strategy_name="default",
        driver=driver,
    )
    return summary, driver.calls


def test_the_loop_runs_the_plan_through_the_driver_and_a_restart_after_the_end_asks_nothing(
    tmp_path,
):
    config = config_lib.ExperimentConfig(
        strategy="default",
        epochs=2,
        steps_per_epoch=4,
        num_examples=256,
        global_batch_size=32,
        steps_per_execution=2,
        backup_every_steps=4,
        model_dir=str(tmp_path / "model"),
        backup_dir=str(tmp_path / "backup"),
    )
    summary, calls = _train(config)
    assert calls == ["begin", ("fit", 0), "evaluate"]
    assert json.loads((tmp_path / "model" / "summary.json").read_text()) == summary
    assert summary["strategy"] == "default" and summary["steps_completed"] == 8
    assert summary["num_workers"] == 1 and "num_ps" not in summary
    assert summary["metrics"]["test"] and summary["examples_per_second"] > 0

    again, calls = _train(config)
    assert calls == [] and again == summary  # answered from summary.json: no step, no evaluation
