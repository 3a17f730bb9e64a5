"""Runs examples/resumable_script/after.py, sending itself SIGTERM once, mid-training.

    python tests/jobs/preempted_script.py OUTPUT_DIR MARKER_FILE

The first run (no MARKER_FILE yet) signals itself when the input pipeline
produces batch 24 and creates the marker; later runs train undisturbed. The
script itself is unchanged: only its dataset is wrapped.
"""

import os
import pathlib
import signal
import sys

import tensorflow as tf

sys.path.insert(
    0, str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "resumable_script")
)
import after  # noqa: E402  pylint: disable=wrong-import-position

PREEMPT_AT_BATCH = 24


def main() -> None:
    out, marker = sys.argv[1], pathlib.Path(sys.argv[2])
    make_dataset = after.make_dataset

    def preempting_dataset(global_batch_size: int) -> tf.data.Dataset:
        def notice(index):
            if int(index) == PREEMPT_AT_BATCH and not marker.exists():
                marker.touch()
                os.kill(os.getpid(), signal.SIGTERM)
            return index

        def pass_through(index, batch):
            tf.py_function(notice, [index], tf.int64)
            return batch

        return make_dataset(global_batch_size).enumerate().map(pass_through)

    after.make_dataset = preempting_dataset
    after.main(out)


if __name__ == "__main__":
    main()
