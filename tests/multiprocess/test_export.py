"""tfdist.outputs.export: a SavedModel that plain TensorFlow (Vertex AI Prediction's
TF Serving) loads and that predicts what the Keras model predicts."""

import json
import os
import subprocess
import sys

import numpy as np

from tests.unit.test_export import _model  # shared with the in-process half
from tfdist.outputs import export

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Loads the SavedModel with TensorFlow alone (Keras made unimportable, as in TF
# Serving) and prints the serving signature's answer.
_LOAD_WITHOUT_KERAS = """
import json, sys
sys.modules["keras"] = sys.modules["tf_keras"] = None  # any `import keras` fails
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
serve = loaded.signatures["serving_default"]
(name,) = serve.structured_input_signature[1]
features = np.load(sys.argv[2])
(output,) = serve(**{name: tf.constant(features)}).values()
print(json.dumps({"predictions": output.numpy().tolist()}))
"""


def test_saved_model_loads_without_keras_and_predicts_like_the_keras_model(tmp_path):
    model = _model()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "summary.json").write_text("{}")  # what else lives in AIP_MODEL_DIR stays
    path = export.export_saved_model(model, str(model_dir))
    assert path == str(model_dir / "saved_model.pb")
    assert {"saved_model.pb", "variables", "summary.json"} <= set(os.listdir(model_dir))
    assert not [name for name in os.listdir(model_dir) if name.startswith(".savedmodel-tmp")]

    features = np.random.default_rng(1).normal(size=(5, 6)).astype("float32")
    np.save(tmp_path / "features.npy", features)
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_WITHOUT_KERAS, str(model_dir), str(tmp_path / "features.npy")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    np.testing.assert_allclose(
        served["predictions"], model.predict(features, verbose=0), rtol=1e-5, atol=1e-6
    )
