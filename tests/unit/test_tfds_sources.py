"""tfds by name: an ArrayRecord-prepared set is read by random access, a TFRecord one streamed.

The datasets are generated and prepared here, offline, in a temporary data_dir.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tfdist.data import RandomAccessSource, TaskInput
from trainer.tasks.builtin import BuiltinTask

SIZE, COUNT = 8, 48


class TinyImages(tfds.core.GeneratorBasedBuilder):
    """Images whose first pixel holds their index; labels index % 3."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(SIZE, SIZE, 1)),
                    "label": tfds.features.ClassLabel(num_classes=3),
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        del dl_manager
        return {
            "train": self._generate_examples(COUNT),
            "test": self._generate_examples(COUNT // 4),
        }

    def _generate_examples(self, count):
        for index in range(count):
            image = np.zeros((SIZE, SIZE, 1), np.uint8)
            image[0, 0, 0] = index
            yield index, {"image": image, "label": index % 3}


@pytest.fixture(scope="module", params=["array_record", "tfrecord"])
def prepared(request, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp(request.param)
    TinyImages(data_dir=str(data_dir), file_format=request.param).download_and_prepare()
    return request.param, str(data_dir)


def _first_pixels(dataset) -> list[int]:
    return sorted(int(round(float(image[0, 0, 0]) * 255)) for image, _ in dataset)


def test_a_tfds_set_by_name_is_random_access_when_prepared_as_array_record(prepared):
    file_format, data_dir = prepared
    task = BuiltinTask(model="mlp", dataset="tiny_images", data_dir=data_dir)
    train = TaskInput(task.build_inputs(True))
    if file_format == "array_record":
        assert isinstance(train.value, RandomAccessSource)
        assert train.known_size() == COUNT, "the length is read, not counted"
    else:
        assert isinstance(train.value, tf.data.Dataset)
    assert _first_pixels(train.examples()) == list(range(COUNT))
    images, labels = next(
        iter(train.training_stream(None, global_batch_size=16, seed=0, num_examples=COUNT))
    )
    assert images.shape == (16, SIZE, SIZE, 1) and labels.dtype == tf.int32
    assert [int(round(float(i[0, 0, 0]) * 255)) % 3 for i in images] == labels.numpy().tolist()
