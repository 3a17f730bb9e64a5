"""The examples under examples/ run as a user would run them."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
CUSTOM_SCRIPT = REPO / "examples" / "custom_script.py"
TIMEOUT = 300  # A backstop against hangs, never a speed assertion.


def run_example(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items()
               if key not in ("TF_CONFIG", "CLUSTER_SPEC")}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                          os.environ.get("PYTHONPATH")]))
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    environ.update(env or {})
    return subprocess.run([sys.executable, str(CUSTOM_SCRIPT), *args], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)


def describe(result: subprocess.CompletedProcess) -> str:
    return (f"exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}"
            f"\n--- stderr\n{result.stderr[-5000:]}")


@pytest.mark.parametrize("strategy, expected_class", [
    ("default", "_DefaultDistributionStrategy"),
    ("multiworker", "CollectiveAllReduceStrategy"),
], ids=["default", "multiworker-without-cluster"])
def test_custom_script_trains_under(strategy, expected_class):
    result = run_example(f"--strategy={strategy}", "--epochs=2", "--steps_per_epoch=15")
    assert result.returncode == 0, describe(result)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["strategy"] == expected_class
    assert report["num_replicas"] == 1
    assert report["steps_completed"] == 30
    assert report["accuracy"] > 0.6, report  # 3 classes: chance is 1/3.


def test_custom_script_bad_strategy_is_one_line_and_exit_2():
    result = run_example("--strategy=mirored")
    assert result.returncode == 2, describe(result)
    assert "Traceback" not in result.stderr, describe(result)
    lines = result.stderr.strip().splitlines()
    error_lines = [line for line in lines if line.startswith("error:")]
    assert error_lines == [lines[-1]], describe(result)
    assert "'mirored'" in error_lines[0] and "multiworker" in error_lines[0]
    assert result.stdout == ""


def test_custom_script_needs_only_a_few_tfdist_lines():
    tfdist_lines = [line for line in CUSTOM_SCRIPT.read_text().splitlines()
                    if line.rstrip().endswith("# tfdist") or "# tfdist:" in line]
    assert 3 <= len(tfdist_lines) <= 8, tfdist_lines


def _tutorial_mnist_setup():
    import importlib.util  # pylint: disable=g-import-not-at-top

    path = REPO / "examples" / "multiworker_tutorial" / "mnist_setup.py"
    spec = importlib.util.spec_from_file_location("tutorial_mnist_setup", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tutorial_data_is_mnist_shaped_and_the_same_on_every_call(monkeypatch):
    import keras  # pylint: disable=g-import-not-at-top
    import numpy as np  # pylint: disable=g-import-not-at-top

    def no_download():
        raise AssertionError("the tutorial example must not download MNIST")

    monkeypatch.setattr(keras.datasets.mnist, "load_data", no_download)
    mnist_setup = _tutorial_mnist_setup()
    images, labels = mnist_setup.synthetic_mnist()
    again_images, again_labels = mnist_setup.synthetic_mnist()
    assert images.shape == (mnist_setup.NUM_EXAMPLES, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (mnist_setup.NUM_EXAMPLES,)
    assert set(np.unique(labels)) == set(range(10))
    np.testing.assert_array_equal(images, again_images)
    np.testing.assert_array_equal(labels, again_labels)

    batch_images, batch_labels = next(iter(mnist_setup.mnist_dataset(16)))
    assert batch_images.shape == (16, 28, 28) and batch_images.dtype.name == "float32"
    assert 0.0 <= float(np.min(batch_images)) and float(np.max(batch_images)) <= 1.0
    assert batch_labels.dtype.name == "int64"
