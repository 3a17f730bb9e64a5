"""A task returning its own shuffled `tf.data.Dataset` of JPEG records, killed at a step (not a test module).

`ShuffledRecords` is `record_tasks.RecordImages(kind="dataset")` with the
task's own `shuffle` (unseeded, reshuffled each pass: the trainer's
`--seed` sets TensorFlow's global seed, which fixes it), counting its decodes
per process in `count_dir` as `RecordImages` does. With `kill_at_call`, the
loss SIGKILLs the process at its `kill_at_call`-th call (the one-batch check
calls it once before training, then every training step once), once: a
`kill_marker` file (one per task of a cluster) records it, so the restarted
run trains to the end.
"""

import json
import os
import signal
import sys

import keras
import numpy as np
import tensorflow as tf

from tests.jobs.tasks import record_tasks

_calls = {"count": 0, "at": 0, "marker": ""}


def _marker() -> str:
    task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
    return f"{_calls['marker']}-{task.get('type', 'single')}-{task.get('index', 0)}"


def _tick(_):
    _calls["count"] += 1
    if _calls["at"] and _calls["count"] >= _calls["at"] and not os.path.exists(_marker()):
        with open(_marker(), "w") as handle:
            handle.write(str(_calls["count"]))
        os.kill(os.getpid(), signal.SIGKILL)
    return np.float32(0)


class ShuffledRecords(record_tasks.RecordImages):
    """`TFRecordDataset(files).map(decode).shuffle(buffer)`, decodes counted."""

    def __init__(
        self,
        pattern: str,
        count_dir: str = "",
        buffer: int = 64,
        kill_at_call: int = 0,
        kill_marker: str = "",
    ):
        super().__init__(pattern, kind="dataset", count_dir=count_dir)
        self.buffer = buffer
        _calls.update(at=kill_at_call, marker=kill_marker)

    def build_inputs(self, training):
        examples = super().build_inputs(training)
        return None if examples is None else examples.shuffle(self.buffer)

    def loss(self):
        crossentropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        def loss(labels, logits):
            tick = tf.numpy_function(_tick, [tf.constant(0)], tf.float32, stateful=True)
            return crossentropy(labels, logits) + 0.0 * tf.reshape(tick, [])

        return loss


def trainer_command(
    pattern: str,
    root,
    *,
    strategy: str,
    global_batch_size: int,
    epochs: int,
    backup_every_steps: int,
    flags=(),
    **task_config,
) -> list[str]:
    """`python -m trainer.task` on `ShuffledRecords(pattern, **task_config)`, its outputs under `root`."""
    return [
        sys.executable,
        "-m",
        "trainer.task",
        "--task=tests.jobs.tasks.resumed_records:ShuffledRecords",
        f"--task_config={json.dumps({'pattern': pattern, **task_config})}",
        f"--strategy={strategy}",
        f"--global_batch_size={global_batch_size}",
        "--steps_per_execution=1",
        f"--epochs={epochs}",
        f"--backup_every_steps={backup_every_steps}",
        f"--backup_dir={root / 'backup'}",
        f"--model_dir={root / 'model'}",
        *flags,
    ]
