"""ShardedEmbedding: an embedding table partitioned over parameter servers."""

import keras
import numpy as np
import pytest

from tfdist.errors import UsageError
from tfdist.parameter_server import ShardedEmbedding
from tfdist.parameter_server.sharded_embedding import shard_rows


def test_rows_are_split_like_tensorflows_div_strategy():
    assert shard_rows(10, 3) == [4, 3, 3]
    assert shard_rows(8, 4) == [2, 2, 2, 2]


def test_lookup_equals_an_embedding_over_the_stacked_blocks():
    layer = ShardedEmbedding(10, 4, num_shards=3)
    ids = np.array([[0, 3, 4, 9], [7, 1, 2, 8]])
    looked_up = keras.ops.convert_to_numpy(layer(ids))
    table = np.concatenate([keras.ops.convert_to_numpy(block) for block in layer.blocks])
    assert [block.shape for block in layer.blocks] == [(4, 4), (3, 4), (3, 4)]
    np.testing.assert_array_equal(looked_up, table[ids])


def test_a_step_moves_only_the_rows_it_used():
    keras.utils.set_random_seed(0)
    layer = ShardedEmbedding(10, 4, num_shards=3)
    model = keras.Sequential(
        [keras.Input((2,), dtype="int32"), layer, keras.layers.Flatten(), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    before = np.concatenate([keras.ops.convert_to_numpy(block) for block in layer.blocks])
    model.fit(np.array([[0, 9]]), np.ones((1, 1)), epochs=1, verbose=0)
    after = np.concatenate([keras.ops.convert_to_numpy(block) for block in layer.blocks])
    assert np.flatnonzero(np.abs(after - before).max(axis=1)).tolist() == [0, 9]


def test_saved_model_loads_back_by_name(tmp_path):
    model = keras.Sequential(
        [keras.Input((2,), dtype="int32"), ShardedEmbedding(10, 4, num_shards=2)]
    )
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    ids = np.array([[1, 8]])
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(loaded(ids)), keras.ops.convert_to_numpy(model(ids))
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"input_dim": 10, "output_dim": 4, "num_shards": 0}, "num_shards is 0"),
        ({"input_dim": 3, "output_dim": 4, "num_shards": 4}, "at most one block per row"),
        ({"input_dim": 10, "output_dim": 4.5, "num_shards": 2}, "output_dim is 4.5"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        ShardedEmbedding(**kwargs)
