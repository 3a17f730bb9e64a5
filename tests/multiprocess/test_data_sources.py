"""tfdist.data sources: each shard reads only its part, resumes are arithmetic, records skip undecoded."""

import json
import subprocess
import sys
import textwrap

from tests.support.logged_process import clean_environment


def test_tensorflows_runtime_still_starts_when_a_dataset_function_is_traced_in_a_graph():
    """Upstream behaviour that `keras_compat.runtime_left_unstarted` corrects."""
    # One fresh process: the corrected block first (nothing has started the runtime
    # yet, so it must leave it unstarted), then the upstream block, which starts it.
    script = textwrap.dedent("""
        import json
        import tensorflow as tf
        from tfdist import keras_compat
        with keras_compat.runtime_left_unstarted(), tf.Graph().as_default():
            tf.data.TFRecordDataset(["x"]).map(lambda r: r)
        corrected = keras_compat.runtime_initialized()
        with tf.Graph().as_default():
            tf.data.TFRecordDataset(["x"]).map(lambda r: r)
        print(json.dumps({"corrected": corrected, "upstream": keras_compat.runtime_initialized()}))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    started = json.loads(result.stdout.splitlines()[-1])
    assert started["upstream"] is True, "upstream still starts it"
    assert started["corrected"] is False
