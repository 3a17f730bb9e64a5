"""build_optimizer: the optimizer, its scaled and scheduled rate, and the one log line."""

import os
import subprocess
import sys

import keras
import numpy as np

from tests.unit.test_optimization import build  # shared with the in-process half

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_model_saved_with_scheduled_lars_loads_after_the_first_use_of_tfdist_optimizers(tmp_path):
    """A fresh process loads the model by name once it has used `tfdist.optimizers.LAMB`:
    the first use of either optimizer registers LARS, LAMB and WarmupDecay. Importing the
    package alone loads no Keras (tests/multiprocess/test_architecture.py) and registers
    nothing."""
    optimizer, _ = build(
        optimizer="lars", learning_rate=1.0, warmup_steps=2, lr_decay="cosine", weight_decay=1e-4
    )
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=optimizer, loss="mse")
    x = np.ones((8, 3), "float32")
    model.fit(x, x[:, :2], batch_size=4, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    script = (
        "import sys, keras, tfdist.optimizers\n"
        "assert keras.saving.get_registered_object('tfdist>LARS') is None\n"
        "tfdist.optimizers.LAMB\n"
        "model = keras.saving.load_model(sys.argv[1], safe_mode=True)\n"
        "print(type(model.optimizer).__name__, int(model.optimizer.iterations.numpy()), "
        "model.optimizer.get_config()['learning_rate']['registered_name'])\n"
    )
    completed = subprocess.run(
        [sys.executable, "-c", script, path],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"),
        timeout=180,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.split() == ["LARS", "2", "tfdist>WarmupDecay"]
