"""The tasks in examples/tasks: each learns and saves a safely loadable model, and keeps
tfdist's guarantees when the trainer runs it under each strategy.

The fast tests run a task in this process, as `trainer.run` would (the same task
contract and input stream); the slow ones run `python -m trainer.task --task=...`
as real processes, on loopback clusters from `tfdist.launch.testing.local_cluster`,
which keeps every task's log and prints it when a test fails.
"""

import dataclasses

import keras
import numpy as np
import pytest

from tfdist import data as data_lib
from tfdist import tasks as tasks_lib


@dataclasses.dataclass(frozen=True)
class Example:
    spec: str
    config: dict
    steps: int
    learning_rate: float
    # Accuracy on the evaluation split that shows learning: well above both
    # chance and the largest class's share.
    learned_accuracy: float


EXAMPLES = {
    "resnet": Example(
        "examples.tasks.resnet:ResNetTask",
        {"num_examples": 512},
        steps=30,
        learning_rate=0.01,
        learned_accuracy=0.6,
    ),  # 4 balanced classes
    "transformer": Example(
        "examples.tasks.transformer:TransformerTask",
        {"num_examples": 1024},
        steps=40,
        learning_rate=0.005,
        learned_accuracy=0.85,
    ),  # the larger class holds ~61%
    "subclassed": Example(
        "examples.tasks.subclassed:SubclassedTask",
        {"num_examples": 1024},
        steps=40,
        learning_rate=0.005,
        learned_accuracy=0.6,
    ),  # 3 balanced classes
}
BATCH = 32


def _arrays(dataset) -> list[np.ndarray]:
    """A finite dataset of examples as one array per part, in order."""
    return [np.asarray(part) for part in dataset.batch(1 << 20).get_single_element()]


# --------------------------------------------------------------------- in process


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_learns_and_its_model_loads_in_safe_mode(name, tmp_path):
    example = EXAMPLES[name]
    task = tasks_lib.load_task(example.spec, example.config)
    tasks_lib.preflight(task, example.spec)
    keras.utils.set_random_seed(0)
    train = task.build_inputs(True)
    evaluation = task.build_inputs(False)
    assert tasks_lib.check_examples(train, example.spec, training=True)
    assert tasks_lib.check_examples(evaluation, example.spec, training=False)
    model = task.build_model()
    tasks_lib.check_model(model, example.spec)
    model.compile(
        optimizer=keras.optimizers.Adam(example.learning_rate),
        loss=task.loss(),
        metrics=task.metrics(),
    )
    before = model.evaluate(evaluation.batch(256), return_dict=True, verbose=0)
    stream = data_lib.training_batches(
        train, global_batch_size=BATCH, seed=0, num_examples=data_lib.count_examples(train)
    )
    model.fit(stream, steps_per_epoch=example.steps, epochs=1, shuffle=False, verbose=0)
    after = model.evaluate(evaluation.batch(256), return_dict=True, verbose=0)
    print(
        f"{name}: evaluation accuracy {before['accuracy']:.3f} before training, "
        f"{after['accuracy']:.3f} after {example.steps} steps"
    )
    assert after["accuracy"] > example.learned_accuracy, (before, after)

    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    features = _arrays(evaluation.take(64))[0]
    np.testing.assert_array_equal(
        loaded.predict(features, verbose=0), model.predict(features, verbose=0)
    )


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_data_are_the_same_on_every_call(name):
    example = EXAMPLES[name]
    first = tasks_lib.load_task(example.spec, example.config)
    second = tasks_lib.load_task(example.spec, example.config)
    for training in (True, False):
        for one, two in zip(
            _arrays(first.build_inputs(training)),
            _arrays(second.build_inputs(training)),
            strict=True,
        ):
            np.testing.assert_array_equal(one, two)
    train_labels = _arrays(first.build_inputs(True))[1]
    eval_labels = _arrays(first.build_inputs(False))[1]
    assert not np.array_equal(train_labels[: len(eval_labels)], eval_labels), (
        "the evaluation split holds other examples than the training split"
    )


def test_the_resnet_augments_in_training_only():
    from examples.tasks import resnet  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    model = resnet.ResNetTask().build_model()
    images = _arrays(resnet.ResNetTask(num_examples=8).build_inputs(True))[0]
    augment = model.get_layer("augmentation")
    np.testing.assert_array_equal(np.asarray(augment(images, training=False)), images)
    assert not np.array_equal(np.asarray(augment(images, training=True)), images)
    np.testing.assert_array_equal(
        np.asarray(model(images, training=False)), np.asarray(model(images, training=False))
    )


def test_the_transformer_ignores_padding():
    from examples.tasks import transformer  # pylint: disable=g-import-not-at-top

    keras.utils.set_random_seed(0)
    task = transformer.TransformerTask(sequence_length=16, dropout=0.0)
    model = task.build_model()
    tokens = _arrays(task.build_inputs(False).take(8))[0]
    assert (tokens == transformer.PAD).any(), "the sentences are padded"
    # The same sentences padded to a longer sequence: a model of that length
    # with the same weights (position embeddings past 16 unused) agrees.
    longer = transformer.TransformerTask(sequence_length=24, dropout=0.0).build_model()
    for short_weight, long_weight in zip(model.weights, longer.weights, strict=True):
        value = np.asarray(short_weight)
        if value.shape != tuple(long_weight.shape):  # the position table
            value = np.concatenate([value, np.asarray(long_weight)[value.shape[0] :]])
        long_weight.assign(value)
    padded = np.pad(tokens, ((0, 0), (0, 8)), constant_values=transformer.PAD)
    np.testing.assert_allclose(
        np.asarray(longer(padded)), np.asarray(model(tokens)), rtol=1e-5, atol=1e-5
    )
