"""tfdist under Ray Train: `pip install 'tfdist[ray]'`.

Keep Ray's own trainer and pass tfdist's backend config:

    import ray.train
    from ray.train.tensorflow import TensorflowTrainer
    import tfdist.ray, tfdist.resumable

    @tfdist.ray.train_function
    def train_fn():
        strategy = tfdist.resumable.strategy_from_environment()
        ...
        tfdist.resumable.fit(model, dataset, backup_dir=SHARED_DIR, epochs=4,
                             steps_per_epoch=16,
                             callbacks=[tfdist.ray.PreemptionNotice(every_steps=8),
                                        tfdist.ray.ReportBackups(SHARED_DIR)])

    TensorflowTrainer(train_fn, tensorflow_config=tfdist.ray.TensorflowConfig(),
                      scaling_config=ray.train.ScalingConfig(num_workers=2),
                      run_config=ray.train.RunConfig(
                          failure_config=ray.train.FailureConfig(max_failures=2))).fit()

(`tensorflow_config=` is `TensorflowTrainer`'s name for it; `DataParallelTrainer`
takes the same object as `backend_config=`.) On each worker, on the worker's
main thread before the training function starts, the backend:

- writes `TF_CONFIG`: by default as Ray's own backend does (`worker` roles,
  rank = index; worker 0 is tfdist's chief); with `chief=True`,
  `parameter_servers=N`, `evaluator=True` rank 0 is the chief, the last ranks
  the parameter servers and the evaluator (`tfdist.ray.roles`). Wrap the
  training function in `train_function` so that, under parameter servers, the
  worker and ps ranks serve and return when the chief's function returns;
- sets `TF_USE_LEGACY_KERAS=0`: Ray sets 1, which does nothing in its own
  workers (`tf.keras` is resolved before) but makes child processes load
  tf_keras; with 0, Keras 3 everywhere;
- installs `tfdist.preemption.signal_relay`: Ray runs the training
  function in a thread, where no signal handler can be installed, so without
  it tfdist's SIGTERM handling is off. With it, a SIGTERM to a worker process
  ends in a backup at a step the workers agree on, as outside Ray; the
  training function then ends with `tfdist.preemption.Preempted` and Ray's
  `FailureConfig` decides whether to restart.

`PreemptionNotice` (a Keras callback) reads Ray's own preemption notice
(`ray.train.get_preemption_info()`, a node drained for preemption) every N
steps and hands it to the same path as a SIGTERM; `train_function` then lets
Ray end the group so that Ray counts a preemption, not a failure.

`ReportBackups` reports tfdist's committed backups to Ray as checkpoints. The
backups themselves stay the source of truth: a restarted worker group resumes
from `backup_dir` at the exact step, whatever Ray kept.
"""

import dataclasses
import functools
import os
import signal
from typing import Callable

try:
    import ray
    import ray.train
    from ray.train.tensorflow.config import TensorflowConfig as _RayTensorflowConfig
    from ray.train.tensorflow.config import _TensorflowBackend
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError(
        f"tfdist.ray needs Ray Train ({error}); install it with pip install 'tfdist[ray]'"
    ) from None

import keras

from tfdist import preemption
from tfdist.backups.store import BackupStore
from tfdist.distribute import cluster as cluster_lib
from tfdist.errors import UsageError
from tfdist.preemption import signal_relay
from tfdist.ray import job_end, preemption_notice, roles
from tfdist.ray.preemption_notice import PreemptionNotice

__all__ = [
    "TensorflowConfig",
    "ReportBackups",
    "PreemptionNotice",
    "train_function",
    "set_up_by_backend",
]


def set_up_by_backend() -> bool:
    """Whether this process is a Ray Train worker that `TensorflowConfig` set up."""
    return bool(os.environ.get(job_end.ACTOR_VARIABLE))


def _setup_worker(
    tf_config: str,
    signals: tuple[int, ...],
    legacy_keras: str,
    has_evaluator: bool,
    job_end_actor: str,
    followed: bool = False,
    describe: str = "",
) -> bool:
    """Runs on each Ray worker's main thread; returns whether the relay is on."""
    os.environ[cluster_lib.TF_CONFIG] = tf_config
    os.environ["TF_USE_LEGACY_KERAS"] = legacy_keras
    if has_evaluator:
        os.environ[cluster_lib.HAS_EVALUATOR] = "1"
    else:
        os.environ.pop(cluster_lib.HAS_EVALUATOR, None)
    os.environ[job_end.ACTOR_VARIABLE] = job_end_actor
    os.environ[job_end.FOLLOWED_VARIABLE] = "1" if followed else "0"
    if describe:  # where each role runs: which node a drain or a failure hits
        print(f"{describe} on node {ray.get_runtime_context().get_node_id()}", flush=True)
    return signal_relay.install(signals) if signals else False


@dataclasses.dataclass(kw_only=True)
class TensorflowConfig(_RayTensorflowConfig):
    """Ray Train's `TensorflowConfig`, with tfdist's worker setup.

    Attributes:
        chief: Rank 0 is the `chief` (under parameter servers, the
            coordinator; otherwise a MultiWorkerMirrored task that also
            trains). False: every training rank is a `worker`, as in Ray.
        parameter_servers: The last ranks (before the evaluator) are `ps`
            tasks; needs `chief` and at least one worker. Their training
            function is `train_function`'s server loop.
        evaluator: The last rank is the `evaluator`.
        preemption_signals: Signals relayed to tfdist's preemption handling on
            the training thread; empty leaves signals to Ray.
        legacy_keras: What `TF_USE_LEGACY_KERAS` becomes in the workers (and
            so in their child processes): "0" (Keras 3, the default) or "1".
    """

    chief: bool = False
    parameter_servers: int = 0
    evaluator: bool = False
    preemption_signals: tuple[int, ...] = (signal.SIGTERM,)
    legacy_keras: str = "0"

    def __post_init__(self):
        if self.legacy_keras not in ("0", "1"):
            raise UsageError(
                f"legacy_keras is {self.legacy_keras!r}, expected '0' (Keras 3) or '1' (tf_keras)"
            )
        roles.check_options(
            chief=self.chief, parameter_servers=self.parameter_servers, evaluator=self.evaluator
        )
        self.preemption_signals = tuple(int(signum) for signum in self.preemption_signals)

    def layout(self, num_workers: int):
        """The `tfdist.launch.local_cluster.ClusterLayout` of `num_workers` Ray ranks.

        Raises:
            UsageError: The roles do not fit `num_workers` ranks.
        """
        return roles.layout(
            num_workers,
            chief=self.chief,
            parameter_servers=self.parameter_servers,
            evaluator=self.evaluator,
        )

    @property
    def backend_cls(self):
        return _TfdistBackend

    def to_dict(self):
        return {
            "chief": self.chief,
            "parameter_servers": self.parameter_servers,
            "evaluator": self.evaluator,
            "preemption_signals": list(self.preemption_signals),
            "legacy_keras": self.legacy_keras,
        }


class _TfdistBackend(_TensorflowBackend):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._job_end = None

    def on_start(self, worker_group, backend_config: TensorflowConfig):
        from ray._common.network_utils import build_address  # pylint: disable=g-import-not-at-top
        from ray.train._internal.utils import get_address_and_port  # pylint: disable=g-import-not-at-top

        def get_url():
            address, port = get_address_and_port()
            return build_address(address, port)

        cluster_layout = backend_config.layout(len(worker_group))
        urls = worker_group.execute(get_url)
        configs = roles.tf_configs(cluster_layout, urls)
        names = roles.task_names(cluster_layout)
        # The ranks that never run fit follow rank 0's Ray Train calls (job_end).
        followed = bool(cluster_layout.num_ps or cluster_layout.has_evaluator)
        self._job_end, actor_name = job_end.create()
        futures = [
            worker_group.execute_single_async(
                index,
                _setup_worker,
                tf_config=configs[index],
                signals=backend_config.preemption_signals,
                legacy_keras=backend_config.legacy_keras,
                has_evaluator=cluster_layout.has_evaluator,
                job_end_actor=actor_name,
                followed=followed,
                describe=f"tfdist.ray: rank {index} is {names[index]}",
            )
            for index in range(len(worker_group))
        ]
        relayed = ray.get(futures)
        if backend_config.preemption_signals and not all(relayed):
            raise RuntimeError(
                "tfdist.ray could not install its signal relay on every "
                "worker's main thread; preemption handling would be off"
            )

    def on_shutdown(self, worker_group, backend_config: TensorflowConfig):
        if self._job_end is not None:
            ray.kill(self._job_end)
            self._job_end = None
        super().on_shutdown(worker_group, backend_config)


def train_function(fn: Callable) -> Callable:
    """Wraps a training function so that every role of the layout does its part.

    Under parameter servers, the `ps` and `worker` ranks serve (the chief
    sends them the steps) and return once the chief's `fn` has returned;
    every other rank runs `fn`. Ray passes `config` as it would to `fn`.
    The ranks that never run `fit` (those servers, and an evaluator, which
    follows from a thread beside `fn` and, once `fn` returns, until the
    chief's returns) make every Ray Train collective call that rank 0 makes
    through `ReportBackups` and `PreemptionNotice` (`tfdist.ray.job_end`).
    After a backup for Ray's own preemption notice (`PreemptionNotice`), it
    waits for Ray to end the group, so that Ray charges the restart to
    `max_preemption_failures` (`tfdist.ray.preemption_notice`).

        TensorflowTrainer(tfdist.ray.train_function(train_fn),
                          tensorflow_config=tfdist.ray.TensorflowConfig(
                              chief=True, parameter_servers=1), ...)
    """

    @functools.wraps(fn)
    def run(*args):
        cluster = cluster_lib.resolve_cluster(os.environ)
        if cluster.addresses.get(cluster_lib.PS) and cluster.task_type in (
            cluster_lib.WORKER,
            cluster_lib.PS,
        ):
            job_end.serve_until_job_end(cluster)
            return None
        if cluster.task_type == cluster_lib.EVALUATOR:
            return _evaluate_and_follow(fn, args)
        try:
            return fn(*args)
        except preemption.Preempted:
            notice = preemption_notice.handled_notice()
            if notice is not None:  # Ray's own notice: let Ray end the group (see the module)
                ReportBackups.report_after_preemption()  # the backup just made, as Ray's
                preemption_notice.wait_for_ray(notice)
            raise
        finally:
            if cluster.is_chief:
                job_end.mark_ended()

    return run


def _evaluate_and_follow(fn: Callable, args: tuple):
    """The evaluator rank: `fn` with rank 0's Ray Train calls followed beside it, then until
    the chief's function returns (an evaluator may stop first, at the chief's marker)."""
    thread, stop = job_end.follow_in_thread()
    try:
        result = fn(*args)
    except BaseException:
        stop.set()  # the evaluator failed: Ray ends the group anyway
        raise
    thread.join()
    if thread.errors:
        raise thread.errors[0]
    cluster = cluster_lib.resolve_cluster(os.environ)
    print(
        f"tfdist.ray: {cluster.task_type}:{cluster.task_index} made {thread.follower.reports} "
        f"Ray Train reports and {thread.follower.polls} preemption polls with rank 0",
        flush=True,
    )
    return result


class ReportBackups(keras.callbacks.Callback):
    """Reports tfdist's committed backups to Ray Train as checkpoints.

    Pass it in `callbacks=` of `tfdist.resumable.fit` (which runs it after its
    backup callback, `reads_backups`), or of the chief's
    `tfdist.parameter_server.fit`: at each epoch start and at the end of
    training, every worker calls `ray.train.report` (Ray needs all of them;
    the ranks that do not run fit make the same calls through
    `train_function`), and rank 0 attaches the newest committed backup
    directory when it is newer than the last one reported. Metrics: `step` and
    the last epoch's logs.

    Args:
        backup_dir: The `backup_dir` given to `tfdist.resumable.fit`.
    """

    reads_backups = True
    _in_training = None  # the instance whose fit is running in this process

    def __init__(self, backup_dir: str):
        super().__init__()
        self._store = BackupStore(backup_dir, is_chief=False)
        self._reported_step = None
        self._logs = {}
        self.reported_steps: list[int] = []

    def on_train_begin(self, logs=None):
        preemption_notice.check_followed("ReportBackups")
        ReportBackups._in_training = self

    @classmethod
    def report_after_preemption(cls) -> None:
        """Reports the backup made for Ray's notice (`train_function` calls it on every rank
        that was training, before waiting for Ray): a restart is charged, and resumes, there."""
        if cls._in_training is not None:
            cls._in_training._report()

    def on_epoch_end(self, epoch, logs=None):
        self._logs = {
            name: float(value)
            for name, value in (logs or {}).items()
            if isinstance(value, (int, float))
        }

    def on_epoch_begin(self, epoch, logs=None):
        if epoch and self._logs:
            self._report()

    def on_train_end(self, logs=None):
        self._report()
        ReportBackups._in_training = None

    def _report(self):
        checkpoint, step = None, None
        if ray.train.get_context().get_world_rank() == 0:
            steps = self._store.committed_steps()
            step = steps[-1] if steps else None
            if step is not None and step != self._reported_step:
                info = self._store.validate(step)  # marker, metadata and checksums
                checkpoint = ray.train.Checkpoint.from_directory(info.path)
                self._reported_step = step
                self.reported_steps.append(step)
        metrics = dict(self._logs, **({"step": step} if step is not None else {}))
        job_end.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_dir_name=f"tfdist-backup-{step:012d}" if checkpoint else None,
        )
