"""A task for tests/multiprocess/test_preload.py: was TensorFlow imported before it ran?

    python tests/jobs/preloaded_task.py OUT_DIR

Writes `<role>-<index>.json` in OUT_DIR: whether `tensorflow` was already
imported when this script started, its pid and parent pid, its working
directory and arguments, and the sum that one collective all-reduce over the
workers (MultiWorkerMirroredStrategy, one CPU each) gave, which needs
TensorFlow's runtime to start in this process after TF_CONFIG is set.
"""

import json
import os
import sys

already_imported = "tensorflow" in sys.modules

import tensorflow as tf  # noqa: E402


def main(out_dir: str) -> int:
    config = json.loads(os.environ["TF_CONFIG"])
    role, index = config["task"]["type"], config["task"]["index"]
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(float(index + 1))), axis=None)
    record = {
        "preloaded": already_imported,
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "cwd": os.getcwd(),
        "argv": sys.argv,
        "sum": float(total),
        "replicas": strategy.num_replicas_in_sync,
    }
    with open(os.path.join(out_dir, f"{role}-{index}.json"), "w") as file:
        json.dump(record, file)
    return 3 if index == 1 else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
