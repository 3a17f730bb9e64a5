"""TensorFlow's "Multi-worker training with Keras" tutorial, run by a Keras 3 user.

The tutorial's `main.py`, step for step: read the number of workers from
`TF_CONFIG`, create a `MultiWorkerMirroredStrategy`, scale the batch by the
number of workers, build and compile the model in the strategy's scope, `fit`,
then save as the tutorial does (the chief to `--model_path`, every other worker
to a temporary directory that it deletes). One line is tfdist's, marked
`# tfdist`: upstream Keras 3 `fit` fails under this strategy
(keras-team/keras#20585) and tfdist's compatibility layer corrects it.

Run two workers on this machine:

    python -m tfdist.launch --workers 2 -- python examples/multiworker_tutorial/main.py

`--upstream_keras` leaves the compatibility layer out, to see the upstream
failure ("ValueError: Attempt to convert a value (PerReplica..."). When that
stops failing, the layer can come off.

Each worker prints one JSON line at the end: its task, the steps it applied,
the last epoch's loss and accuracy, and a SHA-256 of its final weights (the
same on every worker: they train one model together).
"""

import argparse
import hashlib
import json
import os

import mnist_setup
import tensorflow as tf

from tfdist import keras_compat  # tfdist


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps_per_epoch", type=int, default=70)
    parser.add_argument(
        "--model_path",
        default="/tmp/keras-model.keras",
        help="Where the chief saves the trained model (a .keras file).",
    )
    parser.add_argument(
        "--upstream_keras",
        action="store_true",
        help="Leave out tfdist's compatibility layer (shows the upstream bug).",
    )
    return parser.parse_args()


def _is_chief(task_type, task_id):
    # Without a `chief` task, worker 0 is the chief.
    return task_type == "chief" or (task_type == "worker" and task_id == 0)


def _get_temp_dir(dirpath, task_id):
    temp_dir = os.path.join(dirpath, f"workertemp_{task_id}")
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


def _weights_digest(model):
    digest = hashlib.sha256()
    for weights in model.get_weights():
        digest.update(weights.tobytes())
    return digest.hexdigest()


def main():
    args = _parse_args()
    if not args.upstream_keras:
        keras_compat.apply()  # tfdist

    per_worker_batch_size = 64
    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    global_batch_size = per_worker_batch_size * num_workers
    multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

    with strategy.scope():
        # Model building/compiling need to be within `strategy.scope()`.
        multi_worker_model = mnist_setup.build_and_compile_cnn_model()

    history = multi_worker_model.fit(
        multi_worker_dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, verbose=2
    )

    task_type, task_id = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id)
    write_model_path = write_filepath(args.model_path, task_type, task_id)
    multi_worker_model.save(write_model_path)
    if not _is_chief(task_type, task_id):
        tf.io.gfile.rmtree(os.path.dirname(write_model_path))

    print(
        json.dumps(
            {
                "task": f"{task_type}:{task_id}",
                "num_workers": num_workers,
                "steps": int(multi_worker_model.optimizer.iterations.numpy()),
                "loss": history.history["loss"],
                "accuracy": history.history["accuracy"],
                "weights_sha256": _weights_digest(multi_worker_model),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
