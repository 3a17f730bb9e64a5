"""The driver of `--strategy=parameter_server`: the chief's coordinator.

Workers and ps tasks serve (`tfdist.parameter_server.serve`); the chief runs
`trainer.run.loop.train` with this driver, which drives the steps with
`tfdist.parameter_server.ParameterServerTrainer`. Each worker reads its own
batches (`trainer.run.inputs.Inputs.worker_batches`) from the position the
backup recorded for it (`tfdist.parameter_server.WorkerPositions`).
"""

from typing import Sequence

import tensorflow as tf
from absl import logging

from tfdist import parameter_server
from tfdist.distribute.cluster import WORKER, Cluster
from trainer.config import ExperimentConfig
from trainer.run import loop
from trainer.run.inputs import Inputs

__all__ = ["ParameterServerDriver", "worker_dataset_fn"]


def worker_dataset_fn(inputs: Inputs, num_workers: int, first_batches: Sequence[int]):
    """The dataset function of `fit`: on worker `w`, its batches from `first_batches[w]`."""
    return parameter_server.per_worker_dataset_fn(
        inputs.worker_batches(num_workers), first_batches, sample=inputs.sample_batch()
    )


class ParameterServerDriver(loop.Driver):
    """`ParameterServerTrainer.fit` per segment, evaluation on the coordinator, its throughput.

    The workers' input positions are backed up with the weights.
    """

    def __init__(
        self, config: ExperimentConfig, cluster: Cluster, strategy: tf.distribute.Strategy
    ):
        self._config = config
        self.num_workers = cluster.count(WORKER)
        self.num_ps = cluster.num_ps
        self._positions = parameter_server.WorkerPositions(strategy, self.num_workers)
        self._trainer = None

    def extra_state(self):
        return {"worker_positions": self._positions.variable}

    def begin(self, run):
        self._trainer = parameter_server.ParameterServerTrainer(
            run.model, positions=self._positions
        )

    def fit(self, run, segment, validation):
        first_batches = self._positions.read()
        if any(first_batches):
            logging.info(
                "Parameter-server workers resume their own streams at batches %s (of %d "
                "consumed before).",
                first_batches,
                sum(first_batches),
            )
        return self._trainer.fit(
            worker_dataset_fn(run.inputs, self.num_workers, first_batches),
            epochs=segment.epochs,
            initial_epoch=segment.initial_epoch,
            steps_per_epoch=segment.steps_per_epoch,
            steps_per_sync=self._config.backup_every_steps or None,
            # Callbacks run at sync points only: the meter is left out (see examples_per_second).
            callbacks=list(run.callbacks),
            verbose=2,
            **validation,
        )

    def evaluate(self, run, stream):
        return self._trainer.evaluate_on_coordinator(stream)

    def examples_per_second(self, run) -> float:
        return self._trainer.steps_per_second * self._config.global_batch_size
