"""The examples under examples/ run as a user would run them."""

import difflib
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
CUSTOM_SCRIPT = REPO / "examples" / "custom_script.py"


def test_custom_script_needs_only_a_few_tfdist_lines():
    tfdist_lines = [
        line
        for line in CUSTOM_SCRIPT.read_text().splitlines()
        if line.rstrip().endswith("# tfdist") or "# tfdist:" in line
    ]
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


def test_the_gan_script_upgrades_in_its_imports_its_fit_and_its_saves():
    """examples/gan_script: before.py and after.py share keras.io's model (gan.py); code
    lines differ only where tfdist comes in."""
    scripts = pathlib.Path(__file__).resolve().parents[2] / "examples" / "gan_script"

    def code(name: str) -> list[str]:
        text = (scripts / name).read_text()
        return text[text.index('"""', 3) + 3 :].splitlines()  # after the docstring

    before, after = code("before.py"), code("after.py")
    opcodes = difflib.SequenceMatcher(a=before, b=after).get_opcodes()
    replaced = [line for tag, i1, i2, _, _ in opcodes if tag != "equal" for line in before[i1:i2]]
    assert replaced == [
        "gan.fit(images, batch_size=32, epochs=2, verbose=2)",
        'discriminator.save(f"{OUT}/discriminator.keras")',
        'generator.save(f"{OUT}/generator.keras")',
    ]
    added = [line for tag, _, _, j1, j2 in opcodes if tag != "equal" for line in after[j1:j2]]
    assert [line for line in added if line.strip()] == [
        "import tfdist.resumable",
        "tfdist.resumable.set_strategy_from_environment()  # no `with strategy.scope():` needed",
        "tfdist.resumable.fit(",
        '    gan, images, batch_size=32, epochs=2, verbose=2, backup_dir=f"{OUT}/backup", save_freq=4',
        ")",
        'discriminator.save(tfdist.resumable.write_path(f"{OUT}/discriminator.keras"))',
        'generator.save(tfdist.resumable.write_path(f"{OUT}/generator.keras"))',
    ]
