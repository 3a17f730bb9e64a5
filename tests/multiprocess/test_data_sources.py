"""tfdist.data sources: each shard reads only its part, resumes are arithmetic, records skip undecoded."""

import json
import subprocess
import sys
import textwrap

from tests.support.logged_process import clean_environment


def test_tensorflows_runtime_still_starts_when_a_dataset_function_is_traced_in_a_graph():
    """Upstream behaviour that `keras_compat.runtime_left_unstarted` corrects."""
    script = textwrap.dedent("""
        import json
        import tensorflow as tf
        from tfdist import keras_compat
        with tf.Graph().as_default():
            tf.data.TFRecordDataset(["x"]).map(lambda r: r)
        upstream = keras_compat.runtime_initialized()
        with keras_compat.runtime_left_unstarted(), tf.Graph().as_default():
            tf.data.TFRecordDataset(["x"]).map(lambda r: r)
        print(json.dumps([upstream, keras_compat.runtime_initialized()]))
    """)
    # The first block already started it in this fresh process; the second runs
    # in another fresh process.
    first = subprocess.run(
        [sys.executable, "-c", script],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(first.stdout.splitlines()[-1])[0] is True, "upstream still starts it"
    fixed = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
        import json
        import tensorflow as tf
        from tfdist import keras_compat
        with keras_compat.runtime_left_unstarted(), tf.Graph().as_default():
            tf.data.TFRecordDataset(["x"]).map(lambda r: r)
        print(json.dumps(keras_compat.runtime_initialized()))
    """),
        ],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(fixed.stdout.splitlines()[-1]) is False
