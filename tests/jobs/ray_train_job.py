"""A tfdist.resumable job under Ray Train's own TensorflowTrainer, for tests/multiprocess/test_ray.py.

    python tests/jobs/ray_train_job.py --out=DIR [--workers=2] [--kill_rank=1 --kill_at_step=10]
        [--nodes=3 --drain_at_step=4]
    python tests/jobs/ray_train_job.py --out=DIR --reference     # the same training, no Ray
    python tests/jobs/ray_train_job.py --out=DIR ... --reference_out=REF  # both, one process

Starts a local Ray cluster on loopback (CPUs only, no dashboard), trains an MLP
with `tfdist.resumable.fit` through `tfdist.ray.TensorflowConfig`, and with
`--kill_at_step` SIGKILLs worker `--kill_rank` once at that step: Ray's
FailureConfig restarts the group, which resumes from the backups. With
`--nodes=N` the cluster has a head without CPUs and N one-CPU nodes (all on
127.0.0.1), and `--drain_at_step` drains the node of rank 0 for preemption
once at that step, through the GCS call Ray's autoscaler makes for a spot
reclaim (`DrainNode`, reason `DRAIN_NODE_REASON_PREEMPTION`, a deadline).
Writes
`weights.npz` (rank 0), `iterations.json`, `starts.txt` (one line per worker
start) and `result.json` (what Ray reports). With `--reference_out`, this
driver (which has TensorFlow loaded already, through `tfdist.ray`) then runs
the reference itself, after Ray has shut down: one uninterrupted process
without Ray, as `--reference` does, without starting another TensorFlow process.
"""

import argparse
import json
import os
import pathlib
import signal
import sys

# Printed once this job's own cluster is up (and the machine's current Ray cluster).
CLUSTER_UP = "ray_train_job: the cluster is up"

STEPS_PER_EPOCH = 8
EPOCHS = 3
GLOBAL_BATCH = 32
DRAIN_DEADLINE_MS = 12_000  # below tfdist's 25 s grace period, as the docs advise


def _drain_this_node(out: pathlib.Path) -> None:
    """Drains this worker's node for preemption, as Ray's autoscaler does on a spot reclaim,
    and returns once Ray Train has marked this worker (bounded)."""
    # pylint: disable=g-import-not-at-top
    import time

    import ray
    from ray.core.generated import autoscaler_pb2
    from ray.train.v2._internal.execution.context import get_train_context

    context = ray.get_runtime_context()
    client = ray._raylet.GcsClient(address=context.gcs_address)  # pylint: disable=protected-access
    accepted, rejection = client.drain_node(
        context.get_node_id(),
        autoscaler_pb2.DrainNodeReason.Value("DRAIN_NODE_REASON_PREEMPTION"),
        "tfdist test: a spot reclaim",
        int(time.time() * 1000) + DRAIN_DEADLINE_MS,
    )
    assert accepted, rejection
    (out / "drained").write_text(context.get_node_id())
    waited_until = time.monotonic() + 60
    while get_train_context().preemption_context.preemption_info is None:
        assert time.monotonic() < waited_until, "Ray Train never marked the drained worker"
        time.sleep(0.05)


def build_and_train(
    out: pathlib.Path,
    *,
    rank: int,
    kill_rank: int,
    kill_at_step: int,
    report: bool,
    term_at_step: int = 0,
    drain_at_step: int = 0,
) -> None:
    import keras  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    import tfdist.resumable  # pylint: disable=g-import-not-at-top

    strategy = tfdist.resumable.strategy_from_environment()
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    hosts = sorted(
        {address.rsplit(":", 1)[0] for addresses in cluster.values() for address in addresses}
    )
    with open(out / "starts.txt", "a", encoding="utf-8") as handle:
        handle.write(
            json.dumps(
                {
                    "rank": rank,
                    "keras": keras.__version__,
                    "legacy": os.environ.get("TF_USE_LEGACY_KERAS"),
                    "replicas": strategy.num_replicas_in_sync,
                    "hosts": hosts,
                    "sigterm": getattr(signal.getsignal(signal.SIGTERM), "__qualname__", ""),
                }
            )
            + "\n"
        )
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(3)
    features = rng.normal(size=(512, 8)).astype("float32")
    labels = (features @ rng.normal(size=(8, 1)) > 0).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(GLOBAL_BATCH)
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dense(1, activation="sigmoid"),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")

    marker = out / "killed"
    term_marker = out / "terminated"
    drain_marker = out / "drained"

    class KillOnce(keras.callbacks.Callback):
        step = 0

        def on_train_batch_end(self, batch, logs=None):
            self.step = int(model.optimizer.iterations.numpy())
            if rank == kill_rank and self.step == kill_at_step and not marker.exists():
                marker.write_text(str(self.step))
                os.kill(os.getpid(), signal.SIGKILL)
            if rank == kill_rank and self.step == term_at_step and not term_marker.exists():
                term_marker.write_text(str(self.step))
                os.kill(os.getpid(), signal.SIGTERM)  # a preemption notice to this worker only
            if rank == 0 and self.step == drain_at_step and not drain_marker.exists():
                _drain_this_node(out)

    callbacks = [KillOnce()] if kill_at_step or term_at_step or drain_at_step else []
    if report:
        import tfdist.ray  # pylint: disable=g-import-not-at-top

        callbacks += [
            tfdist.ray.PreemptionNotice(every_steps=2),
            tfdist.ray.ReportBackups(str(out / "backup")),
        ]
    tfdist.resumable.fit(
        model,
        dataset,
        backup_dir=str(out / "backup"),
        epochs=EPOCHS,
        steps_per_epoch=STEPS_PER_EPOCH,
        save_freq=4,
        callbacks=callbacks,
        verbose=0,
    )
    if rank == 0:
        np.savez(out / "weights.npz", *[w.numpy() for w in model.weights])
        (out / "iterations.json").write_text(json.dumps(int(model.optimizer.iterations.numpy())))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--kill_rank", type=int, default=1)
    parser.add_argument("--kill_at_step", type=int, default=0)
    parser.add_argument("--term_at_step", type=int, default=0)
    parser.add_argument("--max_failures", type=int, default=1)
    parser.add_argument("--nodes", type=int, default=0)
    parser.add_argument("--drain_at_step", type=int, default=0)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--reference_out", default="")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.reference:
        build_and_train(out, rank=0, kill_rank=-1, kill_at_step=0, report=False)
        return 0

    import ray  # pylint: disable=g-import-not-at-top
    import ray.train  # pylint: disable=g-import-not-at-top
    from ray.train.tensorflow import TensorflowTrainer  # pylint: disable=g-import-not-at-top

    import tfdist.ray  # pylint: disable=g-import-not-at-top

    @tfdist.ray.train_function
    def train_fn(config):
        build_and_train(
            pathlib.Path(config["out"]),
            rank=ray.train.get_context().get_world_rank(),
            kill_rank=config["kill_rank"],
            kill_at_step=config["kill_at_step"],
            term_at_step=config["term_at_step"],
            drain_at_step=config["drain_at_step"],
            report=True,
        )

    runtime_env = {
        "env_vars": {
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "CUDA_VISIBLE_DEVICES": "",
        }
    }
    cluster = None
    if args.nodes:
        from ray.cluster_utils import Cluster  # pylint: disable=g-import-not-at-top

        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 0,
                "node_ip_address": "127.0.0.1",
                "include_dashboard": False,
            },
        )
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        ray.init(address=cluster.address, log_to_driver=True, runtime_env=runtime_env)
        print(CLUSTER_UP, flush=True)
    else:
        ray.init(
            num_cpus=args.workers,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            log_to_driver=True,
            runtime_env=runtime_env,
        )
    try:
        trainer = TensorflowTrainer(
            train_fn,
            train_loop_config={
                "out": str(out),
                "kill_rank": args.kill_rank,
                "kill_at_step": args.kill_at_step,
                "term_at_step": args.term_at_step,
                "drain_at_step": args.drain_at_step,
            },
            tensorflow_config=tfdist.ray.TensorflowConfig(),
            scaling_config=ray.train.ScalingConfig(
                num_workers=args.workers, use_gpu=False, resources_per_worker={"CPU": 1}
            ),
            run_config=ray.train.RunConfig(
                name="tfdist-ray-test",
                storage_path=str(out / "ray_results"),
                failure_config=ray.train.FailureConfig(max_failures=args.max_failures),
            ),
        )
        result = trainer.fit()
        (out / "result.json").write_text(
            json.dumps(
                {
                    "error": repr(result.error) if result.error else None,
                    "checkpoint": result.checkpoint.path if result.checkpoint else None,
                    "metrics": result.metrics,
                }
            )
        )
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    if args.reference_out:
        reference_out = pathlib.Path(args.reference_out)
        reference_out.mkdir(parents=True, exist_ok=True)
        build_and_train(reference_out, rank=0, kill_rank=-1, kill_at_step=0, report=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
