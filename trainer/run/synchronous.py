"""The driver of the synchronous strategies: default, one_device, mirrored, multiworker, tpu.

Every worker runs `trainer.run.loop.train` with it; Keras `fit` keeps them in
step, and only the chief writes.
"""

import contextlib

import tensorflow as tf

from tfdist._internal import peer_noise
from tfdist.distribute.cluster import Cluster
from trainer.run import loop

__all__ = ["SynchronousDriver"]


class SynchronousDriver(loop.Driver):
    """`model.fit` per segment on every worker, `model.evaluate`, the meter's throughput."""

    def __init__(self, cluster: Cluster, strategy: tf.distribute.Strategy):
        self._cluster = cluster
        self._strategy = strategy
        self.num_workers = cluster.num_workers

    def running(self):
        # A lost peer's one-line error (printed by trainer.task) before TensorFlow's C++ lines.
        if self._cluster.num_workers > 1:
            return peer_noise.HeldPeerNoise()
        return contextlib.nullcontext()

    def fit(self, run, segment, validation):
        return run.model.fit(
            run.inputs.train_stream(segment.first_step, self._strategy),
            callbacks=[run.meter, *run.callbacks],
            shuffle=False,
            verbose=2 if self._cluster.is_chief else 0,
            **segment.fit_kwargs(),
            **validation,
        )

    def evaluate(self, run, stream):
        results = run.model.evaluate(stream, verbose=0, return_dict=True)
        return {name: float(value) for name, value in results.items()}

    def examples_per_second(self, run) -> float:
        return run.meter.examples_per_second
