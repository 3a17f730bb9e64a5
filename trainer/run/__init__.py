"""`run(config, cluster)`: the one place where a task's role decides what it does.

| role                   | strategy            | does                                             |
|------------------------|---------------------|--------------------------------------------------|
| evaluator              | any                 | `evaluator.evaluate`                             |
| worker, ps             | parameter_server    | serve until the chief is done                    |
| chief (or single task) | parameter_server    | `loop.train` with `ParameterServerDriver`        |
| chief, worker, single  | any other           | `loop.train` with `SynchronousDriver`            |

Everything a user can get wrong (flags, the task, the cluster) is checked
before any task contacts another.

Reading order, one job per module:

1. this module: the role and strategy decide what runs;
2. `loop`: the one training loop (`train`) and what a strategy brings to it
   (`Driver`); `evaluator`: the task that only evaluates;
3. `synchronous`, `parameter_server`: the two drivers (Keras `fit` on every
   worker; the chief's coordinator);
4. `pipeline`: `prepare` (everything before the first step) and `conclude`
   (everything after the last), the same for every strategy, made of:
5. `directories` (where outputs go), `inputs` (the task's examples as
   streams, a parameter-server worker's own batches), `compiling` (strategy
   limits, XLA, the optimizer, steps per execution), `restarts` (what a
   backup records, what a restart may change, where it resumes), `callbacks`
   (in their order), `outputs` (`summary.json` and the model), `throughput`
   (the examples-per-second meter).
"""

import os
from typing import Mapping

import keras
import tensorflow as tf
from absl import logging

from tfdist import parameter_server as ps_lib
from tfdist import tasks as tasks_lib
from tfdist.data import per_replica_batch_size
from tfdist.distribute import strategy as strategy_lib
from tfdist.distribute.cluster import CHIEF, EVALUATOR, PS, WORKER, Cluster
from tfdist.errors import UsageError
from tfdist.parameter_server import training as ps_training
from trainer import tasks
from trainer.config import ExperimentConfig
from trainer.run import evaluator, loop
from trainer.run.compiling import check_settings_for_strategy
from trainer.run.directories import OutputDirs
from trainer.run.parameter_server import ParameterServerDriver
from trainer.run.synchronous import SynchronousDriver

# What a collective or a remote call raises when another task died or hung
# (`trainer.task` exits 200 on these): the same errors as a lost parameter server's.
PEER_FAILURES = ps_training.PEER_FAILURES


def strategy_options(config: ExperimentConfig) -> strategy_lib.StrategyOptions:
    return strategy_lib.StrategyOptions(
        all_reduce=config.all_reduce,
        num_cpu_devices=config.num_cpu_devices,
        tpu=config.tpu,
        peer_timeout_seconds=config.peer_timeout_seconds,
    )


def serve_options(config: ExperimentConfig) -> ps_lib.ServeOptions:
    """How a worker or ps task of a parameter-server job waits for and watches the chief."""
    return ps_lib.ServeOptions(
        chief_start_timeout=config.chief_start_timeout_seconds,
        peer_timeout=config.peer_timeout_seconds,
        grace_seconds=config.preemption_grace_seconds,
    )


def run(
    config: ExperimentConfig, cluster: Cluster, environ: Mapping[str, str] = os.environ
) -> dict | None:
    """Runs this task's part of the job.

    Returns:
        The summary where training ran (every training task; only the chief
        writes it), None on evaluator, worker-of-ps and ps tasks.

    Raises:
        UsageError: Bad flags, task or cluster; raised before any peer is contacted.
    """
    dirs = OutputDirs.from_config(config, environ)
    tf.get_logger().setLevel("WARNING")
    options = strategy_options(config)
    strategy_name = strategy_lib.resolve_strategy_name(config.strategy, cluster, options)
    check_settings_for_strategy(config, strategy_name)
    loaded = tasks.load(config)
    tasks_lib.preflight(loaded.task, loaded.spec)
    if cluster.task_type not in (EVALUATOR, PS) and not (
        strategy_name == "parameter_server" and cluster.task_type == WORKER
    ):
        dirs.check_writable(is_chief=cluster.is_chief)
    if config.mixed_precision != "none":
        keras.mixed_precision.set_global_policy(config.mixed_precision)

    if cluster.task_type == EVALUATOR:
        return evaluator.evaluate(config, cluster, dirs, loaded)
    if strategy_name == "parameter_server":
        if cluster.task_type in (WORKER, PS):
            ps_lib.serve(cluster, serve_options(config))
            return None
        if cluster.task_type != CHIEF:
            raise UsageError(
                f"task type {cluster.task_type!r} has no part in parameter-server training, "
                f"expected chief, worker, ps or evaluator"
            )
        strategy = strategy_lib.make_strategy("parameter_server", cluster, options)
        driver = ParameterServerDriver(config, cluster, strategy)
    else:
        replicas = strategy_lib.expected_num_replicas(strategy_name, cluster, options)
        if replicas:
            per_replica_batch_size(config.global_batch_size, replicas)
        strategy = strategy_lib.make_strategy(strategy_name, cluster, options)
        logging.info(
            "Training %s under %s on %d replica(s).",
            loaded.spec,
            strategy_name,
            strategy.num_replicas_in_sync,
        )
        driver = SynchronousDriver(cluster, strategy)
    return loop.train(
        config,
        cluster,
        dirs,
        loaded,
        strategy=strategy,
        environ=environ,
        strategy_name=strategy_name,
        driver=driver,
    )
