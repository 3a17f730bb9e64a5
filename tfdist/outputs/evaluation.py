"""Sidecar evaluation: the chief exports checkpoints, an evaluator task evaluates them.

`tfdist.callbacks.CheckpointExporter` (a Keras callback, on the chief; also
importable from here) saves the model's
variables at every epoch end to `<directory>/ckpt-<step>`; its `finish()`,
called once training is over, writes `<directory>/training_done.json` naming
the last checkpoint.

`SidecarEvaluator` (on the evaluator task: Vertex worker pool 3, or
`tfdist.launch --evaluator`) builds the same model without a strategy, waits
for checkpoints, evaluates each new one in step order, appends one JSON line
per checkpoint to `<output_dir>/metrics.jsonl`, writes the same numbers as
TensorBoard scalars to `<output_dir>`, and returns once the completion marker
is there and the last checkpoint is evaluated.

Variables are saved by position (`model.variables`): Keras layer names depend
on what a process created before, but the order of a model's variables does
not. (Backups restore by stable path instead, `tfdist.backups.paths`.)
A checkpoint becomes visible only when TensorFlow has updated the directory's
`checkpoint` state file, after its data is written, so the evaluator never
reads a half-written one. A checkpoint that was rotated away before the
evaluator got to it is skipped.
"""

import json
import logging
import os
import re
import time
from typing import Callable

import keras
import tensorflow as tf

from tfdist.errors import UsageError

__all__ = [
    "DONE_MARKER",
    "METRICS_FILE",
    "CHECKPOINT_NAME",
    "checkpoint_step",
    "read_done_marker",
    "list_checkpoints",
    "SidecarEvaluator",
]

DONE_MARKER = "training_done.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_NAME = "ckpt"
_STEP = re.compile(r"ckpt-(\d+)$")

_log = logging.getLogger(__name__)


def _position_checkpoint(model: keras.Model) -> tf.train.Checkpoint:
    return tf.train.Checkpoint(model_variables=list(model.variables))


def checkpoint_step(path: str) -> int:
    """The training step a `.../ckpt-<step>` checkpoint was taken at."""
    match = _STEP.search(path)
    if not match:
        raise ValueError(f"{path!r} is not a tfdist checkpoint path (expected .../ckpt-<step>)")
    return int(match.group(1))


def read_done_marker(directory: str) -> dict | None:
    """The completion record the chief wrote, or None while training runs."""
    path = os.path.join(directory, DONE_MARKER)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as handle:
        return json.loads(handle.read())


def list_checkpoints(directory: str) -> list[str]:
    """Committed checkpoint prefixes in `directory`, oldest first."""
    state = tf.train.get_checkpoint_state(directory)
    if state is None:
        return []
    paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    paths = [
        path if os.path.isabs(path) or "://" in path else os.path.join(directory, path)
        for path in paths
        if path
    ]
    return sorted(paths, key=checkpoint_step)


class SidecarEvaluator:
    """Evaluates each checkpoint a `CheckpointExporter` writes, until training is done.

    Args:
        model: The same architecture as the trained model, compiled with the
            metrics to report, built, and not under any strategy.
        data: A finite `tf.data.Dataset` of evaluation batches.
        checkpoint_dir: The exporter's directory.
        output_dir: Where `metrics.jsonl` and TensorBoard events go.
        steps: Batches per evaluation (None: the whole dataset).
        poll_seconds: Seconds between two looks at `checkpoint_dir`.
        is_training_alive: Called while waiting; returning False means the
            trainer is gone without writing the completion marker.
        give_up_seconds: How long to keep waiting after `is_training_alive`
            first returns False.
    """

    def __init__(
        self,
        model: keras.Model,
        data,
        *,
        checkpoint_dir: str,
        output_dir: str,
        steps: int | None = None,
        poll_seconds: float = 2.0,
        is_training_alive: Callable[[], bool] | None = None,
        give_up_seconds: float = 30.0,
    ):
        if not checkpoint_dir or not output_dir:
            raise UsageError(
                f"checkpoint_dir={checkpoint_dir!r} and output_dir={output_dir!r}, expected both "
                f"set: the directory the chief exports to and where to write metrics"
            )
        if getattr(model, "optimizer", None) is None and not model.metrics:
            raise UsageError(
                f"model {model.name!r} is not compiled, expected "
                f"model.compile(loss=..., metrics=[...]) before evaluating"
            )
        self.model = model
        self.data = data
        self.checkpoint_dir = checkpoint_dir
        self.output_dir = output_dir
        self.steps = steps
        self.poll_seconds = poll_seconds
        self._is_training_alive = is_training_alive or (lambda: True)
        self.give_up_seconds = give_up_seconds
        self.evaluated: dict[int, dict] = {}
        self._checkpoint = _position_checkpoint(model)
        self._writer = None

    def _record(self, path: str, step: int, metrics: dict) -> None:
        tf.io.gfile.makedirs(self.output_dir)
        line = json.dumps(
            {
                "checkpoint": os.path.basename(path),
                "step": step,
                "metrics": metrics,
                "time": time.time(),
            },
            sort_keys=True,
        )
        metrics_path = os.path.join(self.output_dir, METRICS_FILE)
        with tf.io.gfile.GFile(metrics_path, "a") as handle:
            handle.write(line + "\n")
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.output_dir)
        with self._writer.as_default():
            for name, value in metrics.items():
                tf.summary.scalar(f"evaluation_{name}_vs_iterations", value, step=step)
        self._writer.flush()

    def evaluate_checkpoint(self, path: str) -> dict | None:
        """Restores and evaluates one checkpoint; None if it was rotated away."""
        step = checkpoint_step(path)
        try:
            self._checkpoint.read(path).assert_existing_objects_matched().expect_partial()
        except (tf.errors.NotFoundError, tf.errors.DataLossError) as error:
            _log.warning(
                "Skipping %s, deleted or unreadable before it could be evaluated (%s).",
                path,
                type(error).__name__,
            )
            return None
        results = self.model.evaluate(self.data, steps=self.steps, verbose=0, return_dict=True)
        metrics = {name: float(value) for name, value in results.items()}
        self._record(path, step, metrics)
        self.evaluated[step] = metrics
        _log.info("Evaluated %s (step %d): %s", path, step, metrics)
        return metrics

    def _evaluate_new(self) -> None:
        for path in list_checkpoints(self.checkpoint_dir):
            if checkpoint_step(path) not in self.evaluated:
                self.evaluate_checkpoint(path)

    def run(self) -> dict[int, dict]:
        """Evaluates checkpoints as they appear until training is done.

        Returns:
            Step to metrics, for every checkpoint evaluated.

        Raises:
            RuntimeError: The trainer went away without marking completion.
        """
        lost_since = None
        while True:
            done = read_done_marker(self.checkpoint_dir)
            self._evaluate_new()
            if done is not None:
                final_step = int(done["step"])
                if final_step not in self.evaluated:
                    self.evaluate_checkpoint(
                        os.path.join(self.checkpoint_dir, done["last_checkpoint"])
                    )
                _log.info(
                    "Training is done at step %d; evaluated %d checkpoint(s).",
                    final_step,
                    len(self.evaluated),
                )
                return dict(self.evaluated)
            if self._is_training_alive():
                lost_since = None
            else:
                lost_since = lost_since or time.monotonic()
                if time.monotonic() - lost_since > self.give_up_seconds:
                    raise RuntimeError(
                        f"training stopped without writing {DONE_MARKER} in "
                        f"{self.checkpoint_dir} (evaluated {len(self.evaluated)} "
                        f"checkpoint(s)); the job failed or was stopped: restart it to resume"
                    )
            time.sleep(self.poll_seconds)
